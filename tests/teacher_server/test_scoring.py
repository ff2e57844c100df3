"""The teacher server's compute: the scorer equals in-process teacher scoring, and the dynamic batcher merges
concurrent requests, keeps each request's rows, splits what exceeds its limits and bounds its queue."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
import torch
from softmax_widths import softmax_widths
from tiny_models import make_tiny_llama

from adwin.teacher import scoring
from adwin.teacher.local import Teachers
from adwin.teacher.scoring import ScoringInputError
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


def _host_side_scores(model: torch.nn.Module, seqs: list[list[int]], k: int) -> list[RowScores]:
    """What the server computed before it scored on the one path, kept as the reference its answers must equal:
    one forward, then the whole batch's float32 log-softmax on the host, ranks and top-k read from it."""
    L = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), L), dtype=torch.long)  # (B, L) right-padded
    mask = torch.zeros((len(seqs), L), dtype=torch.long)  # (B, L)
    for b, s in enumerate(seqs):
        ids[b, : len(s)], mask[b, : len(s)] = torch.tensor(s), 1
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)  # (B, L, V)
    realized = logp[:, :-1].gather(-1, ids[:, 1:, None])  # (B, L-1, 1)
    ranks = 1 + (logp[:, :-1] > realized).sum(-1)  # (B, L-1)
    top_lp, top_ids = logp.topk(min(max(k, 1), logp.shape[-1]), dim=-1)  # (B, L, k)
    out = []
    for b, s in enumerate(seqs):
        n = len(s)
        last_lp, last_id = logp[b, n - 1].max(-1)
        out.append(RowScores(realized[b, : n - 1, 0].tolist(), ranks[b, : n - 1].tolist(), top_ids[b, :n, :k].tolist(),
                             top_lp[b, :n, :k].tolist(), int(last_id), float(last_lp)))
    return out


def _assert_same_rows(got: list[RowScores], ref: list[RowScores]) -> None:
    """Ids and ranks exactly, logprobs to float32 rounding."""
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        assert (g.ranks, g.top_ids, g.next_id) == (r.ranks, r.top_ids, r.next_id)
        assert g.realized == pytest.approx(r.realized, abs=1e-6, rel=0)
        assert g.next_logprob == pytest.approx(r.next_logprob, abs=1e-6, rel=0)
        for a, b in zip(g.top_logprobs, r.top_logprobs, strict=True):
            assert a == pytest.approx(b, abs=1e-6, rel=0)


@pytest.mark.parametrize("k", [0, 3, 64])
def test_the_scorer_answers_as_the_host_side_log_softmax_did_a_chunk_of_positions_at_a_time(
        k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server scores on the one path: its rows (realized, ranks, top-k, the next token) equal the old host-side
    computation's, while no log-softmax normalises more than one chunk of positions (two, here) of the batch."""
    monkeypatch.setattr(scoring, "CHUNK_ELEMENTS", 6 * 64 * 2)  # two positions of the (6, 14, 64) batch
    model = make_tiny_llama(vocab_size=64, seed=10)
    _, _, seqs = _rows(2)
    seqs.append([7])  # a one-token prompt: nothing to score but the next token
    with softmax_widths() as seen:
        got = Scorer(model).score(seqs, k)
    _assert_same_rows(got, _host_side_scores(model, seqs, k))
    assert seen.sizes and max(seen.sizes) <= 6 * 2 * 64


def test_a_scorer_reading_more_columns_than_the_model_has_is_refused_naming_vocab() -> None:
    with pytest.raises(ScoringInputError, match="vocab"):
        Scorer(make_tiny_llama(vocab_size=64), vocab=65)


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
