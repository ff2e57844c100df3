"""The teacher server's compute: one transformers model scoring token sequences, behind a dynamic batcher.

``Scorer.score`` scores right-padded rows on the one teacher-scoring path, ``adwin.teacher.scoring`` (as the
in-process teachers do: one forward, read on the served ``vocab`` columns, a chunk of positions at a time on the
model's device): for every position the log-probability of the realized token, its rank and the top-k; the
distribution after the last token gives the next token (``max_tokens: 1``: the argmax, the server scores and does
not sample).

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

from adwin.teacher.scoring import ScoringInputError, next_topk, score_logits, teacher_logits

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
    """A frozen causal LM on ``device``, read on its first ``vocab`` output columns (default: all of them); ``score``
    is called from the batcher's one thread.

    ``vocab``: the students' output width. A teacher padded wider than its tokenizer (Qwen2.5-7B's 152,064 rows
    against 1.5B's 151,936) then answers as the unpadded one would: ids, top-k and the normalisation all lie on the
    columns the students compare."""

    def __init__(self, model: torch.nn.Module, pad_id: int = 0, vocab: int | None = None) -> None:
        width = int(model.config.vocab_size)
        if vocab is not None and not 1 <= vocab <= width:
            raise ScoringInputError(f"vocab must be in 1 .. {width} (the model's output columns), got {vocab}")
        self.model = model.eval().requires_grad_(False)
        self.device = next(model.parameters()).device
        self.vocab_size = vocab or width
        # rows are right-padded, so no real token attends a pad: any id on the read columns pads alike
        self.pad_id = pad_id if 0 <= pad_id < self.vocab_size else 0

    @torch.no_grad()
    def score(self, seqs: Sequence[Sequence[int]], k: int) -> list[RowScores]:
        L = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), L), self.pad_id, dtype=torch.long)  # (B, L) right-padded
        mask = torch.zeros((len(seqs), L), dtype=torch.long)  # (B, L)
        for b, s in enumerate(seqs):
            ids[b, : len(s)] = torch.tensor(list(s), dtype=torch.long)
            mask[b, : len(s)] = 1
        kk = min(k, self.vocab_size)
        logits = teacher_logits(self.model, ids, mask, vocab=self.vocab_size)  # (B, L, V) on the model's device
        scored = score_logits(logits, ids, k=kk, ranks=True)  # column j: token j, scored at j - 1
        next_lp, next_ids = next_topk(logits, mask.sum(1) - 1, max(kk, 1))  # (B, max(kk, 1))
        del logits
        assert scored.ranks is not None
        top_ids = scored.topk_ids if scored.topk_ids is not None else torch.zeros((len(seqs), L, 0), dtype=torch.long)
        top_lp = scored.topk_logprobs if scored.topk_logprobs is not None else torch.zeros((len(seqs), L, 0))
        out = []
        for b, s in enumerate(seqs):
            n = len(s)  # positions 1 .. n-1 (columns of score_logits), then the next token's distribution
            out.append(RowScores(scored.realized[b, 1:n].tolist(), scored.ranks[b, 1:n].tolist(),
                                 top_ids[b, 1:n].tolist() + [next_ids[b, :kk].tolist()],
                                 top_lp[b, 1:n].tolist() + [next_lp[b, :kk].tolist()], int(next_ids[b, 0]),
                                 float(next_lp[b, 0])))
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
