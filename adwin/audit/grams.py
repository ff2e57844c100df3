"""Segment gradients and their Gram matrix: the engines behind ``adwin.audit.alignment.audit``.

Math layer: imports nothing from the controller, probes or application modules. Internal to the audit:
``adwin.audit.alignment`` validates the inputs, builds ``Prepared`` and turns the Gram into cosines.

Both engines return the (K+1, K+1) float64 Gram ``G[s, s'] = <g_s, g_s'>`` of the segment gradients
(batch level) and, with ``macro``, one Gram per sample: ``reference_grams`` from flattened float64
gradients (tests), ``chunked_grams`` through the causal chunked forward (methods ``fast`` and
``sketch``). Gradients are scaled by the square root of the metric weight (``metric_scaler``) first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from adwin.audit import persample
from adwin.audit.combine import segment_matrix
from adwin.audit.segments import (
    Prepared,
    TokenLoss,
    add_into,
    chunked_forward,
    forwarded_lengths,
    per_token_loss,
    prepare,
    rows_of,
)
from adwin.audit.sketch import Grads, HashCache, countsketch, countsketch_rows
from adwin.objectives.losses import token_logprobs

__all__ = ["Prepared", "TokenLoss", "canonical_name", "chunked_grams", "metric_scaler", "prepare", "reference_grams"]

log = logging.getLogger(__name__)

# Sum over data-parallel ranks (in place, returned); ``adwin.audit.combine``.
Reduce = Callable[[torch.Tensor], torch.Tensor]


def canonical_name(name: str) -> str:
    # Wrappers (DDP, torch.compile) prefix names; the sketch hash must not depend on them.
    for prefix in ("module.", "_orig_mod."):
        while name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def metric_scaler(
    params: list[torch.nn.Parameter], metric: str, optimizer: torch.optim.Optimizer | None
) -> Callable[[int, torch.Tensor], torch.Tensor]:
    """``scale(i, g)``: gradient of parameter ``i`` times the square root of its metric weight.

    Weights are rebuilt per call from the optimizer state rather than cached, so no full-size weight
    vector is held.
    """
    if metric == "identity" or optimizer is None:
        return lambda i, g: g
    group_of: dict[int, dict[str, Any]] = {id(p): g for g in optimizer.param_groups for p in g["params"]}

    def scale(i: int, g: torch.Tensor) -> torch.Tensor:
        p = params[i]
        state = optimizer.state.get(p, {})
        group = group_of.get(id(p))
        v = (
            state.get("max_exp_avg_sq")
            if group is not None and group.get("amsgrad")
            else state.get("exp_avg_sq")
        )
        if v is None or group is None or "step" not in state:
            return g  # no second moment yet: weight 1
        step = float(state["step"])
        beta2 = float(group["betas"][1])
        eps = float(group["eps"])
        denom = (v.float() / (1.0 - beta2**step)).sqrt_().add_(eps)  # AdamW's denominator
        return g * denom.rsqrt_()

    return scale


def reference_grams(
    model: torch.nn.Module,
    named: list[tuple[str, torch.nn.Parameter]],
    b: Prepared,
    n_seg: int,
    scale: Callable[[int, torch.Tensor], torch.Tensor],
    macro: bool,
    keep_vectors: bool = False,
    reduce: Reduce | None = None,
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """One forward over the whole batch, one backward per segment (and per sample and segment).

    With ``keep_vectors`` (needs ``macro``) also the per-sample flattened segment gradients, each (K+1, D).
    ``reduce`` sums the batch-level segment gradients over data-parallel ranks before the Gram
    (``adwin.audit.combine``)."""
    params = [p for _, p in named]
    logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits
    logp = token_logprobs(logits, b.input_ids)  # (B, L)
    per = per_token_loss(logp, b.teacher_logprobs, b.response_mask, b.token_weights, b.loss)  # (B, L)

    def flat_grad(scalar: torch.Tensor) -> torch.Tensor:
        gs = torch.autograd.grad(scalar, params, retain_graph=True, allow_unused=True)
        return torch.cat(
            [
                (torch.zeros_like(p) if g is None else scale(i, g)).reshape(-1).double()
                for i, (p, g) in enumerate(zip(params, gs, strict=True))
            ]
        )

    m = torch.stack([flat_grad((per * (b.segment == s)).sum()) for s in range(n_seg)])  # (K+1, D)
    if reduce is not None:
        m = reduce(m)
    gram = (m @ m.T).cpu().numpy()
    sample_grams, vectors = [], []
    if macro:
        for i in range(per.shape[0]):
            ms = torch.stack([flat_grad((per[i] * (b.segment[i] == s)).sum()) for s in range(n_seg)])  # (K+1, D)
            sample_grams.append((ms @ ms.T).cpu().numpy())
            if keep_vectors:
                vectors.append(ms.cpu().numpy())
    return gram, sample_grams, vectors


def chunked_grams(
    model: torch.nn.Module,
    named: list[tuple[str, torch.nn.Parameter]],
    b: Prepared,
    n_seg: int,
    scale: Callable[[int, torch.Tensor], torch.Tensor],
    macro: bool,
    micro_batch: int | None,
    sketch_dim: int | None,
    seed: int,
    vector_dim: int | None = None,
    reduce: Reduce | None = None,
    engine: str = "batched",
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray | None, list[np.ndarray]]:
    """``fast`` (sketch_dim None) and ``sketch``: micro-batches through the causal chunked graph.

    ``micro_batch``: at most this many rows per forward/backward (None: the whole batch). ``macro`` (per-sample
    Grams) differentiates each row apart: ``engine="batched"`` (``adwin.audit.persample``) takes up to
    ``micro_batch`` rows per pass (fewer where their gradients would pass ``persample.ROW_GRAD_BYTES``) and falls
    back to ``"row"`` (one backward per row and segment) for a model it refuses.

    With ``vector_dim`` (needs ``macro``) also each sample's (K+1, vector_dim) CountSketch of its segment
    gradients (the sketch itself for ``sketch``), for the bootstrap's cross-sample Gram. ``reduce`` sums the
    batch-level segment gradients (``fast``: a (K+1, n_params) matrix) or the batch sketch over
    data-parallel ranks before the Gram (``adwin.audit.combine``)."""
    n = b.input_ids.shape[0]
    if micro_batch is not None and int(micro_batch) < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    if engine not in ("batched", "row"):
        raise ValueError(f"engine must be 'batched' or 'row', got {engine!r}")
    if macro:
        args = (model, named, b, n_seg, scale, sketch_dim, seed, vector_dim, reduce)
        # a sharded audit keeps one row at a time: its rows split over ranks, so batched passes would round each rank's
        # rows differently from the one-process audit's (parity to 1e-5 failed intermittently)
        if engine == "batched" and reduce is None:
            step = persample.rows_per_pass(n, micro_batch, n_seg, [p for _, p in named], exact=sketch_dim is None)
            try:
                return _per_sample_grams(*args, persample.segment_grads, step)
            except persample.PerSampleUnsupported as e:
                log.warning("audit: per-sample gradients one row at a time (%s)", e)
        return _per_sample_grams(*args, _one_row, 1)
    mb = n if micro_batch is None else int(micro_batch)
    names = [name for name, _ in named]
    device = b.input_ids.device
    acc: list[Grads | None] = [None] * n_seg  # batch-level segment gradients (fast)
    sk_total = torch.zeros(n_seg, sketch_dim, dtype=torch.float64, device=device) if sketch_dim else None
    single = mb >= n  # one micro-batch: its gradients are the batch's, no accumulator copy
    for start in range(0, n, mb):
        rows = slice(start, min(n, start + mb))
        if sketch_dim is not None:
            sk = torch.zeros(n_seg, sketch_dim, dtype=torch.float32, device=device)
            for s, grads in _segment_grads(model, named, b, rows, n_seg, scale):
                if grads is not None:
                    countsketch(grads, names, sketch_dim, seed, sk[s])
                del grads  # before the next backward: one transient gradient at a time
            sk_total += sk.double()
            continue
        seg_grads: list[Grads | None] = [None] * n_seg
        for s, grads in _segment_grads(model, named, b, rows, n_seg, scale):
            seg_grads[s] = grads
        if single:
            acc = seg_grads
        else:
            for s, grads in enumerate(seg_grads):
                acc[s] = add_into(acc[s], grads)
        del seg_grads
    return _batch_result(acc, sk_total, named, reduce, [], [])


def _batch_result(
    acc: list[Grads | None],
    sk_total: torch.Tensor | None,
    named: list[tuple[str, torch.nn.Parameter]],
    reduce: Reduce | None,
    sample_grams: list[np.ndarray],
    vectors: list[np.ndarray],
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray | None, list[np.ndarray]]:
    """The batch Gram (summed over ranks by ``reduce``) from the segment gradients or the batch sketch."""
    if sk_total is not None:
        # the batch sketch travels as float32 (AuditResult.sketch): the Gram is that sketch's, not a finer one's
        sk_np = (sk_total if reduce is None else reduce(sk_total)).float().double().cpu().numpy()
        return sk_np @ sk_np.T, sample_grams, sk_np, vectors
    if reduce is not None:
        m = reduce(segment_matrix(acc, [p for _, p in named])).double()  # (K+1, n_params)
        return (m @ m.T).cpu().numpy(), sample_grams, None, vectors
    return _gram_of(acc), sample_grams, None, vectors


RowEngine = Callable[..., Iterator[tuple[int, Grads | None]]]


def _per_sample_grams(
    model: torch.nn.Module,
    named: list[tuple[str, torch.nn.Parameter]],
    b: Prepared,
    n_seg: int,
    scale: Callable[[int, torch.Tensor], torch.Tensor],
    sketch_dim: int | None,
    seed: int,
    vector_dim: int | None,
    reduce: Reduce | None,
    engine: RowEngine,
    step: int,
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray | None, list[np.ndarray]]:
    """``chunked_grams`` with per-sample Grams (and vectors): ``engine`` yields each segment's per-row gradients
    for up to ``step`` rows of similar length at a time (``persample.passes``). Per-sample sketches and Grams
    accumulate in float64."""
    n = b.input_ids.shape[0]
    groups = persample.passes(forwarded_lengths(b), step) if step > 1 else [[i] for i in range(n)]
    order = [i for g in groups for i in g]
    if order != list(range(n)):  # the passes' rows made contiguous; the per-sample lists are put back at the end
        b = rows_of(b, torch.tensor(order, device=b.input_ids.device))
    bounds = np.cumsum([0] + [len(g) for g in groups])
    names = [name for name, _ in named]
    device = b.input_ids.device
    hashes = {d: HashCache(seed, d) for d in (sketch_dim, vector_dim) if d is not None}
    acc: list[Grads | None] = [None] * n_seg
    sk_total = torch.zeros(n_seg, sketch_dim, dtype=torch.float64, device=device) if sketch_dim else None
    sample_grams: list[np.ndarray] = []
    vectors: list[np.ndarray] = []
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        rows = slice(int(start), int(stop))
        r = rows.stop - rows.start
        per_row = None  # (r, K+1, vector_dim): the rows' vectors
        if sketch_dim is not None:
            sk = torch.zeros(n_seg, r, sketch_dim, dtype=torch.float64, device=device)  # (K+1, r, D)
            for s, grads in engine(model, named, b, rows, n_seg, scale, verify=start == 0):
                if grads is not None:
                    countsketch_rows(grads, names, hashes[sketch_dim], sk[s])
                del grads  # before the next backward: one segment's row gradients at a time
            per_row = sk.transpose(0, 1)  # (r, K+1, D)
            grams = per_row @ per_row.transpose(1, 2)  # (r, K+1, K+1)
            sk_total += sk.sum(dim=1)
        else:
            seg_grads: list[Grads | None] = [None] * n_seg
            for s, grads in engine(model, named, b, rows, n_seg, scale, verify=start == 0):
                seg_grads[s] = grads
            grams = _row_grams(seg_grads, r, device)
            if vector_dim is not None:
                vec = torch.zeros(n_seg, r, vector_dim, dtype=torch.float64, device=device)  # (K+1, r, D)
                for s, grads in enumerate(seg_grads):
                    if grads is not None:
                        countsketch_rows(grads, names, hashes[vector_dim], vec[s])
                per_row = vec.transpose(0, 1)
            for s, grads in enumerate(seg_grads):
                summed = None if grads is None else [None if g is None else g.sum(dim=0) for g in grads]
                acc[s] = add_into(acc[s], summed)
            del seg_grads
        sample_grams.extend(grams.cpu().numpy())
        if vector_dim is not None and per_row is not None:
            vectors.extend(per_row.cpu().numpy())
    back = np.argsort(order)
    sample_grams = [sample_grams[i] for i in back]
    vectors = [vectors[i] for i in back] if vectors else vectors
    return _batch_result(acc, sk_total, named, reduce, sample_grams, vectors)


def _one_row(
    model: torch.nn.Module,
    named: list[tuple[str, torch.nn.Parameter]],
    b: Prepared,
    rows: slice,
    n_seg: int,
    scale: Callable[[int, torch.Tensor], torch.Tensor],
    verify: bool = False,
) -> Iterator[tuple[int, Grads | None]]:
    """The fallback row engine: ``_segment_grads`` of one row, each gradient (1, *shape)."""
    del verify  # autograd's own gradient: nothing to check
    for s, grads in _segment_grads(model, named, b, rows, n_seg, scale):
        yield s, None if grads is None else [None if g is None else g.unsqueeze(0) for g in grads]


def _segment_grads(
    model: torch.nn.Module,
    named: list[tuple[str, torch.nn.Parameter]],
    b: Prepared,
    rows: slice,
    n_seg: int,
    scale: Callable[[int, torch.Tensor], torch.Tensor],
) -> Iterator[tuple[int, Grads | None]]:
    """Yield ``(s, gradient of segment s)`` summed over the rows, in segment order; None for an empty segment.

    One backward per segment through ``chunked_forward``'s graph, which walks only that segment's prefix."""
    params = [p for _, p in named]
    seg_losses = chunked_forward(model, b, rows, n_seg)
    live = [s for s in range(n_seg) if seg_losses[s] is not None]
    for s in range(n_seg):
        if seg_losses[s] is None:
            yield s, None
            continue
        grads: Grads = list(
            torch.autograd.grad(seg_losses[s], params, retain_graph=s != live[-1], allow_unused=True)
        )
        seg_losses[s] = None
        for i, g in enumerate(grads):  # replace one parameter at a time: never two full copies
            grads[i] = None if g is None else scale(i, g)
        g = None  # drop the loop reference to the last raw gradient
        yield s, grads
        del grads  # the caller owns it now; holding it here would double the sketch's transient memory


def _gram_of(seg_grads: Sequence[Grads | None]) -> np.ndarray:
    """(K+1, K+1) float64 Gram, built one parameter at a time (transient memory: one parameter x K+1)."""
    n_seg = len(seg_grads)
    gram = np.zeros((n_seg, n_seg))
    live = [s for s in range(n_seg) if seg_grads[s] is not None]
    if not live:
        return gram
    n_params = len(seg_grads[live[0]])  # type: ignore[arg-type]
    for i in range(n_params):
        rows = [(s, seg_grads[s][i]) for s in live if seg_grads[s][i] is not None]  # type: ignore[index]
        if not rows:
            continue
        m = torch.stack([g.reshape(-1).float() for _, g in rows])  # (k, n_i)
        sub = (m @ m.T).double().cpu().numpy()
        idx = [s for s, _ in rows]
        gram[np.ix_(idx, idx)] += sub
    return gram


def _row_grams(seg_grads: Sequence[Grads | None], rows: int, device: torch.device) -> torch.Tensor:
    """(rows, K+1, K+1) float64 per-row Grams of per-row segment gradients (each parameter's (rows, *shape)),
    one parameter at a time."""
    n_seg = len(seg_grads)
    gram = torch.zeros(rows, n_seg, n_seg, dtype=torch.float64, device=device)
    live = [s for s in range(n_seg) if seg_grads[s] is not None]
    n_params = len(seg_grads[live[0]]) if live else 0  # type: ignore[arg-type]
    for i in range(n_params):
        parts = [(s, seg_grads[s][i]) for s in live if seg_grads[s][i] is not None]  # type: ignore[index]
        if not parts:
            continue
        m = torch.stack([g.reshape(rows, -1).double() for _, g in parts], dim=1)  # (rows, k, n_i)
        idx = torch.tensor([s for s, _ in parts], device=gram.device)
        gram[:, idx[:, None], idx[None, :]] += m @ m.transpose(1, 2)
    return gram
