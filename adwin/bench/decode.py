"""Decode speed of the student's decoders, compiled (``rollout.compile: true``) against eager, side by side.

``python -m adwin.bench.decode [--student PATH] [--llama125m-layers N] [--rows B] [--new N] [--repeats R]
[--device cuda --dtype bfloat16]``

``python -m adwin.bench.decode --long [--rows 32 --new 2048 --repeats R --threads T]``: the CPU decode step
(``adwin.decode.lean``, what ``generate`` runs for a Llama student on CPU) against transformers' ``generate`` with
its dynamic cache (``hf_generate``, the shared sampler as its logits processor) and against the loop on the model's
own cache (``lean=False``), on the same rows, calls alternating, in one process: a model of the built-in long
model's shape (``LONG_PROFILE_SPECS['default']``, the character tokenizer's vocabulary) with random weights, built
in code. No EOS: every call decodes ``--new`` steps. One JSON line with ms/step of each and the ratios.

For each model (the built-in default student and a Llama of SmolLM2-135M's width with random weights, built in
code, ``--llama125m-layers`` of its 30 layers), and each decoder (``generate``: rollouts and probe rounds;
``compact``: evaluation), the first compiled call is timed apart (it compiles), then warm calls alternate eager and
compiled so a noisy machine slows both alike. ``ms/step`` is a warm call's seconds over its decode steps; the
compile seconds are torch's own (``adwin.decode.static_cache.LEDGER``). Prints one JSON line per row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from adwin.decode.generate import generate, hf_generate
from adwin.decode.loop import Generation, decode
from adwin.decode.sampler import TokenSampler
from adwin.decode.static_cache import LEDGER
from adwin.sampling.compact import generate_compacting


def llama_125m_shaped(layers: int) -> torch.nn.Module:
    """SmolLM2-135M's width (hidden 576, 9/3 heads, 32k vocab) with ``layers`` layers, random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(cfg).eval()


def long_shaped(seed: int = 0) -> torch.nn.Module:
    """A Llama of the built-in long model's shape (hidden 64, 4 layers, the character tokenizer's vocabulary),
    random weights: decode timing does not depend on what the weights learned."""
    from adwin.tasks.profiles import LONG_MAX_POSITIONS, LONG_PROFILE_SPECS
    from adwin.tasks.tokenizer import build_tokenizer

    tok = build_tokenizer(LONG_MAX_POSITIONS)
    return LONG_PROFILE_SPECS["default"].model.build(len(tok), tok, seed=seed).eval()


def random_contexts(vocab: int, rows: int, seed: int = 0) -> list[list[int]]:
    """``rows`` contexts of 8-24 tokens (ids 3 and up: no special tokens)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(torch.randint(8, 24, (1,), generator=g)),), generator=g).tolist()
            for _ in range(rows)]


def measure_lean(model: torch.nn.Module, rows: int, new: int, repeats: int, seed: int = 0) -> dict[str, Any]:
    """ms per decode step of the CPU decode step (``lean``), transformers' ``generate`` on its dynamic cache
    (``generate``) and the loop on the model's own cache (``own_cache``), the same rows and seed for each, the
    three calls alternating ``repeats`` times (medians); ``lean_over_generate`` is the goal's ratio."""
    contexts = random_contexts(model.config.vocab_size, rows, seed)
    budgets = [new] * rows
    calls: dict[str, Callable[[], Generation]] = {
        "generate": lambda: hf_generate(model, contexts, budgets, eos=set(), pad_id=0, with_logprobs=False,
                                        sampling={}, sampler=TokenSampler(1.0, 1.0), static=False),
        "lean": lambda: generate(model, contexts, budgets, eos=set(), pad_id=0, temperature=1.0),
        "own_cache": lambda: decode(model, contexts, budgets, eos=set(), pad_id=0, sampler=TokenSampler(1.0, 1.0),
                                    lean=False),
    }
    times: dict[str, list[float]] = {k: [] for k in calls}
    tokens: dict[str, list[list[int]]] = {}
    for _ in range(repeats):
        for name, call in calls.items():
            torch.manual_seed(seed)  # the same global-RNG draws for every decoder
            t = time.perf_counter()
            out = call()
            times[name].append((time.perf_counter() - t) / out.decode_steps * 1e3)
            tokens[name] = out.response_ids
    ms = {k: statistics.median(v) for k, v in times.items()}
    return {"decoder": "lean", "rows": rows, "new_tokens": new, "repeats": repeats,
            **{f"ms_step_{k}": round(v, 3) for k, v in ms.items()},
            "lean_over_generate": round(ms["lean"] / ms["generate"], 3),
            "lean_over_own_cache": round(ms["lean"] / ms["own_cache"], 3),
            "same_tokens": tokens["lean"] == tokens["generate"] == tokens["own_cache"],
            "ms_step_all": {k: [round(x, 3) for x in v] for k, v in times.items()}}


