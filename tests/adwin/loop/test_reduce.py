"""``optimize``'s reducer hook: two simulated ranks (threads) on the two halves of a batch train like one process."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from numerics import assert_same_params
from step_fixtures import config, ragged_batch, run_steps

from adwin.loop.reduce import LocalReducer, all_sum_grads
from adwin.sampling.batch import Batch
from adwin.sampling.rollout import layout


class Hub:
    """What torch.distributed's all-reduce does for ``n`` ranks, for threads in one process."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n, timeout=60)
        self.slots: list[torch.Tensor | None] = [None] * n
        self.calls: list[list[tuple[int, ...]]] = [[] for _ in range(n)]

    def rank(self, r: int) -> Any:
        hub = self

        class RankReducer:
            def all_sum(self, t: torch.Tensor) -> torch.Tensor:
                hub.calls[r].append(tuple(t.shape))
                hub.slots[r] = t.detach().clone()
                hub.barrier.wait()
                total = sum(hub.slots[1:], hub.slots[0].clone())  # rank order: every rank gets the same bits
                hub.barrier.wait()  # all have read before a later call overwrites a slot
                return t.copy_(total)

        return RankReducer()


def shard(batch: Batch, rows: slice) -> Batch:
    """Rows ``rows`` of the batch, re-laid out as that rank's own batch (its own padding width)."""
    p, r = batch.prompt_ids[rows], batch.response_ids[rows]
    beh = None if batch.behavior_logprobs is None else batch.behavior_logprobs[rows]
    return Batch(batch.prompts[rows], p, r, batch.finished[rows], layout(p, r, pad_id=0), beh)


def two_ranks(cfg: Any, batches: list[Batch]) -> tuple[list[Any], Hub]:
    hub, out = Hub(2), [None, None]
    halves = (slice(0, 3), slice(3, None))  # uneven on purpose: 3 and 5 rows

    def work(r: int) -> None:
        out[r] = run_steps(cfg, [shard(b, halves[r]) for b in batches], reducer=hub.rank(r))

    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(o is not None for o in out), "a rank failed (see the thread's traceback above)"
    return out, hub


@pytest.mark.parametrize("aggregation, micro", [("token-mean", None), ("seq-mean-token-mean", 2),
                                                ("seq-mean-token-sum", 2)])
def test_two_ranks_on_the_halves_train_like_one_process_on_the_whole_batch(aggregation: str, micro: int | None) -> None:
    batches = [ragged_batch(8, seed=0), ragged_batch(8, seed=1)]
    one_m, one, one_lp = run_steps(config(**{"loss.aggregation": aggregation}), batches)
    (r0, r1), hub = two_ranks(config(**{"loss.aggregation": aggregation, "optim.micro_batch_size": micro}), batches)
    for metrics, model, _ in (r0, r1):
        assert_same_params(one, model)
        for want, got in zip(one_m, metrics, strict=True):  # every rank logs the global values
            for k in ("loss/total", "loss/teacher_kl", "loss/tokens", "optim/grad_norm", "optim/skipped"):
                assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), k
    # the per-token logprobs stay each rank's own rows
    torch.testing.assert_close(r0[2][0][:, :6], one_lp[0][:3, :6], rtol=1e-5, atol=1e-6)
    # per step: the normaliser, the metric sums, then the gradients (one bucket for a tiny model)
    assert hub.calls[0] == hub.calls[1]
    assert hub.calls[0][:2] == [(1,), (4,)] and len(hub.calls[0]) == 6  # 4: loss, tokens, teacher_kl, _k3


def test_a_non_finite_loss_on_one_rank_skips_the_step_on_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    import step_fixtures

    real = step_fixtures.score_teacher

    def score(teachers: Any, b: Batch, c: Any) -> Any:  # rank 1 (5 rows): NaN teacher logprob on a counted token
        signal = real(teachers, b, c)
        if b.rows.input_ids.shape[0] == 5:
            signal.logprobs[0, int(b.rows.response_mask[0].nonzero()[0])] = float("nan")
        return signal

    monkeypatch.setattr(step_fixtures, "score_teacher", score)
    (r0, r1), _ = two_ranks(config(), [ragged_batch(8, seed=0)])
    assert r0[0][0]["optim/skipped"] == r1[0][0]["optim/skipped"] == 1.0


def test_gradient_sum_fills_missing_gradients_with_zeros_and_keeps_layout() -> None:
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, 2))
    a.grad = torch.tensor([1.0, 2.0, 3.0])

    class Double:
        def all_sum(self, t: torch.Tensor) -> torch.Tensor:
            return t.mul_(2)

    all_sum_grads([a, b], Double(), bucket=4)  # two buckets: a (3), then b (4)
    assert a.grad.tolist() == [2.0, 4.0, 6.0] and torch.equal(b.grad, torch.zeros(2, 2))
    t = torch.ones(2)
    assert LocalReducer().all_sum(t) is t
