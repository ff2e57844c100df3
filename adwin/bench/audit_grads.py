"""Per-sample segment gradients of an audit-truth pool: the batched engine against one backward per row, side by side.

``python -m adwin.bench.audit_grads [--rows 16] [--response 1200] [--repeats 2] [--threads 1]``

Times ``adwin.audit.grams.chunked_grams`` as ``adwin bench audit-truth`` runs it (method ``fast``, per-sample
segment gradients with a 16,384-wide CountSketch per sample, the long candidates 64..1024) on a model of the built-in
long student's shape (Llama, hidden 64, 4 layers, 4 heads, MLP 256, tied embeddings, vocabulary 55) with random
weights, built in code: ``engine="row"`` (one backward per row and segment) and ``engine="batched"``
(``adwin.audit.persample``), alternating so a loaded machine slows both alike. Prints one JSON line: seconds per
sample of each (median over repeats) and their ratio, and how far the batched per-sample Grams are from the row
engine's (relative to each Gram's largest entry).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
import torch

from adwin.audit.alignment import DEFAULT_SKETCH_DIM, ProbeBatch
from adwin.audit.grams import canonical_name, chunked_grams, metric_scaler, prepare
from adwin.tasks.long import LONG_CANDIDATES


def long_shaped(vocab: int = 55) -> torch.nn.Module:
    """The built-in long student's shape (adwin.tasks.profiles, ``LONG_PROFILE_SPECS``) with random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2176,
                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2, rope_theta=10000.0)
    return LlamaForCausalLM(cfg).eval()


def probe_batch(rows: int, response: int, vocab: int, seed: int = 0) -> ProbeBatch:
    """``rows`` right-padded rollouts: 26 prompt tokens, responses within +-15 % of ``response`` tokens."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(int(response * 0.85), int(response * 1.15) + 1, (rows,), generator=g).tolist()
    prompt, width = 26, 26 + max(lens)
    ids = torch.randint(3, vocab, (rows, width), generator=g)
    am, rm = torch.zeros(rows, width, dtype=torch.long), torch.zeros(rows, width, dtype=torch.long)
    for i, n in enumerate(lens):
        am[i, : prompt + n], rm[i, prompt : prompt + n] = 1, 1
        ids[i, prompt + n :] = 0
    return ProbeBatch(ids, am, rm, -torch.rand(rows, width, generator=g) * 4 * rm)


def measure(rows: int, response: int, repeats: int, vocab: int = 55) -> dict[str, Any]:
    model = long_shaped(vocab)
    cands = list(LONG_CANDIDATES)
    named = [(canonical_name(n), p) for n, p in model.named_parameters()]
    b = prepare(probe_batch(rows, response, vocab), None, cands, named[0][1].device)
    scale = metric_scaler([p for _, p in named], "identity", None)

    def run(engine: str) -> tuple[float, list[np.ndarray]]:
        t = time.perf_counter()
        with torch.enable_grad():
            out = chunked_grams(model, named, b, len(cands) + 1, scale, True, None, None, 0, DEFAULT_SKETCH_DIM,
                                engine=engine)
        return (time.perf_counter() - t) / rows, out[1]

    times: dict[str, list[float]] = {"row": [], "batched": []}
    grams: dict[str, list[np.ndarray]] = {}
    for _ in range(repeats):
        for engine in times:
            s, grams[engine] = run(engine)
            times[engine].append(s)
    row, batched = statistics.median(times["row"]), statistics.median(times["batched"])
    gap = max(float(np.abs(a - o).max() / np.abs(o).max()) for a, o in zip(grams["batched"], grams["row"], strict=True))
    return {"params": sum(p.numel() for _, p in named), "rows": rows, "response_tokens": response,
            "candidates": cands, "sketch_dim": DEFAULT_SKETCH_DIM, "threads": torch.get_num_threads(),
            "s_per_sample_row": round(row, 4), "s_per_sample_batched": round(batched, 4),
            "row_over_batched": round(row / batched, 2), "max_rel_gram_gap": gap}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=16, help="samples in the pool chunk")
    p.add_argument("--response", type=int, default=1200, help="mean response tokens")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(json.dumps(measure(a.rows, a.response, a.repeats)), flush=True)  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
