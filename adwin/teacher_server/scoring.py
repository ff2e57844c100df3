"""The teacher server's compute: one transformers model scoring token sequences, behind a dynamic batcher.

``Scorer.score`` runs one forward over right-padded rows and reads, for every position, the log-probability of the
realized token (``log_softmax`` of the raw logits, as ``adwin.teacher.local.Teachers.score`` computes it), its
rank, and the top-k; the last position's distribution gives the next token (``max_tokens: 1``: the argmax, the
server scores and does not sample).

``Batcher`` is the dynamic batching: requests put their rows on a queue; one worker thread takes the first
request, then whatever else arrives within ``max_wait_s`` while the batch stays within ``max_rows`` rows and
``max_tokens`` padded tokens, scores it in one forward (a request larger than the limits is split), and
hands every request its own rows. At most ``max_queue_rows`` rows wait: beyond that a request is refused
(``Overloaded``, HTTP 503, which clients retry).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from adwin.objectives.logprobs import upcast

log = logging.getLogger(__name__)


@dataclass
class RowScores:
    """One sequence of ``n`` tokens: positions ``j = 1 .. n-1`` of the prompt, then the next token."""

    realized: list[float]  # (n-1,) log q(seq[j] | seq[:j])
    ranks: list[int]  # (n-1,) rank of seq[j] (1 = the argmax; ties count in its favour)
    top_ids: list[list[int]]  # (n, k): positions 1 .. n-1, then the next token's distribution
    top_logprobs: list[list[float]]  # (n, k)
    next_id: int  # the argmax of the next token's distribution
    next_logprob: float


class Overloaded(RuntimeError):
    """More rows are waiting than the server queues (HTTP 503)."""


class Scorer:
    """A frozen causal LM on ``device``; ``score`` is called from the batcher's one thread."""

    def __init__(self, model: torch.nn.Module, pad_id: int = 0) -> None:
        self.model = model.eval().requires_grad_(False)
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.config.vocab_size)

    @torch.no_grad()
    def score(self, seqs: Sequence[Sequence[int]], k: int) -> list[RowScores]:
        L = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), L), self.pad_id, dtype=torch.long)  # (B, L) right-padded
        mask = torch.zeros((len(seqs), L), dtype=torch.long)  # (B, L)
        for b, s in enumerate(seqs):
            ids[b, : len(s)] = torch.tensor(list(s), dtype=torch.long)
            mask[b, : len(s)] = 1
        logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits  # (B, L, V)
        logp = torch.log_softmax(upcast(logits), dim=-1).cpu()  # (B, L, V): position i predicts token i + 1
        nxt = ids[:, 1:].clamp_max(logp.shape[-1] - 1)  # (B, L-1)
        realized = logp[:, :-1].gather(-1, nxt[..., None])  # (B, L-1, 1)
        ranks = 1 + (logp[:, :-1] > realized).sum(-1)  # (B, L-1)
        top_lp, top_ids = logp.topk(min(max(k, 1), logp.shape[-1]), dim=-1)  # (B, L, k)
        out = []
        for b, s in enumerate(seqs):
            n = len(s)
            last_lp, last_id = logp[b, n - 1].max(-1)
            out.append(RowScores(realized[b, : n - 1, 0].tolist(), ranks[b, : n - 1].tolist(),
                                 top_ids[b, :n, :k].tolist(), top_lp[b, :n, :k].tolist(), int(last_id),
                                 float(last_lp)))
        return out


@dataclass
class _Job:
    seqs: list[list[int]]
    k: int
    future: Future[list[RowScores]] = field(default_factory=Future)

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.seqs)


@dataclass
class BatchStats:
    batches: int = 0
    rows: int = 0
    tokens: int = 0
    busy_s: float = 0.0  # seconds spent in forwards


class Batcher:
    """Dynamic batching of concurrent requests over one ``score(seqs, k)``; see the module docstring."""

    def __init__(self, score: Callable[[Sequence[Sequence[int]], int], list[RowScores]], *, max_rows: int = 64,
                 max_tokens: int = 16384, max_wait_s: float = 0.005, max_queue_rows: int = 4096) -> None:
        self._score, self.max_rows, self.max_tokens = score, max_rows, max_tokens
        self.max_wait_s, self.max_queue_rows = max_wait_s, max_queue_rows
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self.queued_rows = 0
        self.stats = BatchStats()
        self._thread = threading.Thread(target=self._run, name="teacher-batcher", daemon=True)
        self._thread.start()

    def submit(self, seqs: list[list[int]], k: int) -> Future[list[RowScores]]:
        with self._lock:
            if self.queued_rows + len(seqs) > self.max_queue_rows:
                raise Overloaded(f"{self.queued_rows} rows are waiting (the server queues at most "
                                 f"{self.max_queue_rows}); retry later")
            self.queued_rows += len(seqs)
        job = _Job(seqs, k)
        self._jobs.put(job)
        return job.future

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        carry: _Job | None = None
        while True:
            first = carry or self._jobs.get()
            carry = None
            if first is None:
                return
            batch, rows, tokens = [first], len(first.seqs), first.tokens
            deadline = time.monotonic() + self.max_wait_s
            while rows < self.max_rows and tokens < self.max_tokens:
                try:
                    job = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if job is None:
                    self._jobs.put(None)  # stop after this batch
                    break
                if rows + len(job.seqs) > self.max_rows or tokens + job.tokens > self.max_tokens:
                    carry = job  # the next batch starts with it
                    break
                batch.append(job)
                rows, tokens = rows + len(job.seqs), tokens + job.tokens
            self._run_batch(batch)

    def _run_batch(self, batch: list[_Job]) -> None:
        live = [j for j in batch if j.future.set_running_or_notify_cancel()]
        seqs = [s for j in live for s in j.seqs]
        k = max((j.k for j in live), default=0)
        try:
            t0 = time.perf_counter()
            scored: list[RowScores] = []
            for part in self._parts(seqs):
                scored += self._score(part, k)
            with self._lock:
                self.stats.batches += 1
                self.stats.rows += len(seqs)
                self.stats.tokens += sum(len(s) for s in seqs)
                self.stats.busy_s += time.perf_counter() - t0
        except Exception as e:  # every request of the batch gets the error; the worker goes on
            log.exception("teacher server: scoring a batch of %d rows failed", len(seqs))
            for j in live:
                j.future.set_exception(e)
        else:
            at = 0
            for j in live:
                j.future.set_result(scored[at : at + len(j.seqs)])
                at += len(j.seqs)
        finally:
            with self._lock:
                self.queued_rows -= sum(len(j.seqs) for j in batch)

    def _parts(self, seqs: list[list[int]]) -> list[list[list[int]]]:
        """Forward-sized parts of ``seqs`` in order: at most ``max_rows`` rows and ``max_tokens`` padded tokens
        (a single longer row is its own part)."""
        parts: list[list[list[int]]] = []
        cur: list[list[int]] = []
        width = 0
        for s in seqs:
            w = max(width, len(s))
            if cur and (len(cur) + 1 > self.max_rows or (len(cur) + 1) * w > self.max_tokens):
                parts.append(cur)
                cur, w = [], len(s)
            cur.append(s)
            width = w
        if cur:
            parts.append(cur)
        return parts
