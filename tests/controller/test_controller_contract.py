"""One contract, two implementations: every test runs against ``Controller`` and ``RemoteController``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from controller_harness import CANDIDATES, MAX_LEN, finish, offers, run_spec, sketch_b64
from controller_harness import ready_batch as _batch

from adwin.audit.alignment import cosines_from_gram
from adwin.controller import (
    AuditConflict,
    ControllerAPI,
    InvalidInput,
    NonFiniteAudit,
    ProbeConflict,
    RunConflict,
    UnknownProbe,
    UnknownRun,
)
from adwin.controller.schemas import AuditIn, ProbeReportIn, RunIn, StepMetricsIn

# --- runs --------------------------------------------------------------------------------------


def test_both_implementations_satisfy_the_protocol(api):
    assert isinstance(api, ControllerAPI)


def test_register_assigns_an_id_when_none_is_given(api):
    out = api.register_run(RunIn(policy={"candidates": CANDIDATES, "max_len": MAX_LEN}))
    assert out.run_id and out.spec["run_id"] == out.run_id
    assert api.get_run(out.run_id).run_id == out.run_id
    assert out.run_id in [r.run_id for r in api.list_runs()]


def test_same_idempotency_key_returns_the_same_run(api):
    spec = RunIn(policy={"candidates": CANDIDATES, "max_len": MAX_LEN})
    a = api.register_run(spec, idempotency_key="reg-key-1" + str(id(api)))
    b = api.register_run(spec, idempotency_key="reg-key-1" + str(id(api)))
    assert a.run_id == b.run_id and a.created_at == b.created_at


def test_reregistering_an_id_with_the_same_spec_is_a_no_op_and_a_different_spec_conflicts(api):
    spec = run_spec()
    first = api.register_run(spec)
    assert api.register_run(spec).created_at == first.created_at
    with pytest.raises(RunConflict):
        api.register_run(spec.model_copy(update={"probe_batch_size": 7}))


def test_invalid_policy_is_refused_with_the_field_named(api):
    with pytest.raises(InvalidInput, match="candidates"):
        api.register_run(run_spec(policy={"name": "adwin", "candidates": []}))
    with pytest.raises(InvalidInput, match="window"):
        api.register_run(run_spec(policy={"name": "fixed"}))


def test_unknown_run_is_404_everywhere(api):
    for call in (
        lambda: api.get_run("nope"),
        lambda: api.get_window("nope", 0),
        lambda: api.probe_plan("nope", 0),
        lambda: api.offer_probes("nope", offers(0, 1)),
        lambda: api.next_probe_batch("nope"),
        lambda: api.report_step("nope", StepMetricsIn(step=0, metrics={})),
        lambda: api.telemetry("nope"),
    ):
        with pytest.raises(UnknownRun):
            call()


# --- windows -----------------------------------------------------------------------------------


def test_adwin_starts_at_the_largest_candidate_with_reason_initial(api):
    rid = api.register_run(run_spec()).run_id
    w = api.get_window(rid, 0)
    assert (w.window, w.reason, w.audit_id) == (CANDIDATES[-1], "initial", None)


@pytest.mark.parametrize(
    ("policy", "step", "expected"),
    [
        ({"name": "full", "max_len": 64}, 3, 64),
        ({"name": "fixed", "window": 12, "max_len": 64}, 9, 12),
        ({"name": "linear", "start": 8, "step": 4, "max_len": 20}, 2, 16),
        ({"name": "linear", "start": 8, "step": 4, "max_len": 20}, 9, 20),
    ],
)
def test_schedule_policies_answer_their_schedule(api, policy, step, expected):
    rid = api.register_run(run_spec(policy=policy)).run_id
    w = api.get_window(rid, step)
    assert (w.window, w.reason, w.step) == (expected, "schedule", step)


# --- probes ------------------------------------------------------------------------------------


def test_offers_are_capped_per_step_and_by_active_probes_and_the_rest_declined(api):
    rid = api.register_run(run_spec(offers_per_step=3, max_active_probes=5)).run_id
    first = api.offer_probes(rid, offers(0, 10, prefix="a"))
    assert (len(first.accepted), first.declined) == (3, 7)
    again_same_step = api.offer_probes(rid, offers(0, 10, prefix="b"))
    assert (again_same_step.accepted, again_same_step.declined) == ([], 10)
    second = api.offer_probes(rid, offers(1, 10, prefix="c"))
    assert len(second.accepted) == 2  # only 5 may be active
    assert api.telemetry(rid).probes["declined"] == 7 + 10 + 8
    assert api.telemetry(rid).probes["active"] == 5


def test_uniform_selection_is_reproducible_from_the_seed(api):
    a = api.register_run(run_spec(offers_per_step=4, seed=11)).run_id
    b = api.register_run(run_spec(offers_per_step=4, seed=11)).run_id
    picks_a = api.offer_probes(a, offers(3, 20)).accepted
    assert picks_a == api.offer_probes(b, offers(3, 20)).accepted
    assert picks_a == sorted(picks_a, key=lambda s: int(s[1:]))  # submission order = offer order
    others = {tuple(api.offer_probes(api.register_run(run_spec(offers_per_step=4, seed=s)).run_id, offers(3, 20)).accepted) for s in range(6)}
    assert len(others) > 1  # the seed matters


def test_stratified_selection_spreads_over_prompts(api):
    rid = api.register_run(run_spec(offers_per_step=4, selection="stratified")).run_id
    acc = api.offer_probes(rid, offers(0, 16, prompts=4)).accepted  # prompt of s{i} is p{i % 4}
    assert sorted(int(s[1:]) % 4 for s in acc) == [0, 1, 2, 3]


def test_duplicate_sample_ids_are_declined(api):
    rid = api.register_run(run_spec()).run_id
    api.offer_probes(rid, offers(0, 2))
    again = api.offer_probes(rid, offers(1, 2))
    assert (again.accepted, again.declined) == ([], 2)


def test_plan_extends_by_the_window_and_forces_probes_at_the_staleness_limit(api):
    rid = api.register_run(run_spec(staleness_limit=3)).run_id
    api.offer_probes(rid, offers(0, 2, prefix="old"))
    api.offer_probes(rid, offers(2, 2, prefix="new"))
    plan = api.probe_plan(rid, 3)
    assert plan.extend_by == CANDIDATES[-1]
    assert plan.active == ["old0", "old1", "new0", "new1"]
    assert plan.force_complete == ["old0", "old1"]
    assert api.probe_plan(rid, 2).force_complete == []


def test_probe_reports_walk_the_state_machine(api):
    rid = api.register_run(run_spec()).run_id
    api.offer_probes(rid, offers(0, 3))
    out = api.report_probe(rid, ProbeReportIn(probe_id="s0", step=1, tokens_added=4, version=1))
    assert (out.state, out.tokens, out.oldest_version, out.newest_version) == ("active", 7, 0, 1)
    out = api.report_probe(rid, ProbeReportIn(probe_id="s0", step=2, tokens_added=2, version=2, forced=True))
    assert (out.state, out.tokens, out.newest_version, out.forced) == ("complete", 9, 2, True)
    assert api.report_probe(rid, ProbeReportIn(probe_id="s1", step=2, tokens_added=0, version=2, dropped=True)).state == "dropped"
    with pytest.raises(ProbeConflict):
        api.report_probe(rid, ProbeReportIn(probe_id="s0", step=3, tokens_added=1, version=3))
    with pytest.raises(UnknownProbe):
        api.report_probe(rid, ProbeReportIn(probe_id="ghost", step=3, tokens_added=1, version=3))
    counts = api.telemetry(rid).probes
    assert (counts["active"], counts["complete"], counts["dropped"], counts["forced"]) == (1, 1, 1, 1)


def test_windowed_fifo_lets_short_probes_overtake_by_at_most_the_lookahead(api):
    rid = api.register_run(run_spec(probe_batch_size=2, lookahead=1)).run_id
    api.offer_probes(rid, offers(0, 6))  # s0..s5 in submission order
    for pid in ("s2", "s3", "s4", "s5"):
        finish(api, rid, pid)
    assert api.next_probe_batch(rid) is None  # head window [s0, s1, s2]: only s2 is ready
    finish(api, rid, "s1")
    assert api.next_probe_batch(rid).probe_ids == ["s1", "s2"]
    assert api.next_probe_batch(rid).probe_ids == ["s3", "s4"]  # window [s0, s3, s4]
    assert api.next_probe_batch(rid) is None  # window [s0, s5]: the long head s0 holds s5 back
    finish(api, rid, "s0")
    assert api.next_probe_batch(rid).probe_ids == ["s0", "s5"]


def test_dropped_probes_leave_the_fifo_head(api):
    rid = api.register_run(run_spec(probe_batch_size=2, lookahead=0)).run_id
    api.offer_probes(rid, offers(0, 3))
    finish(api, rid, "s1")
    finish(api, rid, "s2")
    assert api.next_probe_batch(rid) is None
    api.report_probe(rid, ProbeReportIn(probe_id="s0", step=1, tokens_added=0, version=1, dropped=True))
    assert api.next_probe_batch(rid).probe_ids == ["s1", "s2"]


def test_repeated_batch_call_with_the_same_key_returns_the_same_batch(api):
    rid = api.register_run(run_spec(probe_batch_size=2)).run_id
    api.offer_probes(rid, offers(0, 4))
    for pid in ("s0", "s1", "s2", "s3"):
        finish(api, rid, pid)
    a = api.next_probe_batch(rid, idempotency_key="b1")
    b = api.next_probe_batch(rid, idempotency_key="b1")
    c = api.next_probe_batch(rid)
    assert a == b and a.probe_ids == ["s0", "s1"] and c.probe_ids == ["s2", "s3"] and c.audit_id != a.audit_id


def test_repeated_offer_with_the_same_key_is_applied_once(api):
    rid = api.register_run(run_spec(offers_per_step=2)).run_id
    a = api.offer_probes(rid, offers(0, 5), idempotency_key="o1")
    b = api.offer_probes(rid, offers(0, 5), idempotency_key="o1")
    assert a == b
    assert api.telemetry(rid).probes["declined"] == 3


# --- audits ------------------------------------------------------------------------------------


def test_cosine_audit_picks_the_shortest_candidate_clearing_the_threshold(api):
    rid = api.register_run(run_spec()).run_id
    batch = _batch(api, rid)
    out = api.submit_audit(rid, batch.audit_id, AuditIn(cosines={4: 0.5, 8: 0.71, 16: 0.99}))
    assert out.state == "decided" and out.decision.window == 8 and out.decision.reason == "audit"
    w = api.get_window(rid, 5)
    assert (w.window, w.reason, w.audit_id, w.cosines) == (8, "audit", batch.audit_id, {4: 0.5, 8: 0.71, 16: 0.99})
    tel = api.telemetry(rid)
    assert tel.probes["audited"] == 2 and tel.audits[-1]["state"] == "decided"
    assert [d["reason"] for d in tel.decisions] == ["initial", "audit"]


def test_a_skipped_audit_consumes_its_batch_and_leaves_the_window_and_the_decisions(api):
    rid = api.register_run(run_spec()).run_id
    first = _batch(api, rid)
    api.submit_audit(rid, first.audit_id, AuditIn(cosines={4: 0.5, 8: 0.9}))
    second = _batch(api, rid, step=1)
    out = api.submit_audit(rid, second.audit_id, AuditIn(skipped=True, stats={"probes": 2.0}))
    assert out.state == "decided" and out.decision is None
    w = api.get_window(rid, 3)
    assert (w.window, w.reason, w.audit_id) == (8, "audit", first.audit_id)  # the last measured decision holds
    tel = api.telemetry(rid)
    assert [d["reason"] for d in tel.decisions] == ["initial", "audit"] and tel.probes["audited"] == 4
    assert tel.audits[-1]["kind"] == "skipped" and tel.audits[-1]["cosines"] is None
    with pytest.raises(AuditConflict):  # closed, like a decided audit
        api.submit_audit(rid, second.audit_id, AuditIn(cosines={4: 0.9}))
    third = _batch(api, rid, step=2)
    with pytest.raises(InvalidInput, match="skipped"):  # a skip carries no measurement
        api.submit_audit(rid, third.audit_id, AuditIn(skipped=True, cosines={4: 0.9}))


def test_a_noise_hold_policy_decides_on_the_audits_signal_z_and_noise_readings_in_its_stats(api):
    opts = {"confidence": 1.0, "noise_hold": 1.0, "grow_to": 1.0, "signal_z": 3.0}
    rid = api.register_run(run_spec(policy={"candidates": CANDIDATES, "max_len": MAX_LEN, "options": opts})).run_id
    ci = {4: (0.8, 0.9), 8: (0.85, 0.95), 16: (0.9, 1.0)}  # 4 is surely above the threshold
    cos = {c: (lo + hi) / 2 for c, (lo, hi) in ci.items()}
    first = _batch(api, rid)
    out = api.submit_audit(rid, first.audit_id, AuditIn(cosines=cos, cosine_ci=ci, stats={"signal_z": 1.0}))
    assert out.decision.window == max(CANDIDATES)  # no shared signal: the window holds
    second = _batch(api, rid, step=1)
    noise = {"noise_cos_4": 0.85, "noise_cos_8": 0.1, "noise_cos_16": 0.1}  # 4's interval holds its noise reading
    out = api.submit_audit(rid, second.audit_id, AuditIn(cosines=cos, cosine_ci=ci, stats={"signal_z": 5.0} | noise))
    assert out.decision.window == 8
    assert api.telemetry(rid).audits[-1]["stats"]["noise_cos_4"] == 0.85


@pytest.mark.parametrize("fallback, window", [("hold", max(CANDIDATES)), ("horizon", MAX_LEN), ("decide", 4)])
def test_an_audit_whose_samples_are_far_below_its_noise_scale_is_marked_unresolved_and_follows_the_fallback(
        api, fallback, window):
    from adwin.policies.resolution import UNRESOLVED

    opts = {"unresolved": float(UNRESOLVED.index(fallback))}
    rid = api.register_run(run_spec(policy={"candidates": CANDIDATES, "max_len": MAX_LEN, "options": opts})).run_id
    cos = {4: 0.9, 8: 0.95, 16: 0.99}  # the paper's rule: 4
    first = _batch(api, rid)
    noisy = {"signal_z": 4.0, "noise_scale": 400.0, "evidence_samples": 16.0}  # z enough, but N far below B
    out = api.submit_audit(rid, first.audit_id, AuditIn(cosines=cos, stats=noisy))
    assert (out.decision.reason, out.decision.window) == ("unresolved", window)
    second = _batch(api, rid, step=1)
    strong = {"signal_z": 12.0, "noise_scale": 3.0, "evidence_samples": 16.0}
    out = api.submit_audit(rid, second.audit_id, AuditIn(cosines=cos, stats=strong))
    assert (out.decision.reason, out.decision.window) == ("audit", 4)  # resolved: the rule, unchanged
    reasons = [(d["reason"], d["audit_id"]) for d in api.telemetry(rid).decisions]
    assert reasons[-2:] == [("unresolved", first.audit_id), ("audit", second.audit_id)]
    assert api.telemetry(rid).audits[0]["stats"] == noisy  # the measured z, B and N, as the dashboard reads them


def test_no_candidate_clearing_the_threshold_falls_back_to_the_full_horizon(api):
    rid = api.register_run(run_spec()).run_id
    batch = _batch(api, rid)
    assert api.submit_audit(rid, batch.audit_id, AuditIn(cosines={4: 0.1, 8: 0.2, 16: 0.3})).decision.window == MAX_LEN


def test_gram_audit_matches_the_reference_cosines(api):
    rid = api.register_run(run_spec()).run_id
    batch = _batch(api, rid)
    g = np.random.default_rng(0).normal(size=(4, 9))
    gram = g @ g.T  # (K+1, K+1)
    out = api.submit_audit(rid, batch.audit_id, AuditIn(gram=gram.tolist()))
    ref = cosines_from_gram(gram, CANDIDATES)
    assert out.cosines.keys() == ref.keys()
    assert all(math.isclose(out.cosines[c], ref[c], rel_tol=1e-9, abs_tol=1e-12) for c in ref)


def test_sketch_audit_waits_for_every_rank_then_decides_on_the_summed_sketch(api):
    rid = api.register_run(run_spec(world_size=3)).run_id
    batch = _batch(api, rid)
    rng = np.random.default_rng(1)
    sketches = rng.normal(size=(3, 4, 32)).astype(np.float32)  # (R, K+1, D)
    for r in (2, 0):
        out = api.submit_audit(rid, batch.audit_id, AuditIn(rank=r, sketch_b64=sketch_b64(sketches[r]), sketch_shape=(4, 32)))
        assert out.state == "pending" and out.decision is None
    assert api.get_window(rid, 1).reason == "initial"
    with pytest.raises(AuditConflict):
        api.submit_audit(rid, batch.audit_id, AuditIn(rank=0, sketch_b64=sketch_b64(sketches[0]), sketch_shape=(4, 32)))
    out = api.submit_audit(rid, batch.audit_id, AuditIn(rank=1, sketch_b64=sketch_b64(sketches[1]), sketch_shape=(4, 32)))
    total = sketches.astype(np.float64).sum(0)
    ref = cosines_from_gram(total @ total.T, CANDIDATES)
    assert out.state == "decided" and out.ranks_received == 3
    assert all(math.isclose(out.cosines[c], ref[c], rel_tol=1e-9, abs_tol=1e-12) for c in ref)


def test_raw_sketches_decide_like_base64_ones_and_mix_with_them(api):
    rid = api.register_run(run_spec(world_size=2)).run_id
    batch = _batch(api, rid)
    rng = np.random.default_rng(2)
    sketches = rng.normal(size=(2, 4, 64)).astype(np.float32)  # (R, K+1, D)
    out = api.submit_sketch(rid, batch.audit_id, 1, sketches[1], stats={"elapsed_s": 0.5}, macro_cosines={4: 0.5})
    assert (out.state, out.ranks_received) == ("pending", 1)
    again = api.submit_sketch(rid, batch.audit_id, 0, sketches[0], idempotency_key="k0")
    assert again == api.submit_sketch(rid, batch.audit_id, 0, sketches[0], idempotency_key="k0")  # applied once
    total = sketches.astype(np.float64).sum(0)
    ref = cosines_from_gram(total @ total.T, CANDIDATES)
    assert again.state == "decided" and all(math.isclose(again.cosines[c], ref[c], rel_tol=1e-9) for c in ref)
    audit = api.telemetry(rid).audits[-1]
    assert audit["stats"] == {"elapsed_s": 0.5} and audit["macro_cosines"] == {"4": 0.5}


@pytest.mark.parametrize(
    "sketch, kw, match",
    [
        (np.ones((3, 8), np.float32), {}, "sketch_shape"),  # K+1 must be 4
        (np.ones(8, np.float32), {}, "2-d"),
        (np.full((4, 8), np.nan, np.float32), {}, "non-finite"),
        (np.ones((4, 8), np.float32), {"stats": {"t": float("inf")}}, "non-finite"),
        (np.ones((4, 8), np.float32), {"macro_cosines": {5: 0.5}}, "unknown candidates"),
    ],
)
def test_malformed_raw_sketches_are_refused(api, sketch, kw, match):
    rid = api.register_run(run_spec()).run_id
    batch = _batch(api, rid)
    with pytest.raises(InvalidInput, match=match):
        api.submit_sketch(rid, batch.audit_id, 0, sketch, **kw)
    with pytest.raises(UnknownRun):
        api.submit_sketch("no-such-run", batch.audit_id, 0, np.ones((4, 8), np.float32))
    with pytest.raises(AuditConflict):
        api.submit_sketch(rid, 999, 0, np.ones((4, 8), np.float32))


def test_audit_conflicts_for_unknown_or_already_decided_audits(api):
    rid = api.register_run(run_spec()).run_id
    with pytest.raises(AuditConflict):
        api.submit_audit(rid, 99, AuditIn(cosines={4: 1.0}))
    batch = _batch(api, rid)
    api.submit_audit(rid, batch.audit_id, AuditIn(cosines={4: 1.0}))
    with pytest.raises(AuditConflict):
        api.submit_audit(rid, batch.audit_id, AuditIn(cosines={4: 1.0}))


def test_repeated_audit_with_the_same_key_returns_the_original_decision(api):
    rid = api.register_run(run_spec()).run_id
    batch = _batch(api, rid)
    a = api.submit_audit(rid, batch.audit_id, AuditIn(cosines={4: 0.9}), idempotency_key="a1")
    b = api.submit_audit(rid, batch.audit_id, AuditIn(cosines={4: 0.9}), idempotency_key="a1")
    assert a == b and len(api.telemetry(rid).decisions) == 2


@pytest.mark.parametrize(
    "audit",
    [
        AuditIn(cosines={5: 0.9}),  # unknown candidate
        AuditIn(cosines={}),
        AuditIn(gram=[[1.0, 0.0], [0.0, 1.0]]),  # wrong shape for 3 candidates
        AuditIn(sketch_b64="AAAA", sketch_shape=(4, 8)),  # 3 bytes, not 4 * 4 * 8
        AuditIn(sketch_b64="not base64!", sketch_shape=(4, 1)),
        AuditIn(sketch_b64="AAAAAA==", sketch_shape=(3, 1)),  # K+1 must be 4
        AuditIn(cosines={4: 0.9}, gram=[[1.0] * 4] * 4),  # two kinds at once
        AuditIn(),
        AuditIn(rank=5, cosines={4: 0.9}),  # world_size 1
    ],
)
def test_malformed_audits_are_refused_and_leave_the_window(api, audit):
    rid = api.register_run(run_spec()).run_id
    batch = _batch(api, rid)
    with pytest.raises(InvalidInput):
        api.submit_audit(rid, batch.audit_id, audit)
    assert api.get_window(rid, 1).window == CANDIDATES[-1]
    # the audit is still open: a valid submission decides it
    assert api.submit_audit(rid, batch.audit_id, AuditIn(cosines={4: 0.95})).decision.window == 4


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_audits_are_refused_and_recorded_as_fallback(api, bad):
    rid = api.register_run(run_spec()).run_id
    first = _batch(api, rid)
    api.submit_audit(rid, first.audit_id, AuditIn(cosines={8: 0.9}))
    second = _batch(api, rid, step=1)
    with pytest.raises(InvalidInput, match="non-finite"):
        api.submit_audit(rid, second.audit_id, AuditIn(cosines={4: bad, 8: 0.9}))
    w = api.get_window(rid, 2)
    assert (w.window, w.reason, w.audit_id) == (8, "fallback", second.audit_id)
    assert api.telemetry(rid).decisions[-1]["reason"] == "fallback"


def test_a_non_finite_audit_is_refused_as_its_own_type_in_process_and_over_http(api):
    from adwin.audit.errors import NonFiniteAuditError

    rid = api.register_run(run_spec()).run_id
    batch = _batch(api, rid)
    with pytest.raises(NonFiniteAudit) as err:
        api.submit_audit(rid, batch.audit_id, AuditIn(cosines={4: float("nan"), 8: 0.9}))
    assert isinstance(err.value, InvalidInput) and isinstance(err.value, NonFiniteAuditError)


def test_an_unknown_candidate_is_invalid_input_but_not_a_non_finite_audit(api):
    from adwin.runtime.guards import is_non_finite_audit

    rid = api.register_run(run_spec()).run_id
    batch = _batch(api, rid)
    with pytest.raises(InvalidInput) as err:
        api.submit_audit(rid, batch.audit_id, AuditIn(cosines={3: 0.9}))
    assert not isinstance(err.value, NonFiniteAudit) and not is_non_finite_audit(err.value)


def test_non_finite_gram_and_sketch_are_refused(api):
    rid = api.register_run(run_spec()).run_id
    batch = _batch(api, rid)
    gram = np.eye(4)
    gram[1, 2] = np.nan
    with pytest.raises(InvalidInput, match="non-finite"):
        api.submit_audit(rid, batch.audit_id, AuditIn(gram=gram.tolist()))
    sk = np.ones((4, 2), dtype=np.float32)
    sk[0, 0] = np.inf
    with pytest.raises(InvalidInput, match="non-finite"):
        api.submit_audit(rid, batch.audit_id, AuditIn(sketch_b64=sketch_b64(sk), sketch_shape=(4, 2)))


def test_schedule_runs_record_audits_without_moving_the_window(api):
    rid = api.register_run(run_spec(policy={"name": "fixed", "window": 8, "candidates": CANDIDATES, "max_len": MAX_LEN})).run_id
    batch = _batch(api, rid)
    out = api.submit_audit(rid, batch.audit_id, AuditIn(cosines={4: 0.99}))
    assert (out.decision.window, out.decision.reason) == (8, "schedule")
    assert api.get_window(rid, 3).window == 8


# --- steps and telemetry -------------------------------------------------------------------------


def test_step_metrics_round_trip_through_telemetry(api):
    rid = api.register_run(run_spec()).run_id
    for step in range(4):
        api.report_step(rid, StepMetricsIn(step=step, metrics={"loss/total": 1.0 / (step + 1), "window/current": 16}))
    api.report_step(rid, StepMetricsIn(step=3, metrics={"eval/accuracy": 0.5}))  # merged into step 3
    tel = api.telemetry(rid, since_step=2)
    assert [s["step"] for s in tel.steps] == [2, 3]
    assert tel.steps[1]["metrics"] == {"loss/total": 0.25, "window/current": 16, "eval/accuracy": 0.5}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_step_metrics_are_refused(api, bad):
    rid = api.register_run(run_spec()).run_id
    with pytest.raises(InvalidInput, match="loss/total"):
        api.report_step(rid, StepMetricsIn(step=0, metrics={"loss/total": bad}))
    assert api.telemetry(rid).steps == []


def test_out_of_range_steps_and_audit_ids_are_invalid_input(api):
    rid = api.register_run(run_spec()).run_id
    for call in (
        lambda: api.get_window(rid, 2**53),
        lambda: api.probe_plan(rid, 2**53),
        lambda: api.telemetry(rid, since_step=2**53),
        lambda: api.submit_audit(rid, 0, AuditIn(cosines={4: 1.0})),
    ):
        with pytest.raises(InvalidInput):
            call()


def test_reads_do_not_move_the_run_step_and_a_batch_forms_at_the_step_its_caller_gives(api):
    rid = api.register_run(run_spec(probe_batch_size=2, staleness_limit=5)).run_id
    api.offer_probes(rid, offers(0, 2))
    for pid in ("s0", "s1"):
        finish(api, rid, pid, step=1)
    api.get_window(rid, 40)  # reads: neither may age the probes past S
    api.probe_plan(rid, 40)
    batch = api.next_probe_batch(rid, step=4)
    assert batch is not None and (batch.version, batch.staleness_max) == (4, 4)
