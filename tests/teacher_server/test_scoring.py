"""The teacher server's compute: the scorer equals in-process teacher scoring, and the dynamic batcher merges
concurrent requests, keeps each request's rows, splits what exceeds its limits and bounds its queue."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.teacher.local import Teachers
from adwin.teacher_server.scoring import Batcher, Overloaded, RowScores, Scorer

pytestmark = pytest.mark.numerics  # parity of numbers across code paths: rerun per CPU capability


def _rows(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (5, 14), generator=g)  # (B, L)
    lengths = [14, 9, 2, 11, 5]
    attn = (torch.arange(14)[None] < torch.tensor(lengths)[:, None]).long()  # (B, L) right-padded
    return ids, attn, [ids[b, :n].tolist() for b, n in enumerate(lengths)]


def test_the_scorer_gives_the_in_process_teachers_logprobs() -> None:
    model = make_tiny_llama(vocab_size=64, seed=10)
    ids, attn, seqs = _rows()
    local = Teachers({"default": model}).score(ids, attn, ["default"] * 5)  # (B, L)
    served = Scorer(model).score(seqs, k=4)
    for b, (seq, row) in enumerate(zip(seqs, served, strict=True)):
        assert torch.allclose(torch.tensor(row.realized), local[b, 1 : len(seq)], atol=1e-5, rtol=0)


def test_ranks_topk_and_the_next_token_match_a_single_row_reference() -> None:
    model = make_tiny_llama(vocab_size=64, seed=10)
    _, _, seqs = _rows(1)
    scored = Scorer(model).score(seqs, k=3)
    for seq, row in zip(seqs, scored, strict=True):
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0].float(), -1)  # (n, V)
        for j in range(1, len(seq)):
            assert row.ranks[j - 1] == 1 + int((logp[j - 1] > logp[j - 1, seq[j]]).sum())
            assert row.top_ids[j - 1] == logp[j - 1].topk(3).indices.tolist()
        assert row.next_id == int(logp[-1].argmax()) and row.next_logprob == pytest.approx(float(logp[-1].max()), abs=1e-5)
        assert len(row.top_ids) == len(seq)  # the prompt's positions 1..n-1, then the next token


def _echo_score(calls: list[int], delay_s: float = 0.0):
    def score(seqs: Sequence[Sequence[int]], k: int) -> list[RowScores]:
        calls.append(len(seqs))
        time.sleep(delay_s)
        return [RowScores([float(sum(s))], [1], [], [], len(s), 0.0) for s in seqs]
    return score


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows() -> None:
    calls: list[int] = []
    batcher = Batcher(_echo_score(calls, 0.02), max_rows=64, max_wait_s=0.05)
    results: dict[int, list[float]] = {}

    def client(i: int) -> None:
        results[i] = [r.realized[0] for r in batcher.submit([[i, j] for j in range(3)], 0).result(timeout=10)]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.close()
    assert results == {i: [float(i + j) for j in range(3)] for i in range(12)}
    assert sum(calls) == 36 and len(calls) < 12  # requests shared forwards
    assert batcher.stats.rows == 36 and batcher.queued_rows == 0


def test_a_request_over_the_limits_is_split_into_forwards_within_them() -> None:
    calls: list[int] = []
    batcher = Batcher(_echo_score(calls), max_rows=2, max_tokens=100)
    rows = batcher.submit([[i] * 3 for i in range(5)], 0).result(timeout=10)
    assert [r.realized[0] for r in rows] == [3.0 * i for i in range(5)] and calls == [2, 2, 1]
    calls.clear()
    batcher.max_rows, batcher.max_tokens = 64, 8  # padded tokens: rows x the longest row
    batcher.submit([[1] * 4, [1] * 4, [1] * 3, [1] * 9], 0).result(timeout=10)
    assert calls == [2, 1, 1]
    batcher.close()


def test_a_failed_forward_fails_every_request_in_it_and_the_batcher_goes_on() -> None:
    state = {"fail": True}

    def score(seqs: Sequence[Sequence[int]], k: int) -> list[RowScores]:
        if state["fail"]:
            raise RuntimeError("out of memory")
        return [RowScores([0.0], [1], [], [], 0, 0.0) for _ in seqs]

    batcher = Batcher(score, max_wait_s=0.05)
    futures = [batcher.submit([[1, 2]], 0) for _ in range(3)]
    for f in futures:
        with pytest.raises(RuntimeError, match="out of memory"):
            f.result(timeout=10)
    state["fail"] = False
    assert len(batcher.submit([[1, 2]], 0).result(timeout=10)) == 1
    batcher.close()


def test_the_queue_is_bounded() -> None:
    gate = threading.Event()

    def score(seqs: Sequence[Sequence[int]], k: int) -> list[RowScores]:
        gate.wait(10)
        return [RowScores([0.0], [1], [], [], 0, 0.0) for _ in seqs]

    batcher = Batcher(score, max_queue_rows=3, max_wait_s=0.0)
    first = batcher.submit([[1, 2], [3, 4]], 0)
    with pytest.raises(Overloaded, match="at most 3"):
        batcher.submit([[1, 2], [3, 4]], 0)
    gate.set()
    first.result(timeout=10)
    batcher.submit([[1, 2], [3, 4]], 0).result(timeout=10)  # room again once answered
    batcher.close()
