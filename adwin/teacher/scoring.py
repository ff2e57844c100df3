"""Teacher scoring: the one place a teacher model's forward pass runs and its scores are read.

Every scorer goes through here: the in-process teachers (``adwin.teacher.local.Teachers``), the trainer adapters'
scorers (the generic client's ``teacher_scorer``, AsyncOPD's teacher stage, TRL's top-k) and, for the scores a
vLLM engine or a teacher server lists, the layout into tensors (``listed_scores``). Two rules hold on every path
that reads a teacher's logits:

- **The student's columns.** A teacher padded wider than the student (Qwen2.5-7B's 152,064 output rows against
  1.5B's 151,936) is read on the student's ``vocab`` columns only: the rest lie past the shared tokenizer
  (``adwin.teacher.checkpoints.check_tokenizers``), so realized-token logprobs, top-k and dense logits are all
  normalised over the support the student's losses compare.
- **No B x L x V log-softmax on the host.** The logits stay on the teacher's device in the model's dtype; the
  float32 log-softmax, the realized tokens' gather and rank, the top-k and the MC actions' gather run there a chunk
  of positions at a time (at most ``CHUNK_ELEMENTS`` floats per chunk), and only (B, L) and (B, L, k) results
  reach the host.

Positions follow ``adwin.objectives.logprobs``: the token at ``input_ids[b, i]`` is predicted by the logits at
``i - 1``; every result is aligned with ``input_ids`` and position 0 (no predictor) holds logprob 0, top-k id 0
with logprob ``-inf`` (an unfilled slot, which ``forward_kl_topk`` counts as q = 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adwin.objectives.logprobs import upcast

CHUNK_ELEMENTS = 1 << 25  # float32 elements of one chunk's log-softmax (128 MiB): bounds the device's extra memory


class ScoringInputError(ValueError):
    """A scoring call whose arguments cannot describe one batch of rows (shapes, ``k``, ``chunk``)."""


@dataclass
class ScoredTokens:
    """A batch's teacher scores, aligned with its ``input_ids`` (B, L), on the host."""

    realized: torch.Tensor  # (B, L) float32: log q(input_ids[b, i] | input_ids[b, :i]); 0 at position 0
    topk_ids: torch.Tensor | None = None  # (B, L, k) long, by rank
    topk_logprobs: torch.Tensor | None = None  # (B, L, k) float32; -inf in unfilled slots
    action_logprobs: torch.Tensor | None = None  # (B, L, m) float32: log q of each cached MC action
    ranks: torch.Tensor | None = None  # (B, L) long: 1 + the columns scoring above the realized token; 0 at position 0


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) positions counted over each row's real tokens, so left- and right-padded rows score alike."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp_min(0)


def teacher_logits(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                   vocab: int | None = None, temperature: float = 1.0) -> torch.Tensor:
    """The teacher's forward pass: (B, L) rows -> logits (B, L, V) on the model's device, in its dtype.

    ``vocab``: the student's output width; a wider teacher is read on those columns only (module docstring).
    ``temperature``: the logits are divided by it (TRL's ``temperature``; 1 everywhere else). Call it under
    ``torch.no_grad()``: ``score_rows`` and the scorers do."""
    if temperature <= 0 or not math.isfinite(temperature):
        raise ScoringInputError(f"temperature must be a positive finite number, got {temperature}")
    device = next(model.parameters()).device
    ids, am = input_ids.to(device), attention_mask.to(device)  # (B, L)
    logits = model(input_ids=ids, attention_mask=am, position_ids=position_ids(am)).logits  # (B, L, V_teacher)
    if vocab is not None:
        if vocab > logits.shape[-1]:
            raise ScoringInputError(f"the student's vocabulary ({vocab}) is wider than the teacher's output "
                                    f"({logits.shape[-1]} columns)")
        logits = logits[..., :vocab]
    return logits / temperature if temperature != 1.0 else logits


