"""The probe pool against the real controller, driven by the executor the trainer runs
(``AsyncProbeExecutor`` with an inline worker): version tags, forced completion at S, submission-order
batches. Extension goes through a scripted extender (the pool is model-agnostic)."""

from __future__ import annotations

import pytest
import torch
from client_rounds import advance

from adwin.controller import Controller
from adwin.controller.schemas import OfferIn, PolicyIn, ProbeOfferItem, RunIn
from adwin.probes.async_executor import AdvanceStats, AsyncProbeExecutor
from adwin.probes.pool import Extension, Probe, ProbePool, probe_batch
from adwin.probes.workers import InlineWorker

EOS = 2
MAX_LEN = 12


class ScriptedExtender:
    """Emits token 7 (logprob -1.0) until the budget; contexts listed in ``eos_after`` end with EOS."""

    def __init__(self, eos_for: set[int] | None = None) -> None:
        self.eos_for = eos_for or set()  # first prompt token of contexts that emit EOS at once
        self.calls: list[list[int]] = []

    def __call__(self, contexts: list[list[int]], budgets: list[int]) -> Extension:
        self.calls.append(list(budgets))
        toks, lps, fin = [], [], []
        for ctx, n in zip(contexts, budgets, strict=True):
            if ctx[0] in self.eos_for and n > 0:
                toks.append([EOS]), lps.append([-0.5]), fin.append(True)
            else:
                toks.append([7] * n), lps.append([-1.0] * n), fin.append(False)
        return Extension(toks, lps, fin)


def _setup(p: int = 2, s: int = 3, lookahead: int = 0) -> tuple[Controller, str]:
    ctl = Controller()
    run = ctl.register_run(RunIn(policy=PolicyIn(name="adwin", candidates=[2, 4], max_len=MAX_LEN),
                                 probe_batch_size=p, staleness_limit=s, offers_per_step=4, lookahead=lookahead))
    return ctl, run.run_id


def _offer(ctl: Controller, run_id: str, pool: ProbePool, step: int, ids: list[str], first_tok: list[int]) -> None:
    offers = [ProbeOfferItem(sample_id=i, prompt_id=f"p-{i}", response_len=2, version=step) for i in ids]
    accepted = ctl.offer_probes(run_id, OfferIn(step=step, offers=offers)).accepted
    assert accepted == ids
    for i, tok in zip(ids, first_tok, strict=True):
        pool.add(Probe(i, [tok, 5], [9, 9], [step, step], [-0.1, -0.2], "default", submitted_step=step))


def _executor(pool: ProbePool, extender: ScriptedExtender) -> AsyncProbeExecutor:
    return AsyncProbeExecutor(pool, lambda: InlineWorker(extender))


def _round(ctl: Controller, run_id: str, ex: AsyncProbeExecutor, version: int) -> AdvanceStats:
    """One step's probe round at ``version`` (plan, extension, reports), as the trainer runs it."""
    return advance(ex, ctl, run_id, version)


def test_version_tags_record_the_weights_of_every_round() -> None:
    ctl, run_id = _setup(s=5)
    pool = ProbePool(MAX_LEN)
    ex = _executor(pool, ScriptedExtender())
    _offer(ctl, run_id, pool, 0, ["a"], [1])
    _round(ctl, run_id, ex, 1)
    _round(ctl, run_id, ex, 2)
    probe = pool.get("a")
    w = ctl.get_window(run_id, 1).window
    assert w == 4  # ADWIN starts at the largest candidate; a round extends by at most the window
    assert probe.versions == [0, 0] + [1] * w + [2] * w
    assert probe.behavior_logprobs == [-0.1, -0.2] + [-1.0] * (2 * w)
    assert probe.staleness(2) == 2 and not probe.finished


def test_probe_reaching_staleness_s_is_force_completed_to_the_horizon() -> None:
    s = 3
    ctl, run_id = _setup(s=s, p=1)
    pool = ProbePool(MAX_LEN)
    ex = _executor(pool, ScriptedExtender())
    _offer(ctl, run_id, pool, 0, ["a"], [1])
    for version in range(1, s):
        assert _round(ctl, run_id, ex, version).forced == 0
    assert not pool.get("a").finished
    stats = _round(ctl, run_id, ex, s)
    probe = pool.get("a")
    assert stats.forced == 1 and [r.probe_id for r in stats.reports if r.forced] == ["a"]
    assert probe.finished and probe.forced and len(probe.response_ids) == MAX_LEN
    assert probe.staleness(s) == s  # consumed at the limit, never beyond
    batch = ctl.next_probe_batch(run_id)
    assert batch is not None and batch.probe_ids == ["a"]


def test_batches_follow_submission_order_even_when_later_probes_finish_first() -> None:
    ctl, run_id = _setup(p=2, s=4, lookahead=0)
    pool = ProbePool(MAX_LEN)
    ex = _executor(pool, ScriptedExtender(eos_for={3}))
    _offer(ctl, run_id, pool, 0, ["a", "b"], [1, 1])  # long probes, submitted first
    _offer(ctl, run_id, pool, 1, ["c", "d"], [3, 3])  # emit EOS in their first round
    _round(ctl, run_id, ex, 1)
    assert pool.get("c").finished and pool.get("d").finished
    assert ctl.next_probe_batch(run_id) is None  # c, d may not overtake a, b (look-ahead 0)
    version = 2
    while not (pool.get("a").finished and pool.get("b").finished):
        _round(ctl, run_id, ex, version)
        version += 1
    first = ctl.next_probe_batch(run_id)
    second = ctl.next_probe_batch(run_id)
    assert first is not None and first.probe_ids == ["a", "b"]
    assert second is not None and second.probe_ids == ["c", "d"]
    probes = pool.pop(first.probe_ids)
    batch = probe_batch(probes, pad_id=0, score=lambda ids, attn, routes: torch.full(ids.shape, -2.0))
    assert batch.input_ids[0, :4].tolist() == [1, 5, 9, 9]
    assert batch.versions[0, 2:4].tolist() == [0, 0] and int(batch.versions[0, 0]) == -1
    assert torch.equal(batch.teacher_logprobs != 0, batch.response_mask.bool())
    assert "a" not in pool and "c" in pool


def test_unknown_probe_in_plan_is_reported_dropped() -> None:
    ctl, run_id = _setup()
    pool = ProbePool(MAX_LEN)
    accepted = ctl.offer_probes(run_id, OfferIn(step=0, offers=[
        ProbeOfferItem(sample_id="ghost", prompt_id="p", response_len=2, version=0)])).accepted
    assert accepted == ["ghost"]  # the controller holds it, this pool never did (e.g. a restarted trainer)
    stats = _round(ctl, run_id, _executor(pool, ScriptedExtender()), 1)
    assert [(r.probe_id, r.dropped) for r in stats.reports] == [("ghost", True)] and stats.dropped == 1


def test_pool_rejects_untagged_tokens_and_duplicates() -> None:
    pool = ProbePool(MAX_LEN)
    with pytest.raises(ValueError, match="tag every response token"):
        pool.add(Probe("x", [1], [4, 5], [0], [-1.0, -1.0], "default", 0))
    pool.add(Probe("x", [1], [4], [0], [-1.0], "default", 0))
    with pytest.raises(ValueError, match="already"):
        pool.add(Probe("x", [1], [4], [0], [-1.0], "default", 0))
