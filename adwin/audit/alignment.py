"""The prefix-full alignment audit (ADWIN section 4.2).

Math layer: imports nothing from the controller, probes or application modules.
The segment-gradient engines (reference and causal chunked, Gram and sketch) live in
``adwin.audit.grams``; this module validates the inputs and turns Gram matrices into cosines.

Segments: candidates ``c_1 < ... < c_K`` split response positions into ``K + 1`` segments
``[0, c_1), [c_1, c_2), ..., [c_{K-1}, c_K), [c_K, inf)``. ``g_s`` is the gradient of the summed
per-token loss over segment ``s`` (summed over samples: batch level). The prefix gradient of window
``c_k`` is ``g_0 + ... + g_{k-1}``; the full gradient is the sum of all segments. Everything follows
from the Gram matrix ``G[s, s'] = <g_s, g_s'>``.
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from adwin.audit.combine import Combiner, gather_concat, summed_counts
from adwin.audit.errors import NonFiniteAuditError
from adwin.audit.estimators import (
    ESTIMATORS,
    cosine_array,
    cosine_interval,
    cross_gram,
    debiased_cosines,
)
from adwin.audit.evidence import signal_measures
from adwin.audit.grams import (
    TokenLoss,
    canonical_name,
    chunked_grams,
    metric_scaler,
    prepare,
    reference_grams,
)
from adwin.audit.params import audited_parameters
from adwin.audit.sketch import Grads, countsketch, countsketch_hashes  # noqa: F401  (countsketch_hashes: public API)
from adwin.audit.truth import noise_floor
from adwin.objectives import precision
from adwin.objectives.losses import response_positions, reverse_kl_pg, token_logprobs  # noqa: F401  (last two: kept importable here)


@dataclass
class ProbeBatch:
    """A batch of completed probes, all tensors (B, L) and aligned with ``input_ids``."""

    input_ids: torch.Tensor  # (B, L) long
    attention_mask: torch.Tensor  # (B, L) 0/1
    response_mask: torch.Tensor  # (B, L) 0/1, 1 on response tokens
    teacher_logprobs: torch.Tensor  # (B, L) log q of the realized token, 0 off the response
    behavior_logprobs: torch.Tensor | None = None  # (B, L) log p_behavior at extension time
    versions: torch.Tensor | None = None  # (B, L) student version that produced each token, -1 off response

    def __post_init__(self) -> None:
        shape = tuple(self.input_ids.shape)
        if len(shape) != 2:
            raise ValueError(f"input_ids must be (B, L), got shape {shape}")
        for name in ("attention_mask", "response_mask", "teacher_logprobs", "behavior_logprobs", "versions"):
            t = getattr(self, name)
            if t is not None and tuple(t.shape) != shape:
                raise ValueError(f"{name} must have shape {shape} like input_ids, got {tuple(t.shape)}")


@dataclass
class AuditResult:
    """What one audit measured. ``gram`` is (K+1, K+1) over segments; cosines are keyed by candidate."""

    candidates: list[int]
    cosines: dict[int, float]
    macro_cosines: dict[int, float] = field(default_factory=dict)
    gram: np.ndarray | None = None  # (K+1, K+1) float64
    grad_norms: dict[int, float] = field(
        default_factory=dict
    )  # norm of each prefix gradient, and "full" as max_len key
    tokens_per_segment: list[int] = field(default_factory=list)
    method: str = "fast"
    metric: str = "identity"
    elapsed_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
    sketch: np.ndarray | None = None  # (K+1, sketch_dim) float32 segment sketches (method "sketch")
    estimator: str = "batch"  # which estimator gave ``cosines`` (adwin.audit.estimators)
    params: str = "all"  # which parameters were differentiated (adwin.audit.params)
    batch_cosines: dict[int, float] = field(default_factory=dict)  # batch cosines when estimator != batch
    cosine_ci: dict[int, tuple[float, float]] = field(default_factory=dict)  # interval per candidate
    # what the estimator reads per candidate when the samples share no signal (adwin.audit.truth.noise_floor;
    # 0 for debiased); from per-sample Grams, so only when the audit computed them
    noise_floor: dict[int, float] = field(default_factory=dict)
    # (P, K+1, D) per-sample segment sketches when the audit computed them (audit.ci_level): what a later decision
    # pools (adwin.audit.evidence); never serialized
    vectors: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self, *, include_sketch: bool = False) -> dict[str, Any]:
        """JSON-able dict. The sketch (large) is left out unless ``include_sketch``; then it travels as
        ``{"shape": [K+1, D], "dtype": "float32", "b64": <little-endian bytes, base64>}``."""
        out = {
            "candidates": list(self.candidates),
            "cosines": {str(k): v for k, v in self.cosines.items()},
            "macro_cosines": {str(k): v for k, v in self.macro_cosines.items()},
            "gram": None if self.gram is None else np.asarray(self.gram, dtype=float).tolist(),
            "grad_norms": {str(k): v for k, v in self.grad_norms.items()},
            "tokens_per_segment": list(self.tokens_per_segment),
            "method": self.method,
            "metric": self.metric,
            "elapsed_s": self.elapsed_s,
            "extra": dict(self.extra),
            "estimator": self.estimator,
            "params": self.params,
            "batch_cosines": {str(k): v for k, v in self.batch_cosines.items()},
            "cosine_ci": {str(k): [lo, hi] for k, (lo, hi) in self.cosine_ci.items()},
            "noise_floor": {str(k): v for k, v in self.noise_floor.items()},
        }
        if include_sketch and self.sketch is not None:
            arr = np.ascontiguousarray(self.sketch, dtype="<f4")
            out["sketch"] = {
                "shape": list(arr.shape),
                "dtype": "float32",
                "b64": base64.b64encode(arr.tobytes()).decode("ascii"),
            }
        return out

    def metrics(self) -> dict[str, float]:
        """Step metrics of this audit: the interval ends per candidate, the batch cosines when another
        estimator decided, and the debiased estimator's fallbacks."""
        m = {f"audit/cos_ci_{end}_{c}": v for c, ci in self.cosine_ci.items()
             for end, v in zip(("low", "high"), ci, strict=True)}
        m |= {f"audit/batch_cos_{c}": v for c, v in self.batch_cosines.items()}
        m |= {f"audit/noise_cos_{c}": v for c, v in self.noise_floor.items()}
        for k, key in (("signal_z", "audit/signal_z"), ("evidence_samples", "audit/evidence_samples"),
                       ("evidence_audits", "audit/evidence_audits"), ("noise_scale", "audit/noise_scale"),
                       ("effective_dim", "audit/effective_dim")):
            if k in self.extra:
                m[key] = self.extra[k]
        if "debiased_fallbacks" in self.extra:
            m["audit/debiased_fallbacks"] = self.extra["debiased_fallbacks"]
        return m

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AuditResult:
        return cls(
            candidates=[int(c) for c in d["candidates"]],
            cosines={int(k): float(v) for k, v in d["cosines"].items()},
            macro_cosines={int(k): float(v) for k, v in d.get("macro_cosines", {}).items()},
            gram=None if d.get("gram") is None else np.asarray(d["gram"], dtype=np.float64),
            grad_norms={int(k): float(v) for k, v in d.get("grad_norms", {}).items()},
            tokens_per_segment=[int(t) for t in d.get("tokens_per_segment", [])],
            method=str(d.get("method", "fast")),
            metric=str(d.get("metric", "identity")),
            elapsed_s=float(d.get("elapsed_s", 0.0)),
            extra={str(k): float(v) for k, v in d.get("extra", {}).items()},
            sketch=_decode_sketch(d.get("sketch")),
            estimator=str(d.get("estimator", "batch")),
            params=str(d.get("params", "all")),
            batch_cosines={int(k): float(v) for k, v in d.get("batch_cosines", {}).items()},
            cosine_ci={int(k): (float(v[0]), float(v[1])) for k, v in d.get("cosine_ci", {}).items()},
            noise_floor={int(k): float(v) for k, v in d.get("noise_floor", {}).items()},
        )


