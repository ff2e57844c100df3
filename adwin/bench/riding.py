"""What riding probe rows cost a rollout call (``adwin bench probes --padding``): one transformers ``generate``
call of the rollout rows alone, the same call with the probe rows in it (left-padded to the probes' longer
contexts, decoding the same number of steps: riders are capped at the call's window), and the probe rows in a
call of their own, each with a dynamic KV cache (what ``adwin.decode.generate.generate`` uses uncompiled) and a
static one (``cache_implementation="static"``, the compiled path's cache). transformers sizes a static cache to the
longest one the model has seen (``_prepare_static_cache``), and every row attends over the whole cache at every
step, so the static calls run with the riding call first: the rollout rows alone then decode on the cache the
riders sized, as they do in a run once a probe round has been decoded on the learner's model. Every row decodes
exactly ``window`` steps (no EOS), so the calls differ only in their rows and their padded width. ``gpubench``
may call ``padding_cost`` on a GPU."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

CACHES = ("dynamic", "static")


def _call(model: torch.nn.Module, contexts: list[list[int]], window: int, cache: str, pad_id: int,
          never: int) -> Callable[[], None]:
    from adwin.decode.loop import left_pad

    device = next(model.parameters()).device
    ids, mask = left_pad(contexts, pad_id, device)  # (B, T)
    extra: dict[str, Any] = {"cache_implementation": "static"} if cache == "static" else {}

    def run() -> None:
        model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,  # type: ignore[operator]
                       max_new_tokens=window, min_new_tokens=window, pad_token_id=pad_id, eos_token_id=never,
                       **extra)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return run


def _best(run: Callable[[], None], repeats: int) -> float:
    run()  # warm: allocations, a static cache's first build
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def padding_cost(model: torch.nn.Module, *, rows: int = 128, prompt_len: int = 20, probe_rows: int = 8,
                 probe_len: int = 200, window: int = 64, pad_id: int = 0, repeats: int = 3,
                 seed: int = 0) -> dict[str, dict[str, float]]:
    """Seconds (best of ``repeats``) per cache kind of: ``alone`` (``rows`` contexts of ``prompt_len`` tokens,
    ``window`` new tokens each), ``riding`` (the same call plus ``probe_rows`` contexts of ``probe_len`` tokens, all
    left-padded to ``probe_len``), ``separate`` (the probe rows in their own call), and the ratios ``riding / alone``
    and ``(alone + separate) / alone``; ``ms_per_step`` of each call over its ``window`` decode steps."""
    vocab = int(model.config.vocab_size)  # type: ignore[union-attr]
    g = torch.Generator().manual_seed(seed)

    def ctx(n: int, length: int) -> list[list[int]]:
        return torch.randint(3, vocab, (n, length), generator=g).tolist()

    rollout, probes = ctx(rows, prompt_len), ctx(probe_rows, probe_len)
    never = vocab  # an id the model cannot sample: every row decodes the whole window
    was_training = model.training
    model.eval()
    out: dict[str, dict[str, float]] = {}
    try:
        for cache in CACHES:
            calls = {"riding": rollout + probes, "alone": rollout, "separate": probes}  # riding first: see above
            t = {k: _best(_call(model, c, window, cache, pad_id, never), repeats) for k, c in calls.items()}
            out[cache] = t | {"riding_x": t["riding"] / t["alone"], "separate_x": (t["alone"] + t["separate"]) / t["alone"]}
            out[cache] |= {f"ms_per_step_{k}": 1000 * t[k] / window for k in calls}
    finally:
        model.train(was_training)
    return out