def chunk_positions(rows: int, vocab: int, chunk: int | None) -> int:
    """Positions per chunk: ``chunk`` when given, else as many as keep one chunk within ``CHUNK_ELEMENTS``."""
    if chunk is not None:
        if chunk < 1:
            raise ScoringInputError(f"chunk must be >= 1 position, got {chunk}")
        return chunk
    return max(1, CHUNK_ELEMENTS // max(1, rows * vocab))


def score_logits(logits: torch.Tensor, input_ids: torch.Tensor, *, k: int = 0, actions: torch.Tensor | None = None,
                 ranks: bool = False, chunk: int | None = None) -> ScoredTokens:
    """Realized-token logprobs, and the top-``k``, the MC ``actions``' logprobs and the realized tokens' ``ranks``
    when asked, from teacher logits.

    logits: (B, L, V) raw layout, on any device (the work runs there); input_ids: (B, L); actions: (B, L, m)
    aligned with ``input_ids`` (negative ids, a padding sentinel, read token 0). ``k`` is capped at V; a rank counts
    ties in the realized token's favour (vLLM's); ``chunk``: positions per chunk (None: ``chunk_positions``).
    Results on the host, as ``ScoredTokens``."""
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise ScoringInputError(f"logits {tuple(logits.shape)} must be (B, L, V) over input_ids "
                                f"{tuple(input_ids.shape)}")
    if k < 0:
        raise ScoringInputError(f"k must be >= 0, got {k}")
    if actions is not None and (actions.dim() != 3 or actions.shape[:2] != input_ids.shape):
        raise ScoringInputError(f"actions must be (B, L, m) over input_ids {tuple(input_ids.shape)}, got "
                                f"{tuple(actions.shape)}")
    B, L, V = logits.shape
    dev = logits.device
    ids = input_ids.to(dev)
    kk = min(k, V)
    realized = torch.zeros((B, L), dtype=torch.float32, device=dev)
    top_ids = torch.zeros((B, L, k), dtype=torch.long, device=dev) if k else None
    top_lp = torch.full((B, L, k), -math.inf, dtype=torch.float32, device=dev) if k else None
    acts = actions.to(dev).long().clamp_min(0) if actions is not None else None  # (B, L, m)
    act_lp = torch.zeros(acts.shape, dtype=torch.float32, device=dev) if acts is not None else None
    rank = torch.zeros((B, L), dtype=torch.long, device=dev) if ranks else None
    step = chunk_positions(B, V, chunk)
    for s in range(0, L - 1, step):
        e = min(s + step, L - 1)  # predictors s..e-1 score the tokens at s+1..e
        logp = torch.log_softmax(upcast(logits[:, s:e]), dim=-1)  # (B, c, V): one chunk, on the device
        real = logp.gather(-1, ids[:, s + 1 : e + 1, None])  # (B, c, 1)
        realized[:, s + 1 : e + 1] = real.squeeze(-1)
        if rank is not None:
            rank[:, s + 1 : e + 1] = 1 + (logp > real).sum(-1)
        if top_ids is not None and top_lp is not None:
            values, idx = logp.topk(kk, dim=-1)  # (B, c, kk) by rank
            top_lp[:, s + 1 : e + 1, :kk], top_ids[:, s + 1 : e + 1, :kk] = values, idx
        if acts is not None and act_lp is not None:
            act_lp[:, s + 1 : e + 1] = logp.gather(-1, acts[:, s + 1 : e + 1])
        del logp
    return ScoredTokens(realized.cpu(), None if top_ids is None else top_ids.cpu(),
                        None if top_lp is None else top_lp.cpu(), None if act_lp is None else act_lp.cpu(),
                        None if rank is None else rank.cpu())


def next_topk(logits: torch.Tensor, last: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-``k`` of the distribution after each row's last real token (the next token's, which
    ``score_logits`` does not read: it scores the rows' own tokens).

    logits: (B, L, V) raw layout, on any device; last: (B,) the column of each row's last real token. Returns
    (logprobs, ids), each (B, min(k, V)), by rank, on the host; one position per row, so one (B, V) log-softmax."""
    if k < 1:
        raise ScoringInputError(f"k must be >= 1, got {k}")
    if logits.dim() != 3 or last.shape != logits.shape[:1]:
        raise ScoringInputError(f"logits {tuple(logits.shape)} must be (B, L, V) with one last column per row, got "
                                f"{tuple(last.shape)}")
    rows = torch.arange(logits.shape[0], device=logits.device)
    logp = torch.log_softmax(upcast(logits[rows, last.to(logits.device)]), dim=-1)  # (B, V)
    values, idx = logp.topk(min(k, logp.shape[-1]), dim=-1)  # (B, k)
    return values.cpu(), idx.cpu()


@torch.no_grad()
def score_rows(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
               vocab: int | None = None, temperature: float = 1.0, k: int = 0, actions: torch.Tensor | None = None,
               chunk: int | None = None) -> ScoredTokens:
    """One teacher forward over right- or left-padded rows (B, L) and its scores (``score_logits``): the call every
    in-process scorer makes. ``vocab``, ``temperature``: ``teacher_logits``."""
    logits = teacher_logits(model, input_ids, attention_mask, vocab=vocab, temperature=temperature)
    return score_logits(logits, input_ids, k=k, actions=actions, chunk=chunk)


def topk_logprobs(source: torch.nn.Module | torch.Tensor, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor | None = None, *, k: int, vocab: int | None = None,
                  temperature: float = 1.0, chunk: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The teacher's top-``k`` at every position without a B x L x V log-softmax on the host.

    source: a teacher model (run once on ``input_ids``/``attention_mask``, read on the student's ``vocab``
    columns at ``temperature``), or its logits (B, L, V) already computed (``vocab`` and ``temperature`` are then
    applied to them). input_ids, attention_mask: (B, L), right- or left-padded. Returns, on the host and aligned
    with ``input_ids`` (column ``i`` is the distribution token ``i`` was drawn from, computed at ``i - 1``):

    - realized (B, L) float32: the logprob of ``input_ids[b, i]``, 0 at position 0;
    - ids (B, L, k) long and logprobs (B, L, k) float32, by rank; position 0 and slots beyond V hold id 0 and
      ``-inf``.

    The float32 log-softmax runs on the logits' device, ``chunk`` positions at a time (None: as many as fit
    ``CHUNK_ELEMENTS`` floats)."""
    if k < 1:
        raise ScoringInputError(f"k must be >= 1, got {k}")
    if isinstance(source, torch.Tensor):
        logits = source[..., :vocab] if vocab is not None else source
        scored = score_logits(logits / temperature if temperature != 1.0 else logits, input_ids, k=k, chunk=chunk)
    else:
        if attention_mask is None:
            raise ScoringInputError("scoring a teacher model needs the rows' attention_mask")
        scored = score_rows(source, input_ids, attention_mask, vocab=vocab, temperature=temperature, k=k,
                            chunk=chunk)
    assert scored.topk_ids is not None and scored.topk_logprobs is not None
    return scored.realized, scored.topk_ids, scored.topk_logprobs


@dataclass
class ListedRow:
    """One row's scores as an engine or a server lists them: consecutive positions from ``start``."""

    start: int  # the column of the first scored token (1: from the prompt's second token; n_prompt: the response)
    realized: Sequence[float]  # (n,)
    topk_ids: Sequence[Sequence[int]] = ()  # (n, <= k) by rank
    topk_logprobs: Sequence[Sequence[float]] = ()  # (n, <= k)


def listed_scores(rows: Sequence[ListedRow], width: int, k: int = 0) -> ScoredTokens:
    """Scores listed per row (vLLM prompt logprobs, a teacher server's answer) laid out as ``score_logits`` lays
    out its own: realized (B, width), top-k (B, width, k) with unfilled slots id 0 and ``-inf``, 0 elsewhere.
    Listed top-k ids are the student's columns already: the server client refuses any past them
    (``adwin.teacher.protocol.parse_completion``)."""
    B = len(rows)
    realized = torch.zeros((B, width), dtype=torch.float32)
    ids = torch.zeros((B, width, k), dtype=torch.long)
    lps = torch.full((B, width, k), -math.inf, dtype=torch.float32)
    for b, row in enumerate(rows):
        n = len(row.realized)
        if row.start < 1 or row.start + n > width:
            raise ScoringInputError(f"row {b}: {n} scores from column {row.start} do not fit columns 1..{width - 1}")
        realized[b, row.start : row.start + n] = torch.tensor(list(row.realized), dtype=torch.float32)
        for j, (row_ids, row_lp) in enumerate(zip(row.topk_ids, row.topk_logprobs, strict=True)):
            n_top = min(len(row_ids), k)
            ids[b, row.start + j, :n_top] = torch.tensor(list(row_ids)[:n_top], dtype=torch.long)
            lps[b, row.start + j, :n_top] = torch.tensor(list(row_lp)[:n_top], dtype=torch.float32)
    return ScoredTokens(realized, ids if k else None, lps if k else None)