def _decode_sketch(raw: Mapping[str, Any] | None) -> np.ndarray | None:
    if raw is None:
        return None
    if raw.get("dtype", "float32") != "float32":
        raise ValueError(f"sketch dtype must be float32, got {raw.get('dtype')!r}")
    shape = tuple(int(x) for x in raw["shape"])
    arr = np.frombuffer(base64.b64decode(raw["b64"]), dtype="<f4")
    if arr.size != math.prod(shape):
        raise ValueError(f"sketch has {arr.size} values, shape {shape} needs {math.prod(shape)}")
    return arr.reshape(shape).astype(np.float32)


def cosines_from_gram(
    gram: np.ndarray | Sequence[Sequence[float]], candidates: Sequence[int]
) -> dict[int, float]:
    """Cosine of each candidate prefix gradient with the full gradient, from the segment Gram matrix.

    gram: (K+1, K+1). With ``P_k = 1[s < k]`` and ``F = 1``: ``<g_w, g_full> = P^T G F``,
    ``|g_w|^2 = P^T G P``, ``|g_full|^2 = F^T G F``. A zero-norm prefix gives cosine 0.
    """
    g = np.asarray(gram, dtype=np.float64)
    k = len(candidates)
    if g.shape != (k + 1, k + 1):
        raise ValueError(f"gram must be ({k + 1}, {k + 1}) for {k} candidates, got {g.shape}")
    if not np.all(np.isfinite(g)):
        raise NonFiniteAuditError("gram has non-finite entries")
    cos, _ = cosine_array(g, k)
    return {int(c): float(cos[i]) for i, c in enumerate(candidates)}