def measure(model: torch.nn.Module, rows: int, new: int, repeats: int, seed: int = 0) -> list[dict[str, Any]]:
    """Rows of ``{decoder, ms_step_eager, ms_step_compiled, ratio, compile_s, ...}`` for one model."""
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    contexts = [torch.randint(3, vocab, (int(torch.randint(8, 24, (1,), generator=g)),), generator=g).tolist()
                for _ in range(rows)]
    calls: dict[str, Callable[[Any], Generation]] = {
        # no EOS: every call decodes exactly ``new`` steps
        "generate": lambda c: generate(model, contexts, [new] * rows, eos=set(), pad_id=0, temperature=1.0,
                                       compile=c),
        "compact": lambda c: generate_compacting(model, contexts, new, eos=set(), pad_id=0, temperature=1.0,
                                                 compile=c),
    }
    out = []
    for name, call in calls.items():
        LEDGER.hook()
        before = LEDGER.seconds
        t = time.perf_counter()
        call(True)
        first = time.perf_counter() - t
        compile_s = LEDGER.seconds - before
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(repeats):
            for compiled in (False, True):
                t = time.perf_counter()
                steps = call(compiled).decode_steps
                times[compiled].append((time.perf_counter() - t) / steps * 1e3)
        eager, comp = statistics.median(times[False]), statistics.median(times[True])
        out.append({"decoder": name, "rows": rows, "new_tokens": new, "ms_step_eager": round(eager, 3),
                    "ms_step_compiled": round(comp, 3), "compiled_over_eager": round(comp / eager, 3),
                    "first_compiled_call_s": round(first, 2), "compile_s": round(compile_s, 2)})
    return out


def measure_evaluation(model: torch.nn.Module, tokenizer: Any, rows: int, repeats: int) -> dict[str, Any]:
    """Compact evaluation on the built-in task's held-out problems (rows stop at their own EOS, 320 tokens at
    most): eager against compiled with stopped rows masked and compiled with the live rows shrunk to buckets.
    Seconds per call (median, alternating), after one untimed compiled call of each kind."""
    from adwin.sampling.rollout import encode_prompts, eos_ids, pad_id_of
    from adwin.tasks.prompts import builtin_prompts

    eos = eos_ids(model, tokenizer)
    pad = pad_id_of(tokenizer, eos)
    contexts = encode_prompts(tokenizer, [p.prompt for p in builtin_prompts(rows, 0, "eval")], 128)
    kinds = {"eager": {}, "masked": {"compile": True}, "shrink": {"compile": True, "shrink": True}}

    def call(kw: dict[str, Any]) -> Generation:
        return generate_compacting(model, contexts, 320, eos=eos, pad_id=pad, temperature=0.0, **kw)

    before = LEDGER.seconds
    for kind in ("masked", "shrink"):
        call(kinds[kind])
    compile_s = LEDGER.seconds - before
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(repeats):
        for kind, kw in kinds.items():
            t = time.perf_counter()
            steps = call(kw).decode_steps
            times[kind].append(time.perf_counter() - t)
    out: dict[str, Any] = {"decoder": "compact-evaluation", "rows": rows, "decode_steps": steps,
                           "compile_s": round(compile_s, 2)}
    out |= {f"s_{k}": round(statistics.median(v), 3) for k, v in times.items()}
    return out | {"shapes": sorted(LEDGER.shapes.get("compact", set()))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--student", default="builtin", help="a transformers folder; builtin = the built-in default student")
    p.add_argument("--llama125m-layers", type=int, default=4, help="layers of the 125M-wide Llama (0: skip it)")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--new", type=int, default=64, help="decode steps per call")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="torch device of the models (cuda: CUDA graphs)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--long", action="store_true", help="only the CPU decode step against transformers' generate, on "
                   "a model of the built-in long model's shape with random weights (e.g. --rows 32 --new 2048)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.long:
        model = long_shaped()
        row = measure_lean(model, a.rows, a.new, a.repeats)
        params = sum(p.numel() for p in model.parameters())
        print(json.dumps({"model": "long-shaped-random-weights", "params": params, "threads": a.threads,  # noqa: T201
                          **row}), flush=True)
        return 0
    from transformers import AutoModelForCausalLM

    path = a.student
    if path == "builtin":
        from adwin.tasks.shipped import builtin_assets

        assets = builtin_assets("default")
        path = str(assets.student_path)
    models = {"builtin-student": AutoModelForCausalLM.from_pretrained(path).eval()}
    if a.student == "builtin" and a.device == "cpu":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(assets.tokenizer_path))
        row = measure_evaluation(models["builtin-student"], tok, a.rows, a.repeats)
        print(json.dumps({"model": "builtin-student", **row}, default=list), flush=True)  # noqa: T201
    if a.llama125m_layers:
        models[f"llama-125m-width-{a.llama125m_layers}L"] = llama_125m_shaped(a.llama125m_layers)
    for name, model in models.items():
        model.to(device=a.device, dtype=getattr(torch, a.dtype))
        params = sum(p.numel() for p in model.parameters())
        for row in measure(model, a.rows, a.new, a.repeats):
            print(json.dumps({"model": name, "params": params, **row}), flush=True)  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
