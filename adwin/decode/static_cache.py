"""Compiled decoding on a static KV cache (``rollout.compile``): buckets, compile settings, compile accounting.

On a GPU a decode step of a small model is kernel launches and Python; transformers' own remedy is a static
KV cache (fixed shapes) and a compiled decode step (``torch.compile``; CUDA graphs under ``reduce-overhead``).
Every decoder of the student (``adwin.decode.generate.generate``, ``adwin.sampling.compact``, the AsyncOPD
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
RECOMPILE_LIMIT = 64  # graphs one compiled forward may hold (buckets x decoders)
ROW_LAYERS = {"StaticLayer"}  # the static cache layers a StaticBatch lays rows into


class StaticCacheError(ValueError):
    """The model's static KV cache has layers a compiled decoder cannot lay rows into (e.g. sliding windows)."""


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


def static_layer_kinds(model: torch.nn.Module) -> set[str]:
    """The layer classes of the static KV cache transformers builds for ``model`` (nothing is allocated)."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=MIN_CACHE)
    return {type(layer).__name__ for layer in cache.layers}


def lays_rows(model: torch.nn.Module) -> bool:
    """Whether the decoders with their own loop (``StaticBatch``) can lay rows into ``model``'s static cache:
    plain ``StaticLayer``s only (sliding-window layers roll their columns)."""
    return static_layer_kinds(model) == ROW_LAYERS


def without_compiled(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` without the compiled call transformers caches on it: a deep copy (a probe worker's replica)
    must compile its own, not call the original's (bound to the original's weights)."""
    for name in ("_compiled_call", "_last_compile_config"):
        model.__dict__.pop(name, None)
    return model


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
        """Install dynamo's compile-start/end callbacks once (they time every compile of the process), and let
        one compiled forward hold every bucket's graph: dynamo's default limit (8 graphs per function) would
        silently fall back to eager decoding past it."""
        with self._lock:
            if self._hooked:
                return
            self._hooked = True
        import torch._dynamo
        from torch._dynamo.callback import callback_handler

        for limit in ("recompile_limit", "cache_size_limit"):  # the name changed across torch releases
            if hasattr(torch._dynamo.config, limit):
                setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), RECOMPILE_LIMIT))
                break

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
    ``width`` tokens: a static cache of a bucketed length, built here, and transformers' compiled decode step.

    The cache is passed in rather than asked for by length (``max_cache_len``, a ``generate`` argument from
    transformers 5.13 only): every supported release then decodes on the bucket's shape. A user-supplied static
    cache is what ``generate`` compiles its step for, as it does for one it builds."""
    from transformers import StaticCache

    from adwin.decode.kv_cache import cache_keyword

    device = next(model.parameters()).device
    columns = cache_bucket(width + max_new)
    cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=columns)
    LEDGER.note("generate", (rows, columns))
    return {cache_keyword(model): cache, "compile_config": compile_config(device)}


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


class StaticBatch:
    """A ``rows`` x ``columns`` static KV cache of ``model``, its padding mask and the compiled one-token step:
    the shared machinery of the decoders that run their own loop (compact evaluation, the AsyncOPD engine).

    Column ``c`` of every layer holds one token per row; ``mask[b, c]`` says whether row ``b`` attends to it. A
    step writes the column the cache's write position points at for every row (rows that do not decode write a
    masked pad there) and advances it; positions (RoPE) are per row, so rows of different lengths share columns.
    The write position lives in the layers on transformers >= 5 and in ``position`` here on 4.x, whose forward
    is told it (``cache_position``) at every call (``adwin.decode.kv_cache.tracks_position``).
    """

    def __init__(self, model: torch.nn.Module, rows: int, columns: int, decoder: str) -> None:
        from transformers import StaticCache

        from adwin.decode.kv_cache import cache_keyword, tracks_position

        self.model, self.rows, self.columns = model, rows, columns
        device = next(model.parameters()).device
        self.cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=columns)
        self.layers = list(self.cache.layers)
        kinds = {type(layer).__name__ for layer in self.layers}
        if kinds != ROW_LAYERS:
            raise StaticCacheError(f"compiled decoding lays rows into plain StaticLayer caches only, got "
                                   f"{sorted(kinds)}; set rollout.compile: false")
        self.mask = torch.zeros(rows, columns, dtype=torch.long, device=device)  # (rows, columns)
        self._tracked = tracks_position(self.layers[0])
        # (1,) the next write column where the layers keep none; a tensor updated in place, so a compiled step
        # reads a new value without recompiling
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self._kw = cache_keyword(model)
        self._step = compiled_forward(model)
        LEDGER.note(decoder, (rows, columns))

    @property
    def column(self) -> int:
        """The column the next step writes."""
        return int(self.layers[0].cumulative_length if self._tracked else self.position)

    def seek(self, column: int) -> None:
        """Point every layer's write position at ``column`` (in place: the compiled step reads these tensors)."""
        if not self._tracked:
            self.position.fill_(column)
            return
        for layer in self.layers:
            layer.cumulative_length.fill_(column)

    def _written(self, columns: int) -> dict[str, Any]:
        """The forward's ``cache_position`` for ``columns`` new columns where the layers keep no write position
        (4.x), advancing ``position`` past them; nothing where they do."""
        if self._tracked:
            return {}
        start = self.position.clone()
        self.position.add_(columns)
        return {"cache_position": start + torch.arange(columns, device=start.device)}  # (columns,)

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Encode left-padded contexts ``ids`` (rows, T) into columns [0, T) (eager: one shape per prompt length
        would otherwise compile); next-token logits (rows, V)."""
        width = ids.shape[1]
        self.mask[:, :width] = mask
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0),
                         **{self._kw: self.cache}, **self._written(width), use_cache=True, logits_to_keep=1)
        return out.logits[:, -1]

    def write(self, row: int, start: int, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
        """Lay one row's cached context (per layer (heads, n, dim)) into columns [start, start + n) of ``row``."""
        for layer, k, v in zip(self.layers, keys, values, strict=True):
            layer.keys[row, :, start : start + k.shape[-2]] = k
            layer.values[row, :, start : start + v.shape[-2]] = v

    def ensure_allocated(self, like: torch.Tensor, heads: int, key_dim: int, value_dim: int) -> None:
        """Allocate the layers' tensors before the first ``write`` (a prefill allocates them itself)."""
        from adwin.decode.kv_cache import allocate, is_allocated

        for layer in self.layers:
            if not is_allocated(layer):
                allocate(layer, like.new_empty(self.rows, heads, 1, key_dim), like.new_empty(self.rows, heads, 1, value_dim))

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, decoding: torch.Tensor) -> torch.Tensor:
        """One compiled forward of ``tokens`` (rows,) at ``positions`` (rows,); rows where ``decoding`` (rows,)
        is False write a masked column (such a row must attend to some earlier column: a row attending to
        nothing turns NaN, and NaN values poison even masked columns). Next-token logits (rows, V)."""
        column = self.column
        self.mask[:, column] = decoding.long()
        out = self._step(input_ids=tokens[:, None], attention_mask=self.mask, position_ids=positions[:, None],
                         **{self._kw: self.cache}, **self._written(1), use_cache=True, logits_to_keep=1)
        return out.logits[:, -1]

    def select(self, keep: torch.Tensor, rows: int, decoder: str) -> StaticBatch:
        """A batch of ``rows`` (a bucket) holding rows ``keep`` of this one first, the rest empty (all masked)."""
        from adwin.decode.kv_cache import allocate

        small = StaticBatch(self.model, rows, self.columns, decoder)
        column = self.column
        for mine, theirs in zip(self.layers, small.layers, strict=True):
            allocate(theirs, mine.keys[:rows], mine.values[:rows])
            theirs.keys[: len(keep)] = mine.keys[keep]
            theirs.values[: len(keep)] = mine.values[keep]
        small.seek(column)
        small.mask[: len(keep)] = self.mask[keep]
        return small