def gram_from_sketches(sketches: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """Sum per-rank sketches (each (K+1, D)) and return the (K+1, K+1) Gram of the summed sketch.

    Sketches are linear in the gradient, so the sum of the ranks' sketches is the sketch of the
    whole batch's segment gradients.
    """
    arr = np.asarray(sketches, dtype=np.float64)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3:
        raise ValueError(f"sketches must be (ranks, K+1, D) or (K+1, D), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise NonFiniteAuditError("sketches have non-finite entries")
    total = arr.sum(axis=0)  # (K+1, D)
    return total @ total.T


# ---------------------------------------------------------------------------------------------
# The audit itself: segment gradients under the model's current parameters.
# ---------------------------------------------------------------------------------------------

AUDIT_METHODS: tuple[str, ...] = ("reference", "fast", "sketch")
AUDIT_METRICS: tuple[str, ...] = ("identity", "adam")
DEFAULT_SKETCH_DIM = 16384


def audit(
    model: torch.nn.Module,
    batch: ProbeBatch,
    candidates: Sequence[int],
    *,
    loss: str | TokenLoss = "reverse_kl_pg",
    method: str = "fast",
    metric: str = "identity",
    optimizer: torch.optim.Optimizer | None = None,
    sketch_dim: int | None = None,
    seed: int = 0,
    macro: bool = True,
    token_weights: torch.Tensor | None = None,
    micro_batch: int | None = None,
    params: str = "all",
    estimator: str = "batch",
    ci_level: float | None = None,
    ci_samples: int = 200,
    autocast: str = "off",
    combine: Combiner | None = None,
) -> AuditResult:
    """Cosine of each candidate prefix gradient with the full-rollout gradient (ADWIN section 4.2).

    The per-token loss is ``reverse_kl_pg`` (advantage ``log q - log p_theta`` is a constant, so a
    segment's gradient is ``-sum_t A_t grad log p_theta(y_t)``) times ``token_weights`` (B, L) when
    given, the hook for importance weights. Segment losses are sums over tokens and samples.

    Methods (all three give the same segment Gram; ``sketch`` up to its sketch error):

    - ``reference``: one full forward, one ``autograd.grad`` per segment over the whole batch,
      flattened float64 gradients, Gram = M M^T. Plain and slow; for tests.
    - ``fast``: exact. Relies on causality: the loss on columns ``< e`` depends only on tokens
      ``< e``. The forward runs in column chunks that end at the segment boundaries, each chunk
      attending to the previous ones through a differentiable KV cache, so the autograd graph of
      segment ``s`` contains only chunks ``<= s``. One forward, then one backward per segment that
      walks only that prefix of the graph: cost ``fwd + sum_s bwd(prefix_s)``, i.e. about
      ``1 + (2/3) sum_k (p + c_k)/(p + L)`` plain forward+backward passes (no recomputed forward,
      unlike re-running truncated batches). Trailing columns with no response token are never
      forwarded. Memory: the graph of one forward (as a plain pass) plus ``K + 1`` gradient copies
      (the segment gradients, kept for the Gram) and, with ``macro``, ``K + 1`` more (per-sample
      segment gradients while the batch-level ones accumulate).
    - ``sketch``: each segment gradient goes through a seeded CountSketch of dimension
      ``sketch_dim`` (hash and sign per parameter element from ``seed`` and the parameter name,
      computed on the fly, never a D x n matrix) and is dropped: extra memory ``(K+1) x sketch_dim``
      floats (twice with ``macro``) plus one transient gradient. ``result.sketch`` holds the
      (K+1, sketch_dim) batch sketch; sketches of shards of a batch add up to the sketch of the batch.

    ``metric="adam"`` weights inner products by ``1 / (sqrt(v_hat) + eps)`` from the AdamW
    ``optimizer``'s second moment (bias-corrected as AdamW does, ``max_exp_avg_sq`` with amsgrad):
    ADWIN eq. 10 with a diagonal Fisher proxy. Gradients are scaled by the square root of that weight
    before any inner product or sketch. Parameters without optimizer state yet get weight 1 (the
    identity metric; Adam's preconditioner is undefined before its first step).

    ``params`` (``all`` | ``top:N``, ``adwin.audit.params``) restricts the gradients to the last N blocks
    and the head, so each segment's backward stops early. ``estimator`` (``batch`` | ``debiased``,
    ``adwin.audit.estimators``) picks the cosine: ``debiased`` drops the same-sample terms of the Gram and
    needs per-sample gradients (as ``macro``); ``batch_cosines`` then keeps the
    batch ones. ``ci_level`` (e.g. 0.9) adds ``cosine_ci``, an interval per candidate over the probe samples
    (``adwin.audit.estimators.cosine_interval``: the U-statistic interval for ``debiased``, a bootstrap of
    ``ci_samples`` resamples for ``batch``), from per-sample segment vectors (exact for ``reference``,
    CountSketches of ``sketch_dim`` for ``fast``/``sketch``; also per sample).

    ``macro`` adds per-sample cosines (mean over samples; samples whose prefix gradient is zero are
    left out, a candidate with no such sample is absent). ``micro_batch`` bounds the rows per forward/backward
    (None: the whole batch; the trainer passes ``optim.micro_batch_size``); per-sample gradients (``macro``,
    ``debiased``, ``ci_level``) of ``fast``/``sketch`` take that many rows per backward (``adwin.audit.persample``,
    one row at a time for a model it refuses), fewer where their gradients would not fit. ``autocast`` (``off`` | ``bf16``, ``model.autocast``) runs the forwards
    under bf16 autocast (``adwin.objectives.precision``). Gradients are taken in eval mode (no dropout) under the current parameters; the model's
    mode is restored and no parameter's ``.grad`` is touched.

    ``combine`` (a data-parallel process group, ``adwin.audit.combine``): every rank passes the whole probe
    batch, differentiates only its contiguous shard of rows, and the segment gradients (``fast``,
    ``reference``) or sketches (``sketch``) are summed across ranks before the Gram; per-sample statistics
    are gathered. Every rank returns the 1-process result (up to float summation order).

    Assumes a decoder-only (causal) model that accepts a KV cache (HF ``DynamicCache``, ``adwin.decode.kv_cache``);
    encoder-decoder models are rejected. Position ids come from the attention mask
    (``cumsum - 1``), which equals ``arange`` for right-padded batches.
    """
    t0 = time.perf_counter()
    cands = _check_candidates(candidates)
    if method not in AUDIT_METHODS:
        raise ValueError(f"method must be one of {AUDIT_METHODS}, got {method!r}")
    if metric not in AUDIT_METRICS:
        raise ValueError(f"metric must be one of {AUDIT_METRICS}, got {metric!r}")
    if metric == "adam" and optimizer is None:
        raise ValueError("metric='adam' needs the AdamW optimizer whose second moment weights the metric")
    if not (isinstance(loss, str) and loss == "reverse_kl_pg") and not callable(loss):
        raise ValueError(f"loss must be 'reverse_kl_pg' or a callable, got {loss!r}")
    if method == "sketch":
        sketch_dim = DEFAULT_SKETCH_DIM if sketch_dim is None else int(sketch_dim)
        if sketch_dim < 1:
            raise ValueError(f"sketch_dim must be >= 1, got {sketch_dim}")
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise ValueError("audit needs a decoder-only (causal) model; got an encoder-decoder")
    if estimator not in ESTIMATORS:
        raise ValueError(f"audit.estimator must be one of {ESTIMATORS}, got {estimator!r}")
    per_sample = macro or estimator == "debiased" or ci_level is not None  # per-row gradients (adwin.audit.persample)
    vector_dim = (DEFAULT_SKETCH_DIM if sketch_dim is None else int(sketch_dim)) if ci_level is not None else None

    n_samples = int(batch.input_ids.shape[0])
    if combine is not None:
        if n_samples < combine.world:
            raise ValueError(f"a probe batch of {n_samples} cannot be split over {combine.world} ranks "
                             f"(probes.batch_size must be at least the world size)")
        rows = combine.shard(n_samples)
        batch = _rows_of(batch, rows)
        token_weights = None if token_weights is None else token_weights[rows]
    reduce = None if combine is None else combine.all_sum

    named = [(canonical_name(n), p) for n, p in audited_parameters(model, params)]
    if not named:
        raise ValueError("model has no parameters that require grad")
    device = named[0][1].device
    b = prepare(batch, token_weights, cands, device)
    b.loss = loss
    scale = metric_scaler([p for _, p in named], metric, optimizer)

    was_training = model.training
    model.eval()  # also keeps HF activation checkpointing (model.gradient_checkpointing) off: it drops the KV cache
    try:
        with torch.enable_grad(), precision.autocast(autocast, device):
            if method == "reference":
                gram, sample_grams, vectors = reference_grams(
                    model, named, b, len(cands) + 1, scale, per_sample, vector_dim is not None, reduce
                )
                sketch = None
            else:
                gram, sample_grams, sketch, vectors = chunked_grams(
                    model,
                    named,
                    b,
                    len(cands) + 1,
                    scale,
                    per_sample,
                    micro_batch,
                    sketch_dim if method == "sketch" else None,
                    seed,
                    vector_dim,
                    reduce,
                )
    finally:
        model.train(was_training)
    max_len = int(b.response_mask.sum(dim=1).max().item())
    if combine is not None:  # the shard's Gram is already the batch's; the rest is per sample or counts
        sample_grams, vectors = gather_concat(combine, sample_grams), gather_concat(combine, vectors)
        b.tokens_per_segment = summed_counts(combine, b.tokens_per_segment)
        max_len = int(combine.all_max(float(max_len)))

    batch_cos = cosines_from_gram(gram, cands)
    cos, fallbacks = debiased_cosines(gram, sample_grams, cands) if estimator == "debiased" else (batch_cos, 0)
    stacked = np.stack(vectors) if vectors else None  # (P, K+1, D)
    h = cross_gram(stacked) if ci_level is not None else None  # (P, K+1, P, K+1)
    ci = (
        cosine_interval(h, cands, cos, estimator=estimator, level=ci_level, n_boot=ci_samples, seed=seed)
        if h is not None
        else {}
    )
    floor = (noise_floor(sample_grams, len(cands)) if estimator == "batch" else np.zeros(len(cands))) \
        if sample_grams else None
    evidence = signal_measures(h) if h is not None else {}
    macro_cos = _macro_cosines(sample_grams, cands) if macro else {}
    norms = _prefix_norms(gram, cands)
    norms[max_len] = math.sqrt(max(float(gram.sum()), 0.0))  # the full gradient
    return AuditResult(
        candidates=cands,
        cosines=cos,
        macro_cosines=macro_cos,
        gram=gram,
        grad_norms=norms,
        tokens_per_segment=b.tokens_per_segment,
        method=method,
        metric=metric,
        elapsed_s=time.perf_counter() - t0,
        extra={"samples": float(n_samples), "max_response_len": float(max_len)}
        | ({"debiased_fallbacks": float(fallbacks)} if estimator == "debiased" else {}) | evidence,
        sketch=None if sketch is None else sketch.astype(np.float32),
        estimator=estimator,
        params=params,
        batch_cosines=batch_cos if estimator != "batch" else {},
        cosine_ci=ci,
        noise_floor={} if floor is None else {c: float(v) for c, v in zip(cands, floor, strict=True)},
        vectors=None if stacked is None else stacked.astype(np.float32),
    )


def _rows_of(batch: ProbeBatch, rows: slice) -> ProbeBatch:
    """The probe batch's rows ``rows`` (same columns)."""
    return ProbeBatch(*(None if t is None else t[rows] for t in (
        batch.input_ids, batch.attention_mask, batch.response_mask, batch.teacher_logprobs,
        batch.behavior_logprobs, batch.versions)))


def _check_candidates(candidates: Sequence[int]) -> list[int]:
    raw = list(candidates)
    if not raw:
        raise ValueError("candidates must not be empty")
    if any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1 for c in raw):
        raise ValueError(f"candidates must be integers >= 1, got {raw!r}")
    cands = [int(c) for c in raw]
    if any(b <= a for a, b in zip(cands, cands[1:], strict=False)):
        raise ValueError(f"candidates must be strictly increasing, got {cands}")
    return cands


def _prefix_norms(gram: np.ndarray, cands: list[int]) -> dict[int, float]:
    out: dict[int, float] = {}
    for i, c in enumerate(cands):
        out[c] = math.sqrt(max(float(gram[: i + 1, : i + 1].sum()), 0.0))
    return out


def _macro_cosines(sample_grams: list[np.ndarray], cands: list[int]) -> dict[int, float]:
    """Mean over samples of per-sample cosines; a sample whose prefix gradient is zero is left out."""
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for g in sample_grams:
        cos = cosines_from_gram(g, cands)
        for i, c in enumerate(cands):
            if float(g[: i + 1, : i + 1].sum()) > 0.0:
                sums[c] = sums.get(c, 0.0) + cos[c]
                counts[c] = counts.get(c, 0) + 1
    return {c: sums[c] / counts[c] for c in cands if counts.get(c)}
