"""Per-sample segment gradients of many rows in one pass: the per-sample engine of the ``fast`` and ``sketch`` audits.

Math layer. The per-sample statistics (macro cosines, the debiased estimator, the interval's vectors, an audit-truth
pool) need the gradient ``g_is`` of every sample ``i``'s segment ``s`` loss. One backward per sample and segment costs
``P (K+1)`` passes, each a few hundred small ops on CPU. Here the rows go through ``chunked_forward`` together, each
module that owns an audited parameter records its input ``x`` and output ``y``, and one backward per segment, over
all rows at once, asks autograd only for the outputs' gradients ``dy``: no row mixes with another, so row ``i``'s
``dy`` is that of its own loss, and no parameter gradient is formed. Each row's parameter gradient is then the
module's own formula on its ``x`` and ``dy`` (the weight gradient the backward would have formed, kept per row):

- ``nn.Linear``: ``dW_i = sum_t dy_it x_it^T``, ``db_i = sum_t dy_it``;
- ``nn.Embedding``: ``dy_it`` added at row ``x_it`` of the table (none at ``padding_idx``, as its backward);
- a norm of the form ``weight * n(x) (+ bias)`` (transformers' Llama/Qwen ``*RMSNorm``, ``nn.RMSNorm``,
  ``nn.LayerNorm``): ``dw_i = sum_t dy_it * n(x_it)``, ``n`` the module's own forward under unit weight and zero bias.

A parameter of several modules (an LM head tied to the embeddings) sums its modules' terms. ``segment_grads``
refuses (``PerSampleUnsupported``) a model with an audited parameter that another module type owns, and compares the
first segment's row sum with autograd's own parameter gradient, which catches a parameter used outside its module's
forward (or a norm of another form); ``adwin.audit.grams`` then falls back to one row at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from adwin.audit.segments import Prepared, chunked_forward
from adwin.audit.sketch import Grads

ROW_GRAD_BYTES = 1 << 28  # per-row gradients one pass may hold (float32): rows per pass shrink to fit
# a pass holds rows whose forwarded lengths are within this fraction of its shortest: on CPU a pass is
# compute-bound from a few hundred tokens a row, so the padding of a ragged pass costs more than the ops it saves
PAD_SLACK = 0.1
VERIFY_RTOL = 1e-3  # row sum vs autograd, relative; float32 summation order alone stays near 1e-6
VERIFY_RTOL_AUTOCAST = 3e-2  # under bf16 autocast autograd rounds its own weight gradient to bf16

Scale = Callable[[int, torch.Tensor], torch.Tensor]


class PerSampleUnsupported(Exception):
    """The batched engine cannot differentiate this model's audited parameters per row; the caller falls back."""


@dataclass
class _Call:
    """One forward call of a recording module, in chunk ``chunk`` of the chunked forward."""

    module: nn.Module
    kind: str
    chunk: int
    x: torch.Tensor  # (B, ..., in): the input (token ids for an embedding)
    y: torch.Tensor  # (B, ..., out): the output, in the graph
    n: torch.Tensor | None  # a norm's n(x), shaped like y


def _kind(m: nn.Module) -> str | None:
    """Which per-row formula ``m``'s parameters take, None when there is none for it."""
    fwd = type(m).forward
    if fwd is nn.Linear.forward:
        return "linear"
    if fwd is nn.Embedding.forward:
        # max_norm renormalizes the table in place; scale_grad_by_freq rescales by the whole batch's counts
        return None if m.max_norm is not None or m.scale_grad_by_freq else "embedding"
    if fwd is nn.LayerNorm.forward or fwd is nn.RMSNorm.forward or type(m).__name__.endswith("RMSNorm"):
        names = {k for k, v in m._parameters.items() if v is not None}
        return "norm" if names and names <= {"weight", "bias"} else None
    return None


