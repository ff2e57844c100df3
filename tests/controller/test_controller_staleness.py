"""Probe staleness never exceeds S in a batch: forced fill and expiry (contract: in-process and over HTTP)."""

from __future__ import annotations

import random

import pytest
from controller_harness import finish, offers, run_spec

from adwin.controller import ProbeConflict
from adwin.controller.schemas import OfferIn, ProbeOfferItem, ProbeReportIn


def test_a_probe_at_the_limit_forces_the_first_p_so_its_batch_forms_at_once(api):
    rid = api.register_run(run_spec(probe_batch_size=2, staleness_limit=3, lookahead=0)).run_id
    api.offer_probes(rid, offers(0, 1, prefix="a"))  # a0: version 0
    finish(api, rid, "a0", step=1)  # finished early: complete, waiting for a second probe
    api.offer_probes(rid, offers(2, 3, prefix="n"))  # n0, n1, n2: version 2
    assert api.probe_plan(rid, 2).force_complete == []
    plan = api.probe_plan(rid, 3)  # a0 reaches S = 3: n0 (with a0 the first P) must complete now
    assert plan.active == ["n0", "n1", "n2"] and plan.force_complete == ["n0"]
    api.report_probe(rid, ProbeReportIn(probe_id="n0", step=3, tokens_added=9, version=3, forced=True))
    batch = api.next_probe_batch(rid, step=3)
    assert batch.probe_ids == ["a0", "n0"] and (batch.version, batch.staleness_max) == (3, 3)


def test_complete_probes_that_no_batch_can_take_within_s_expire_and_are_counted(api):
    rid = api.register_run(run_spec(probe_batch_size=3, staleness_limit=2)).run_id
    api.offer_probes(rid, offers(0, 2))
    finish(api, rid, "s0", step=1)
    finish(api, rid, "s1", step=1)
    assert api.probe_plan(rid, 2).force_complete == []  # fewer than P probes: nothing to fill
    assert api.next_probe_batch(rid, step=2) is None  # at version 2 both are at S, and only 2 < P exist
    counts = api.telemetry(rid).probes
    assert (counts["expired"], counts["complete"]) == (2, 0)
    with pytest.raises(ProbeConflict, match="expired"):
        api.report_probe(rid, ProbeReportIn(probe_id="s0", step=3, tokens_added=1, version=3))
    api.offer_probes(rid, offers(3, 3, prefix="f"))  # fresh probes batch normally afterwards
    for pid in ("f0", "f1", "f2"):
        finish(api, rid, pid, step=3)
    assert api.next_probe_batch(rid).probe_ids == ["f0", "f1", "f2"]


def test_a_probe_past_s_is_expired_even_when_a_batch_could_take_it(api):
    rid = api.register_run(run_spec(probe_batch_size=2, staleness_limit=2, lookahead=2)).run_id
    api.offer_probes(rid, OfferIn(step=0, offers=[ProbeOfferItem(sample_id="old", prompt_id="p", response_len=1, version=0)]))
    api.offer_probes(rid, offers(3, 2, prefix="n"))
    for pid in ("old", "n0", "n1"):
        finish(api, rid, pid, step=3)  # version 3: old is at staleness 3 > S, a plan was skipped
    batch = api.next_probe_batch(rid)
    assert batch.probe_ids == ["n0", "n1"] and batch.staleness_max == 0
    assert api.telemetry(rid).probes["expired"] == 1


def _drive(api, rng: random.Random, *, p: int, s: int, lookahead: int, steps: int) -> dict[str, int]:
    """A trainer-like loop with random offers (some with older versions), finishes and drops.

    Checks every step: a returned batch is formed at the plan's version with staleness <= S, and a
    batch is returned whenever some batchable probe reached S and at least P are batchable.
    """
    rid = api.register_run(run_spec(probe_batch_size=p, staleness_limit=s, lookahead=lookahead,
                                    offers_per_step=4, max_active_probes=64)).run_id
    oldest: dict[str, int] = {}
    state: dict[str, str] = {}  # reference view of unbatched probes: active | complete
    seen = {"batches": 0, "filled": 0}
    for v in range(1, steps):
        t = v - 1
        api.get_window(rid, t)
        items = [
            ProbeOfferItem(sample_id=f"v{t}-{i}", prompt_id=f"p{i}", response_len=2, version=max(0, t - rng.choice([0, 0, 0, 1, 2])))
            for i in range(rng.randint(0, 4))
        ]
        if items:
            for pid in api.offer_probes(rid, OfferIn(step=t, offers=items)).accepted:
                oldest[pid] = next(o.version for o in items if o.sample_id == pid)
                state[pid] = "active"
        plan = api.probe_plan(rid, v)
        live = [pid for pid in state if v - oldest[pid] <= s]  # insertion order = submission order
        must_batch = len(live) >= p and any(v - oldest[pid] >= s for pid in live)
        seen["filled"] += any(v - oldest[pid] < s for pid in plan.force_complete)
        for pid in plan.active:
            if pid in plan.force_complete:
                api.report_probe(rid, ProbeReportIn(probe_id=pid, step=v, tokens_added=7, version=v, forced=True))
                state[pid] = "complete"
            else:
                roll = rng.random()
                end = {"finished": roll < 0.3, "dropped": 0.3 <= roll < 0.35}
                api.report_probe(rid, ProbeReportIn(probe_id=pid, step=v, tokens_added=2, version=v, **end))
                if end["dropped"]:
                    del state[pid]
                elif end["finished"]:
                    state[pid] = "complete"
        batch = api.next_probe_batch(rid, step=v, idempotency_key=f"{rid}-batch-{v}")
        if must_batch:
            assert batch is not None, f"version {v}: a probe reached S={s} but no batch formed"
        if batch is not None:
            stale = [v - oldest[pid] for pid in batch.probe_ids]
            assert max(stale) <= s, f"version {v}: batch {batch.audit_id} staleness {max(stale)} > S={s}"
            assert (batch.version, batch.staleness_max, len(batch.probe_ids)) == (v, max(stale), p)
            seen["batches"] += 1
            for pid in batch.probe_ids:
                del state[pid]
        for pid in [q for q, st in state.items() if st == "complete" and v - oldest[q] >= s]:
            del state[pid]  # the controller expired it (checked against its counts below)
    counts = api.telemetry(rid).probes
    assert counts["batched"] + counts["audited"] == p * seen["batches"]
    assert counts["active"] == sum(st == "active" for st in state.values())
    return {**seen, "expired": counts["expired"]}


@pytest.mark.parametrize("p, s, lookahead", [(2, 2, 0), (3, 3, 2), (4, 2, 1)])
def test_no_batch_is_ever_older_than_s_under_a_seeded_random_schedule(api, p, s, lookahead):
    totals = {"batches": 0, "filled": 0, "expired": 0}
    for seed in range(3):
        for k, n in _drive(api, random.Random(seed * 100 + p), p=p, s=s, lookahead=lookahead, steps=25).items():
            totals[k] += n
    # the schedule exercises every path: plain batches, forced fills and expiry
    assert totals["batches"] > 0 and totals["filled"] > 0 and totals["expired"] > 0, totals
