"""The audit's cross-rank combine: ranks that each differentiate a shard of the probe batch and combine
(``audit(combine=...)``) get the 1-process audit, for every method. Ranks are threads here, joined by an
in-process group with the collectives the combine uses (the gloo path is tests/adwin/loop/test_distributed.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from test_alignment import assert_same_audit, make_batch
from tiny_models import make_tiny_llama

from adwin.audit.alignment import AuditResult, audit
from adwin.loop.distributed import LocalDist

CANDS = [4, 8, 16, 32]


class ThreadGroup:
    """``world`` ranks as threads: each collective waits for every rank's value, then combines them."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world)
        self.slots: list[Any] = [None] * world

    def exchange(self, rank: int, value: Any) -> list[Any]:
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before every rank has read them all
        return out


class ThreadRank(LocalDist):
    def __init__(self, group: ThreadGroup, rank: int) -> None:
        object.__setattr__(self, "group", group)
        super().__init__(rank=rank, world=group.world)

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        values = self.group.exchange(self.rank, t.clone())
        return t.copy_(torch.stack(values).sum(0))

    def all_max(self, value: float) -> float:
        return max(self.group.exchange(self.rank, value))

    def all_gather_object(self, obj: Any) -> list[Any]:
        return self.group.exchange(self.rank, obj)


def run_ranks(world: int, fn: Callable[[LocalDist], AuditResult]) -> list[AuditResult]:
    group, out, errors = ThreadGroup(world), [None] * world, []

    def body(r: int) -> None:
        try:
            out[r] = fn(ThreadRank(group, r))
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out  # type: ignore[return-value]


@pytest.mark.parametrize("method,macro", [("fast", False), ("fast", True), ("sketch", False), ("reference", True)])
def test_sharded_audit_equals_the_one_process_audit(method: str, macro: bool) -> None:
    model, batch = make_tiny_llama(), make_batch(prompt_lens=[5, 9, 3, 12, 4], response_lens=[40, 20, 55, 30, 3])
    kw = {"method": method, "macro": macro, "sketch_dim": 512, "seed": 3}
    one = audit(model, batch, CANDS, **kw)
    ranks = run_ranks(2, lambda d: audit(model, batch, CANDS, combine=d, **kw))
    for r in ranks:  # every rank holds the whole batch's result
        assert_same_audit(one, r, tol=1e-5, macro=macro)
        assert r.extra == one.extra
        assert r.grad_norms.keys() == one.grad_norms.keys()
    if method == "sketch":
        assert np.abs(ranks[0].sketch - one.sketch).max() <= 1e-5 * np.abs(one.sketch).max()


def test_sharded_audit_with_token_weights_and_bootstrap_interval() -> None:
    model, batch = make_tiny_llama(), make_batch()
    weights = torch.rand(batch.input_ids.shape, generator=torch.Generator().manual_seed(1)) * batch.response_mask
    kw = {"method": "fast", "macro": False, "token_weights": weights, "ci_level": 0.9, "ci_samples": 50,
          "sketch_dim": 256, "estimator": "debiased"}
    one = audit(model, batch, CANDS, **kw)
    ranks = run_ranks(2, lambda d: audit(model, batch, CANDS, combine=d, **kw))
    for c in CANDS:
        assert ranks[1].cosines[c] == pytest.approx(one.cosines[c], abs=1e-5)
        assert ranks[1].cosine_ci[c] == pytest.approx(one.cosine_ci[c], abs=1e-4)


def test_a_probe_batch_smaller_than_the_world_is_refused() -> None:
    model, batch = make_tiny_llama(), make_batch(prompt_lens=[5], response_lens=[10])
    with pytest.raises(ValueError, match="probes.batch_size must be at least the world size"):
        run_ranks(2, lambda d: audit(model, batch, CANDS, combine=d))
