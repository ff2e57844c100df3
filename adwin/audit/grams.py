"""Segment gradients and their Gram matrix: the engines behind ``adwin.audit.alignment.audit``.

Math layer: imports nothing from the controller, probes or application modules. Internal to the audit:
``adwin.audit.alignment`` validates the inputs, builds ``Prepared`` and turns the Gram into cosines.

Both engines return the (K+1, K+1) float64 Gram ``G[s, s'] = <g_s, g_s'>`` of the segment gradients
(batch level) and, with ``macro``, one Gram per sample: ``reference_grams`` from flattened float64
gradients (tests), ``chunked_grams`` through the causal chunked forward (methods ``fast`` and
``sketch``). Gradients are scaled by the square root of the metric weight (``metric_scaler``) first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from adwin.audit.combine import segment_matrix
from adwin.audit.sketch import Grads, countsketch
from adwin.decode.kv_cache import with_cache
from adwin.objectives.losses import response_positions, reverse_kl_pg, token_logprobs

# Per-token loss: (student_logprobs, teacher_logprobs, mask) -> (B, L) per-token losses.
TokenLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# Sum over data-parallel ranks (in place, returned); ``adwin.audit.combine``.
Reduce = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Prepared:
    input_ids: torch.Tensor  # (B, L)
    attention_mask: torch.Tensor  # (B, L) long
    position_ids: torch.Tensor  # (B, L)
    response_mask: torch.Tensor  # (B, L) float
    teacher_logprobs: torch.Tensor  # (B, L) float
    token_weights: torch.Tensor | None  # (B, L) float
    segment: torch.Tensor  # (B, L) long: segment of each response token, -1 elsewhere
    tokens_per_segment: list[int]
    loss: str | TokenLoss = "reverse_kl_pg"


def prepare(batch: Any, token_weights: torch.Tensor | None, cands: list[int], device: torch.device) -> Prepared:
    """A ``ProbeBatch`` on ``device`` with each response token's segment (candidate boundaries ``cands``)."""
    shape = tuple(batch.input_ids.shape)
    if token_weights is not None and tuple(token_weights.shape) != shape:
        raise ValueError(f"token_weights must have shape {shape}, got {tuple(token_weights.shape)}")
    am = batch.attention_mask.to(device).long()
    rm = batch.response_mask.to(device).float()
    if bool((rm[:, 0] > 0).any()):
        raise ValueError("response_mask is 1 at column 0, which no logit predicts")
    if bool(((rm > 0) & (am == 0)).any()):
        raise ValueError("response_mask is 1 on a position the attention mask excludes")
    pos = response_positions(rm)  # (B, L), -1 off the response
    bounds = torch.tensor(cands, device=device)
    seg = torch.where(pos >= 0, torch.bucketize(pos, bounds, right=True), torch.full_like(pos, -1))  # (B, L)
    counts = torch.bincount(seg[seg >= 0], minlength=len(cands) + 1).tolist()
    return Prepared(
        input_ids=batch.input_ids.to(device),
        attention_mask=am,
        position_ids=(am.cumsum(dim=1) - 1).clamp_min(0),
        response_mask=rm,
        teacher_logprobs=batch.teacher_logprobs.to(device).float(),
        token_weights=None if token_weights is None else token_weights.to(device).float(),
        segment=seg,
        tokens_per_segment=[int(c) for c in counts],
    )


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