def owners(model: nn.Module, named: Sequence[tuple[str, nn.Parameter]]) -> dict[int, list[tuple[nn.Module, str, str]]]:
    """``id(parameter) -> [(module, kind, attribute)]`` for every audited parameter; refuses an unsupported owner."""
    want = {id(p): name for name, p in named}
    out: dict[int, list[tuple[nn.Module, str, str]]] = {}
    for m in model.modules():
        for attr, p in m._parameters.items():
            if p is None or id(p) not in want:
                continue
            kind = _kind(m)
            if kind is None:
                raise PerSampleUnsupported(f"{want[id(p)]} belongs to a {type(m).__name__}")
            out.setdefault(id(p), []).append((m, kind, attr))
    for pid, name in want.items():
        if pid not in out:
            raise PerSampleUnsupported(f"{name} belongs to no module of the model")
    return out


def rows_per_pass(n: int, micro_batch: int | None, n_seg: int, params: Sequence[nn.Parameter], exact: bool) -> int:
    """Rows differentiated together: ``micro_batch`` (None: all ``n``), fewer when their per-row gradients
    (``K+1`` copies for the exact Gram, one segment's for the sketch) would pass ``ROW_GRAD_BYTES``."""
    per_row = (n_seg if exact else 1) * sum(p.numel() for p in params) * 4
    want = n if micro_batch is None else int(micro_batch)
    return max(1, min(want, ROW_GRAD_BYTES // max(per_row, 1)))


def passes(lengths: Sequence[int], step: int) -> list[list[int]]:
    """Row indices grouped into passes: by length, at most ``step`` rows, each pass's longest within ``PAD_SLACK``
    of its shortest (``lengths``: the columns each row needs forwarded)."""
    out: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda j: (lengths[j], j)):
        last = out[-1] if out else None
        if last is None or len(last) >= step or lengths[i] > lengths[last[0]] * (1.0 + PAD_SLACK):
            out.append([i])
        else:
            last.append(i)
    return out


def _normalized(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``n(x)``: the norm's own forward with unit weight and zero bias."""
    unit = {k: (torch.ones_like(v) if k == "weight" else torch.zeros_like(v))
            for k, v in m._parameters.items() if v is not None}
    with torch.no_grad():
        return torch.func.functional_call(m, unit, (x,))


def segment_grads(
    model: nn.Module,
    named: list[tuple[str, nn.Parameter]],
    b: Prepared,
    rows: slice,
    n_seg: int,
    scale: Scale,
    verify: bool = True,
) -> Iterator[tuple[int, Grads | None]]:
    """Yield ``(s, per-row gradients of segment s)`` in segment order, each parameter's (B, *shape) (None: an
    empty segment or a parameter it does not reach), scaled by ``scale``. ``verify``: check the first segment's
    row sum against autograd first (``PerSampleUnsupported`` before anything is yielded)."""
    owned = owners(model, named)
    calls: list[_Call] = []
    chunk = [-1]

    caller = threading.get_ident()

    def recorder(kind: str) -> Callable[..., None]:
        def hook(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            # the hooks sit on the model, which other threads may run at the same time (a learner's forward, another
            # rank's audit): only this call's own forward is recorded
            if threading.get_ident() != caller:
                return
            x = args[0] if args else kwargs.get("input")
            if not isinstance(out, torch.Tensor) or not isinstance(x, torch.Tensor):
                raise PerSampleUnsupported(f"a {type(m).__name__} called without one input and one output tensor")
            if out.requires_grad:
                calls.append(_Call(m, kind, chunk[0], x.detach(), out, _normalized(m, x) if kind == "norm" else None))

        return hook

    modules = {id(m): (m, kind) for per in owned.values() for m, kind, _ in per}
    handles = [m.register_forward_hook(recorder(kind), with_kwargs=True) for m, kind in modules.values()]
    try:
        seg_losses = chunked_forward(model, b, rows, n_seg, on_chunk=lambda s: chunk.__setitem__(0, s))
    finally:
        for h in handles:
            h.remove()
    params = [p for _, p in named]
    live = [s for s in range(n_seg) if seg_losses[s] is not None]
    for s in range(n_seg):
        loss = seg_losses[s]
        if loss is None:
            yield s, None
            continue
        mine = [c for c in calls if c.chunk <= s]
        check = verify and s == live[0]
        got = torch.autograd.grad(loss, [c.y for c in mine] + (params if check else []),  # dy: no weight grads
                                  retain_graph=s != live[-1], allow_unused=True)
        seg_losses[s] = loss = None
        grads = _row_grads(named, owned, mine, got[: len(mine)])
        if check:
            _verify(named, grads, got[len(mine):])
        got = None
        for i, g in enumerate(grads):
            grads[i] = None if g is None else scale(i, g)
        yield s, grads
        del grads  # the caller owns it now


def _row_grads(named: list[tuple[str, nn.Parameter]], owned: dict[int, list[tuple[nn.Module, str, str]]],
               calls: list[_Call], dys: Sequence[torch.Tensor | None]) -> Grads:
    by_module: dict[int, list[tuple[_Call, torch.Tensor]]] = {}
    for c, dy in zip(calls, dys, strict=True):
        if dy is not None:
            by_module.setdefault(id(c.module), []).append((c, dy))
    out: Grads = []
    for _, p in named:
        dtype = torch.promote_types(p.dtype, torch.float32)  # never below float32, as the Gram reads it
        g = None
        for m, kind, attr in owned[id(p)]:
            for c, dy in by_module.get(id(m), []):
                with torch.no_grad(), torch.autocast(dy.device.type, enabled=False):
                    part = _row_grad(kind, m, attr, tuple(p.shape), c, dy, dtype)
                g = part if g is None else g.add_(part)
        out.append(g)
    return out


def _row_grad(kind: str, m: nn.Module, attr: str, shape: tuple[int, ...], c: _Call, dy: torch.Tensor,
              dtype: torch.dtype) -> torch.Tensor:
    """(B, *shape): each row's gradient of parameter ``attr`` of ``m`` from one call."""
    rows = dy.shape[0]
    if kind == "embedding":
        ids = c.x.reshape(rows, -1)  # (B, n)
        d = dy.reshape(rows, ids.shape[1], -1).to(dtype)  # (B, n, H)
        n_emb = int(m.num_embeddings)
        flat = (ids + n_emb * torch.arange(rows, device=ids.device)[:, None]).reshape(-1)  # (B n,): row-major table
        d = d.reshape(-1, d.shape[-1])
        if m.padding_idx is not None:
            keep = ids.reshape(-1) != m.padding_idx
            flat, d = flat[keep], d[keep]
        out = torch.zeros(rows * n_emb, shape[-1], dtype=dtype, device=dy.device)
        return out.index_add_(0, flat, d).view(rows, *shape)
    if kind == "linear" and attr == "weight":
        x = c.x.reshape(rows, -1, c.x.shape[-1]).to(dtype)  # (B, n, in)
        return torch.bmm(dy.reshape(rows, -1, dy.shape[-1]).to(dtype).transpose(1, 2), x)  # (B, out, in)
    d = dy.reshape(rows, -1, *shape).to(dtype)  # (B, n, *shape)
    if attr == "bias":
        return d.sum(1)
    assert c.n is not None  # a norm's weight
    return (d * c.n.reshape(rows, -1, *shape).to(dtype)).sum(1)


def _verify(named: list[tuple[str, nn.Parameter]], rows: Grads, summed: Sequence[torch.Tensor | None]) -> None:
    """The rows' gradients must add up to autograd's gradient of their summed loss, parameter by parameter."""
    rtol = VERIFY_RTOL_AUTOCAST if torch.is_autocast_enabled(named[0][1].device.type) else VERIFY_RTOL
    refs = [None if r is None else r.to(torch.promote_types(r.dtype, torch.float32)) for r in summed]
    atol = 1e-6 * max((float(r.norm()) for r in refs if r is not None), default=0.0)
    for (name, _), g, ref in zip(named, rows, refs, strict=True):
        if g is None and ref is None:
            continue
        mine = g.sum(0) if g is not None else torch.zeros_like(ref)
        ref = torch.zeros_like(mine) if ref is None else ref.to(mine.dtype)
        err = float((mine - ref).norm())
        if err > rtol * (float(ref.norm()) + float(mine.norm())) + atol:
            raise PerSampleUnsupported(f"{name}: the rows' gradients miss part of autograd's (relative error "
                                       f"{err / max(float(ref.norm()), 1e-30):.2e}): a use outside its module")
