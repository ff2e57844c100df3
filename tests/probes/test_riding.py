"""The ``rollout`` probe backend (``RidingWorker``): a parked round rides the next training rollout call as extra
rows, leaves the rollout rows as a separate call makes them (per-sample seeding), extends exactly like the inline
backend's separate call at the round's version, decodes only within the call's window (a longer round budget is
capped, the rest continues in a later round or at the forced completion), reports the decode steps it added, and
never waits on a rollout that is not coming."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.config import load_config
from adwin.controller.schemas import ProbePlanOut
from adwin.decode.loop import Generation
from adwin.loop.distributed import LocalDist
from adwin.loop.probe_rounds import RoundExtender
from adwin.loop.sampler import Sampler
from adwin.probes.async_executor import AsyncProbeExecutor
from adwin.probes.executors import build_executor
from adwin.probes.pool import Probe, ProbePool
from adwin.probes.riding import RidingWorker, StaleRound
from adwin.probes.workers import RoundJob
from adwin.sampling.data import Prompt
from adwin.tasks.tokenizer import build_tokenizer

pytestmark = pytest.mark.numerics  # parity of numbers across code paths: rerun per CPU capability

PROMPTS = [Prompt("a", "1+2="), Prompt("b", "3+4=")]
CONTEXTS = [[1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 8, 9]]  # longer than the prompts: the combined call pads
SEED = 11


def _sampler(seeding: str = "per_sample") -> Sampler:
    cfg = load_config(None, {"data.max_prompt_len": 16, "rollout.temperature": 0.9, "rollout.top_p": 0.95,
                             "rollout.seeding": seeding, "probes.backend": "rollout"})
    tok = build_tokenizer()
    parts = SimpleNamespace(student=make_tiny_llama(vocab_size=max(64, len(tok)), seed=4), tokenizer=tok)
    return Sampler(parts, cfg)  # type: ignore[arg-type]


def _rider(gen: Sampler, seed: int | None = SEED) -> RidingWorker:
    extend = RoundExtender(gen.generate, 0.9, 0.95, LocalDist(), seed, lambda: gen.version)

    def no_audit(job: Any) -> Any:
        raise AssertionError("no audit in these tests")

    rider = RidingWorker(extend, no_audit, lambda: gen.version)
    gen.rider = rider
    return rider


def _count_calls(gen: Sampler, most: list[int] | None = None) -> list[int]:
    """The rows of every engine call (and, into ``most``, its largest budget: the steps it may decode)."""
    calls: list[int] = []
    real = gen.engine.generate

    def counted(contexts: Any, budgets: Any, **kw: Any) -> Any:
        calls.append(len(contexts))
        if most is not None:
            most.append(max(budgets))
        return real(contexts, budgets, **kw)

    gen.engine.generate = counted  # type: ignore[method-assign]
    return calls


def _seeds(n: int) -> list[int]:
    return [1000 + i for i in range(n)]


def test_a_parked_round_rides_the_rollout_call_and_leaves_the_rollout_rows_as_a_separate_call_makes_them() -> None:
    gen = _sampler()
    gen.sync_weights(3)
    rider = _rider(gen)
    alone = gen.roll_out(PROMPTS, 2, 6, seeds=_seeds(4))
    want = rider.extend.run(CONTEXTS, [5, 3], 3)  # the inline backend's separate call at the round's version
    fut = rider.submit(RoundJob(["p0", "p1"], CONTEXTS, [5, 3], version=3))
    assert not fut.done()
    calls = _count_calls(gen)
    riding = gen.roll_out(PROMPTS, 2, 6, seeds=_seeds(4))
    assert calls == [4 + 2]  # one engine call: the rollout rows plus the probe rows
    got = fut.result()
    assert fut.done() and got.tokens == want.tokens and got.finished == want.finished
    # the same tokens; logprobs equal to float rounding (the probe rows sit in a differently padded batch)
    assert got.logprobs is not None and want.logprobs is not None
    for a, b in zip(got.logprobs, want.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-5)
    assert riding.response_ids == alone.response_ids and riding.finished == alone.finished
    assert riding.behavior_logprobs is None  # the rollout rows record none unless the loss weights by them
    assert [len(t) <= b for t, b in zip(got.tokens, [5, 3], strict=True)] == [True, True]
    m = rider.metrics()
    assert m["probe/rider_rows"] == 2 and m["probe/rider_share"] == pytest.approx(2 / 6) and m["probe/rider_s"] > 0
    assert rider.metrics()["probe/rider_rows"] == 0  # reported once


def test_evaluation_rollouts_carry_no_probe_rows() -> None:
    gen = _sampler()
    rider = _rider(gen)
    fut = rider.submit(RoundJob(["p0"], CONTEXTS[:1], [4], version=0))
    calls = _count_calls(gen)
    gen.roll_out(PROMPTS, 1, 4, evaluation=True)
    assert calls == [2] and not fut.done()
    gen.roll_out(PROMPTS, 1, 4, seeds=_seeds(2))
    assert calls == [2, 3] and fut.done()


def test_a_parked_round_asked_for_before_any_rollout_runs_on_its_own() -> None:
    gen = _sampler()
    rider = _rider(gen)
    want = rider.extend.run(CONTEXTS, [5, 3], 0)
    fut = rider.submit(RoundJob(["p0", "p1"], CONTEXTS, [5, 3], version=0))
    assert fut.result() == want
    calls = _count_calls(gen)
    gen.roll_out(PROMPTS, 1, 4, seeds=_seeds(2))
    assert calls == [2]  # nothing left to ride


def test_a_round_parked_at_an_older_version_fails_stale_instead_of_mistagging_tokens() -> None:
    gen = _sampler()
    rider = _rider(gen)
    fut = rider.submit(RoundJob(["p0"], CONTEXTS[:1], [4], version=0))
    gen.sync_weights(1)
    calls = _count_calls(gen)
    gen.roll_out(PROMPTS, 1, 4, seeds=_seeds(2))
    assert calls == [2]
    assert isinstance(fut.exception(), StaleRound)


def test_forced_rounds_and_closing_never_wait_for_a_rollout() -> None:
    gen = _sampler()
    rider = _rider(gen)
    forced = rider.submit(RoundJob(["p0"], CONTEXTS[:1], [4], version=0, force=True))
    assert forced.done()
    parked = rider.submit(RoundJob(["p1"], CONTEXTS[1:], [4], version=0))
    rider.close()
    assert parked.cancelled()


def _pool_with(ids: list[str], max_len: int = 12) -> ProbePool:
    pool = ProbePool(max_len)
    for i, pid in enumerate(ids):
        pool.add(Probe(pid, [1, 5 + i, 6], [7], [0], [-1.0]))
    return pool


def test_the_executor_applies_a_ridden_round_tagged_with_its_version_at_the_next_collect() -> None:
    gen = _sampler()
    gen.sync_weights(2)
    rider = _rider(gen)
    pool = _pool_with(["p0", "p1"])
    ex = build_executor("rollout", pool, gen.parts.student, eos=gen.eos, pad_id=gen.pad, rider=rider)
    stats = ex.advance(ProbePlanOut(step=2, extend_by=3, active=["p0", "p1"], force_complete=[]), 2)
    assert stats.submitted == 2 and stats.in_flight == 2 and stats.blocked_s == 0.0
    gen.roll_out(PROMPTS, 1, 4, seeds=_seeds(2))  # step 2's rollout, on version 2
    gen.sync_weights(3)
    back = ex.collect(3)
    assert back.tokens > 0 and all(set(pool.get(p).versions[1:]) <= {2} for p in ("p0", "p1"))
    assert {r.version for r in back.reports} == {2}


def test_forcing_a_parked_probe_does_not_deadlock() -> None:
    gen = _sampler()
    rider = _rider(gen)
    pool = _pool_with(["p0", "p1"])
    ex: AsyncProbeExecutor = build_executor("rollout", pool, gen.parts.student, eos=gen.eos, pad_id=gen.pad,
                                            rider=rider)
    ex.advance(ProbePlanOut(step=0, extend_by=2, active=["p0", "p1"], force_complete=[]), 0)
    stats = ex.advance(ProbePlanOut(step=0, extend_by=2, active=["p1"], force_complete=["p0"]), 0)
    assert pool.get("p0").finished and stats.forced >= 1
    ex.close()


def test_the_rollout_backend_needs_its_rider() -> None:
    gen = _sampler()
    with pytest.raises(ValueError, match="rider"):
        build_executor("rollout", ProbePool(8), gen.parts.student, eos=gen.eos, pad_id=gen.pad)


def test_batch_seeded_riding_is_reproducible_from_the_global_seed() -> None:
    outs = []
    for _ in range(2):
        gen = _sampler("batch")
        rider = _rider(gen, seed=None)
        fut = rider.submit(RoundJob(["p0", "p1"], CONTEXTS, [5, 3], version=0))
        torch.manual_seed(5)
        batch = gen.roll_out(PROMPTS, 2, 6)
        outs.append((batch.response_ids, fut.result()))
    assert outs[0] == outs[1]


def test_a_round_planned_at_a_longer_window_rides_capped_at_the_calls_window() -> None:
    gen = _sampler()
    rider = _rider(gen)
    want = rider.extend.run(CONTEXTS, [4, 3], 0)  # the round as if it had been planned at the call's window
    fut = rider.submit(RoundJob(["p0", "p1"], CONTEXTS, [9, 3], version=0))  # planned before the window fell to 4
    most: list[int] = []
    calls = _count_calls(gen, most)
    batch = gen.roll_out(PROMPTS, 2, 4, seeds=_seeds(4))
    assert calls == [6] and most == [4]  # no decode step past the rollout rows' own window
    got = fut.result()
    assert got.tokens == want.tokens and got.finished == want.finished
    assert rider.metrics()["probe/rider_capped"] == 1
    assert got.decode_steps == 0 and batch.decode_steps <= 4  # riders within the window add no step


def test_a_capped_probe_continues_in_a_later_round_and_the_staleness_limit_still_forces_it_complete() -> None:
    gen = _sampler()
    rider = _rider(gen)
    pool = _pool_with(["p0"], max_len=12)
    ex = build_executor("rollout", pool, gen.parts.student, eos=gen.eos, pad_id=gen.pad, rider=rider)
    ex.advance(ProbePlanOut(step=0, extend_by=8, active=["p0"], force_complete=[]), 0)
    gen.roll_out(PROMPTS, 1, 2, seeds=_seeds(2))  # a window of 2: the round's budget of 8 is capped
    gen.sync_weights(1)
    ex.collect(1)
    p = pool.get("p0")
    assert len(p.response_ids) <= 1 + 2
    if p.finished:  # an EOS inside the window: nothing left to continue
        return
    stats = ex.advance(ProbePlanOut(step=1, extend_by=8, active=["p0"], force_complete=["p0"]), 1)  # at S
    assert p.finished and p.forced and stats.forced == 1 and stats.decode_steps > 0  # a call of its own
    assert len(p.response_ids) == 12 or p.response_ids[-1] in gen.eos  # to the horizon or its EOS


class _EarlyEnd:
    """An engine whose rollout rows (the first ``k``) emit EOS at their second token and probe rows never do."""

    def __init__(self, k: int) -> None:
        self.k = k

    def generate(self, contexts: Any, budgets: Any, **kw: Any) -> Generation:
        rows = [[5, 2] if i < self.k else [7] * b for i, b in enumerate(budgets)]
        # batched decoding runs to the largest budget while a row has not ended
        return Generation(rows, [i < self.k for i in range(len(rows))], [[-1.0] * len(r) for r in rows], max(budgets))

    def sync_weights(self, model: Any, version: int) -> None:
        return None


def test_riding_rows_that_outlast_every_rollout_row_report_the_decode_steps_they_added() -> None:
    gen = _sampler()
    gen.engine = _EarlyEnd(k=4)  # type: ignore[assignment]
    rider = _rider(gen)
    fut = rider.submit(RoundJob(["p0", "p1"], CONTEXTS, [5, 3], version=0))
    batch = gen.roll_out(PROMPTS, 2, 6, seeds=_seeds(4))
    # the call ran to its largest budget (6, the window: a rider cut at 5 was still going); alone, 2 steps
    assert batch.decode_steps == 6 and fut.result().decode_steps == 6 - 2