def _per_token_loss(
    logp: torch.Tensor,
    teacher: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor | None,
    loss: str | TokenLoss,
) -> torch.Tensor:
    per = loss(logp, teacher, mask) if callable(loss) else reverse_kl_pg(logp, teacher, mask)  # (B, n)
    return per if weights is None else per * weights


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
    per = _per_token_loss(logp, b.teacher_logprobs, b.response_mask, b.token_weights, b.loss)  # (B, L)

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
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray | None, list[np.ndarray]]:
    """``fast`` (sketch_dim None) and ``sketch``: micro-batches through the causal chunked graph.

    ``micro_batch``: at most this many rows per forward/backward (None: the whole batch); ``macro``
    (per-sample Grams) always runs one row at a time, which is within any bound.

    With ``vector_dim`` (needs ``macro``) also each sample's (K+1, vector_dim) CountSketch of its segment
    gradients (the sketch itself for ``sketch``), for the bootstrap's cross-sample Gram. ``reduce`` sums the
    batch-level segment gradients (``fast``: a (K+1, n_params) matrix) or the batch sketch over
    data-parallel ranks before the Gram (``adwin.audit.combine``)."""
    n = b.input_ids.shape[0]
    if micro_batch is not None and int(micro_batch) < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    # micro_batch bounds the rows per forward/backward; per-sample gradients (macro) take one row at a time
    mb = 1 if macro else (n if micro_batch is None else int(micro_batch))
    names = [name for name, _ in named]
    device = b.input_ids.device
    acc: list[Grads | None] = [None] * n_seg  # batch-level segment gradients (fast)
    sk_total = torch.zeros(n_seg, sketch_dim, dtype=torch.float64, device=device) if sketch_dim else None
    sample_grams: list[np.ndarray] = []
    vectors: list[np.ndarray] = []
    single = mb >= n  # one micro-batch: its gradients are the batch's, no accumulator copy
    for start in range(0, n, mb):
        rows = slice(start, min(n, start + mb))
        if sketch_dim is not None:
            sk = torch.zeros(n_seg, sketch_dim, dtype=torch.float32, device=device)
            for s, grads in _segment_grads(model, named, b, rows, n_seg, scale):
                if grads is not None:
                    countsketch(grads, names, sketch_dim, seed, sk[s])
                del grads  # before the next backward: one transient gradient at a time
            sk64 = sk.double()
            if macro:
                sample_grams.append((sk64 @ sk64.T).cpu().numpy())
            if vector_dim is not None:
                vectors.append(sk.cpu().numpy())
            sk_total += sk64
            continue
        seg_grads: list[Grads | None] = [None] * n_seg
        for s, grads in _segment_grads(model, named, b, rows, n_seg, scale):
            seg_grads[s] = grads
        if macro:
            sample_grams.append(_gram_of(seg_grads))
        if vector_dim is not None:
            vec = torch.zeros(n_seg, vector_dim, dtype=torch.float32, device=device)  # (K+1, D)
            for s, grads in enumerate(seg_grads):
                if grads is not None:
                    countsketch(grads, names, vector_dim, seed, vec[s])
            vectors.append(vec.cpu().numpy())
        if single:
            acc = seg_grads
        else:
            for s, grads in enumerate(seg_grads):
                acc[s] = _add_into(acc[s], grads)
        del seg_grads
    if sk_total is not None:
        sk_np = (sk_total if reduce is None else reduce(sk_total)).cpu().numpy()
        return sk_np @ sk_np.T, sample_grams, sk_np, vectors
    if reduce is not None:
        m = reduce(segment_matrix(acc, [p for _, p in named])).double()  # (K+1, n_params)
        return (m @ m.T).cpu().numpy(), sample_grams, None, vectors
    return _gram_of(acc), sample_grams, None, vectors


def _segment_grads(
    model: torch.nn.Module,
    named: list[tuple[str, torch.nn.Parameter]],
    b: Prepared,
    rows: slice,
    n_seg: int,
    scale: Callable[[int, torch.Tensor], torch.Tensor],
) -> Iterator[tuple[int, Grads | None]]:
    """Yield ``(s, gradient of segment s)`` for the rows, in segment order; None for an empty segment.

    Chunk ``s`` of the forward covers the input columns needed by segment ``s`` and not by earlier
    ones. A token at column ``i`` is predicted by the logits at ``i - 1``, so segment ``s`` needs input
    columns ``< end_s`` where ``end_s`` is the largest column of a token in segments ``<= s``.
    """
    from transformers import DynamicCache  # heavy; only the causal engine needs it

    params = [p for _, p in named]
    seg = b.segment[rows]  # (b, L)
    ids = b.input_ids[rows]
    ends: list[int] = []
    last = 0
    for s in range(n_seg):
        cols = torch.nonzero((seg == s).any(dim=0)).flatten()
        last = max(last, int(cols.max().item()) if cols.numel() else 0)
        ends.append(last)
    cache = DynamicCache(config=getattr(model, "config", None))
    seg_losses: list[torch.Tensor | None] = [None] * n_seg
    begin = 0
    for s in range(n_seg):
        end = ends[s]
        if end <= begin:
            continue  # nothing new to forward for this segment
        out = model(
            input_ids=ids[:, begin:end],
            attention_mask=b.attention_mask[rows, :end],
            position_ids=b.position_ids[rows, begin:end],
            **with_cache(model, cache),
            use_cache=True,
        )
        logp = torch.log_softmax(out.logits.float(), dim=-1)  # (b, n, V)
        logp = logp.gather(-1, ids[:, begin + 1 : end + 1, None]).squeeze(-1)  # (b, n): columns begin+1..end
        cols = slice(begin + 1, end + 1)
        weights = None if b.token_weights is None else b.token_weights[rows, cols]
        per = _per_token_loss(
            logp, b.teacher_logprobs[rows, cols], b.response_mask[rows, cols], weights, b.loss
        )
        chunk_seg = seg[:, cols]
        for t in range(s, n_seg):  # tokens of later segments can sit in this chunk (shorter prompts)
            hit = chunk_seg == t
            if bool(hit.any()):
                part = (per * hit).sum()
                seg_losses[t] = part if seg_losses[t] is None else seg_losses[t] + part
        begin = end
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


def _add_into(acc: Grads | None, grads: Grads | None) -> Grads | None:
    if grads is None:
        return acc
    if acc is None:
        return list(grads)
    for i, g in enumerate(grads):
        if g is not None:
            acc[i] = g if acc[i] is None else acc[i].add_(g)
    return acc


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
