"""Decode ms per step, part c of ``adwin bench gpu``: adwin's rollout engine against transformers' own
static-cache ``generate`` on the same model, rows, prompts and number of new tokens.

Three paths, in this order (the reference first, the uncompiled engine, slowest, last), each called once to warm
up (that call's seconds and the compile seconds torch reports during it are kept apart) and then ``calls``
times, timed:

- ``static``: ``model.generate(cache_implementation="static")`` called directly, as a user of transformers would,
  with the engine's sampling arguments (temperature 1, top-p 1, top-k off, the raw logits kept: the engine keeps
  them for the behaviour logprobs); transformers compiles its decode step on CUDA only;
- ``engine compiled``: ``adwin.decode.engine.HFEngine`` (``adwin.decode.generate.generate``) with
  ``rollout.compile`` true: a static cache and transformers' compiled step, the batch bucketed
  (``adwin.decode.static_cache``);
- ``engine``: the same engine with ``rollout.compile`` false: ``generate`` on a dynamic KV cache.

ms per step = a call's seconds over the positions it decoded (``Generation.decode_steps``; new columns for
``static``), the median over the timed calls; the ratio divides each by ``static``'s. The random prompts avoid the
EOS and pad ids, and a random model rarely emits EOS, so every call decodes its whole budget. Results go to
``out`` path by path as each finishes, so a cut part still reports what finished.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PATHS = ("static", "engine compiled", "engine")


def run_decode(student: str, dtype: str, device: str, rows: int, prompt_len: int, new_tokens: int, calls: int,
               out: str, seed: int = 0) -> None:
    """The decode part, in its own process (``gpu_setup.bounded``): one JSON line per path to ``out``."""
    import torch
    from transformers.utils import logging as hf_logging

    from adwin.decode.engine import HFEngine
    from adwin.decode.static_cache import LEDGER
    from adwin.sampling.rollout import eos_ids, pad_id_of
    from adwin.teacher.checkpoints import load_model, load_tokenizer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    hf_logging.disable_progress_bar()
    model = load_model(student, dtype, device)
    eos = eos_ids(model, load_tokenizer(student))
    pad = pad_id_of(load_tokenizer(student), eos)
    low = max(*eos, pad) + 1  # prompt ids above every special id: no row starts finished or padded
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, int(model.config.vocab_size), (rows, prompt_len), generator=gen)  # (B, T)
    contexts = ids.tolist()
    LEDGER.hook()  # dynamo's compile callbacks: compile seconds of every path, the static one included

    def engine(compile: bool) -> Any:
        eng = HFEngine(model, eos, pad, compile=compile)

        def call() -> int:
            g = eng.generate(contexts, [new_tokens] * rows, temperature=1.0, top_p=1.0, with_logprobs=True)
            return g.decode_steps
        return call

    def static() -> int:
        dev_ids = ids.to(device)
        out_ = model.generate(input_ids=dev_ids, attention_mask=torch.ones_like(dev_ids), do_sample=True,
                              temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens, pad_token_id=pad,
                              eos_token_id=sorted(eos), return_dict_in_generate=True, output_logits=True,
                              cache_implementation="static")
        return int(out_.sequences.shape[1] - prompt_len)

    def timed(fn: Any) -> tuple[float, int, float]:
        compiled_before = LEDGER.seconds
        sync(device)
        t0 = time.perf_counter()
        steps = fn()
        sync(device)
        return time.perf_counter() - t0, steps, LEDGER.seconds - compiled_before

    for name, fn in zip(PATHS, (static, engine(True), engine(False)), strict=True):
        torch.manual_seed(seed)  # the same draws for every path
        first_s, _, compile_s = timed(fn)
        warm = [timed(fn) for _ in range(calls)]
        ms = statistics.median(1000 * s / max(steps, 1) for s, steps, _ in warm)
        row = {"path": name, "first_s": first_s, "compile_s": compile_s, "ms_per_step": ms,
               "decode_steps": warm[-1][1], "calls": calls, "warm_s": [s for s, _, _ in warm],
               "recompile_s": sum(c for _, _, c in warm)}
        log.info("bench gpu decode: %s %.2f ms per step (first call %.1f s)", name, ms, first_s)
        with Path(out).open("a") as f:
            f.write(json.dumps(row) + "\n")


def sync(device: str) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def read_decode(path: Path) -> dict[str, Any]:
    """The finished paths of a decode part, each with its ratio to ``static`` (when that one finished)."""
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    by = {r["path"]: r for r in rows}
    base = by.get("static", {}).get("ms_per_step")
    for r in rows:
        r["x_static"] = r["ms_per_step"] / base if base else None
    return {"paths": rows, "missing": [p for p in PATHS if p not in by]}
