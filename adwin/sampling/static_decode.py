"""Compiled decoding on a static KV cache (``rollout.compile``): buckets, compile settings, compile accounting.

On a GPU a decode step of a small model is kernel launches and Python; transformers' own remedy is a static
KV cache (fixed shapes) and a compiled decode step (``torch.compile``; CUDA graphs under ``reduce-overhead``).
Every decoder of the student (``adwin.sampling.rollout.generate``, ``adwin.sampling.compact``, the AsyncOPD
engine) takes its compile decisions here, so they share one rule:

- ``compile_wanted``: ``auto`` compiles on CUDA only (docs/decisions.md, "Compiled decoding").
- Shapes are bucketed so a run compiles a bounded number of them: the batch to the next power of two (dummy rows
  fill it), the cache length to the next power of two of prompt + budget (at least ``MIN_CACHE``). A changing
  window changes the number of decode steps, never a shape.
- ``compile_config``: ``reduce-overhead`` (CUDA graphs) on CUDA; inductor's ``default`` elsewhere (CUDA graphs
  need CUDA), with transformers' flag that lets ``generate`` compile off-GPU.
- ``LEDGER`` counts the shapes each decoder compiled (logged once per new shape) and the seconds torch spent
  compiling (dynamo's compile callbacks: tracing, inductor, CUDA-graph recording), so compile cost is reported
  apart from step time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

log = logging.getLogger(__name__)

CompileSetting = Literal["auto", True, False]
MIN_CACHE = 64  # smallest cache bucket: short calls share one shape


def compile_wanted(setting: CompileSetting, device: torch.device | str) -> bool:
    """Whether a decoder on ``device`` compiles: ``auto`` on CUDA only, else the setting itself."""
    if setting == "auto":
        return torch.device(device).type == "cuda"
    return bool(setting)


def batch_bucket(n: int) -> int:
    """Rows a compiled call decodes for ``n`` real rows: the next power of two."""
    return 1 << max(n - 1, 0).bit_length()


def cache_bucket(n: int) -> int:
    """Cache columns for ``n`` tokens (context + budget): the next power of two, at least ``MIN_CACHE``."""
    return max(MIN_CACHE, 1 << max(n - 1, 0).bit_length())


def compile_config(device: torch.device | str) -> Any:
    """transformers' ``CompileConfig`` for ``device``: CUDA graphs on CUDA, inductor's default mode elsewhere.

    ``dynamic=False``: every bucket is its own static graph (what CUDA graphs need); the buckets bound their number.
    """
    from transformers import CompileConfig

    cuda = torch.device(device).type == "cuda"
    cfg = CompileConfig(fullgraph=False, dynamic=False, mode="reduce-overhead" if cuda else "default")
    if not cuda:
        cfg._compile_all_devices = True  # generate compiles only on accelerators unless told
    return cfg


def compiled_forward(model: torch.nn.Module) -> Any:
    """The model's compiled ``__call__`` (transformers' own, cached on the model per compile config), for
    decoders that run their own loop on a static cache."""
    return model.get_compiled_call(compile_config(next(model.parameters()).device))  # type: ignore[operator]


@dataclass
class CompileLedger:
    """Compiled shapes per decoder and the seconds torch spent compiling, process-wide and thread-safe."""

    shapes: dict[str, set[tuple[int, ...]]] = field(default_factory=dict)
    seconds: float = 0.0
    compiles: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _started: dict[int, float] = field(default_factory=dict, repr=False)
    _hooked: bool = False
    _reported_s: float = 0.0

    def hook(self) -> None:
        """Install dynamo's compile-start/end callbacks once (they time every compile of the process)."""
        with self._lock:
            if self._hooked:
                return
            self._hooked = True
        from torch._dynamo.callback import callback_handler

        callback_handler.register_start_callback(self._start)
        callback_handler.register_end_callback(self._end)

    def _start(self, *_: Any) -> None:
        with self._lock:
            self._started[threading.get_ident()] = time.perf_counter()

    def _end(self, *_: Any) -> None:
        with self._lock:
            began = self._started.pop(threading.get_ident(), None)
            if began is not None:
                self.seconds += time.perf_counter() - began
                self.compiles += 1

    def note(self, decoder: str, shape: tuple[int, ...]) -> None:
        """Record that ``decoder`` runs a compiled step of ``shape`` (rows, cache columns); log a new one."""
        self.hook()
        with self._lock:
            seen = self.shapes.setdefault(decoder, set())
            if shape in seen:
                return
            seen.add(shape)
            total = sum(map(len, self.shapes.values()))
        log.info("compiled decoding: %s runs a new shape %s (rows, cache columns); %d shapes in all", decoder,
                 shape, total)

    def count(self) -> int:
        with self._lock:
            return sum(map(len, self.shapes.values()))

    def step_metrics(self) -> dict[str, float]:
        """``rollout/compile_s`` (compile seconds since the previous call) and ``rollout/compiled_shapes``
        (distinct shapes so far); nothing while no decoder compiled."""
        with self._lock:
            if not self.shapes:
                return {}
            spent, self._reported_s = self.seconds - self._reported_s, self.seconds
            return {"rollout/compile_s": spent, "rollout/compiled_shapes": float(sum(map(len, self.shapes.values())))}


LEDGER = CompileLedger()


def generate_kwargs(model: torch.nn.Module, rows: int, width: int, max_new: int) -> dict[str, Any]:
    """``generate`` arguments for a compiled call of ``rows`` (already a bucket) left-padded contexts of
    ``width`` tokens: a static cache of a bucketed length and transformers' compiled decode step."""
    device = next(model.parameters()).device
    cache = cache_bucket(width + max_new)
    # transformers keeps the longest static cache a model has seen (``_previous_max_cache_length``): that length
    # is the shape its compiled step runs
    cache = max(cache, int(getattr(model, "_previous_max_cache_length", 0) or 0))
    LEDGER.note("generate", (rows, cache))
    return {"cache_implementation": "static", "max_cache_len": cache, "compile_config": compile_config(device)}


def pad_rows(contexts: Sequence[Sequence[int]], budgets: Sequence[int], row_seeds: Sequence[int] | None,
             pad_id: int) -> tuple[list[Sequence[int]], list[int], list[int] | None]:
    """Contexts, budgets and seeds filled with dummy rows (one pad token, budget 0) up to the batch bucket."""
    extra = batch_bucket(len(contexts)) - len(contexts)
    return ([*contexts, *([[pad_id]] * extra)], [*budgets, *([0] * extra)],
            None if row_seeds is None else [*row_seeds, *([0] * extra)])


def stop_dummy_rows(real: int, rows: int, device: torch.device) -> Any:
    """A ``StoppingCriteria`` that ends the dummy rows after their first token (so they never keep a call
    going); real rows stop as they would anyway."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    dummy = torch.zeros(rows, dtype=torch.bool, device=device)  # (B,)
    dummy[real:] = True

    class _Dummies(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            return dummy

    return StoppingCriteriaList([_Dummies()])
