"""audit.every and the stability rule: which ready probe batches get audited, and what is counted."""

from __future__ import annotations

import pytest

from adwin.audit.schedule import AuditSchedule

FAR = {32: 0.1, 64: 0.95}  # every candidate at least 0.25 from the 0.7 threshold
NEAR = {32: 0.68, 64: 0.95}


def _run(s: AuditSchedule, cosines: list[dict[int, float]]) -> list[bool]:
    out = []
    for cos in cosines:
        ran = s.should_audit()
        out.append(ran)
        if ran:
            s.record(cos)
    return out


def test_by_default_every_ready_batch_is_audited() -> None:
    s = AuditSchedule(threshold=0.7)
    assert _run(s, [FAR] * 6) == [True] * 6 and s.skipped == 0 and s.audited == 6


def test_every_k_audits_one_batch_in_k() -> None:
    s = AuditSchedule(threshold=0.7, every=3)
    assert _run(s, [NEAR] * 7) == [True, False, False, True, False, False, True]
    assert s.metrics() == {"audit/ready": 7.0, "audit/audited": 3.0, "audit/skipped": 4.0}


def test_stable_cosines_far_from_the_threshold_are_skipped_at_most_max_skips_in_a_row() -> None:
    s = AuditSchedule(threshold=0.7, skip_margin=0.2, skip_history=2, max_skips=2)
    assert _run(s, [FAR] * 8) == [True, True, False, False, True, False, False, True]


def test_a_cosine_near_the_threshold_stops_the_skipping() -> None:
    s = AuditSchedule(threshold=0.7, skip_margin=0.2, skip_history=2, max_skips=5)
    assert _run(s, [FAR, FAR, FAR, NEAR, FAR, FAR]) == [True, True, False, False, False, False]
    s = AuditSchedule(threshold=0.7, skip_margin=0.2, skip_history=2, max_skips=5)
    assert _run(s, [FAR, NEAR, FAR, FAR, FAR]) == [True, True, True, True, False]


def test_state_round_trips() -> None:
    s = AuditSchedule(threshold=0.7, skip_margin=0.2)
    _run(s, [FAR, FAR, FAR])
    t = AuditSchedule(threshold=0.7, skip_margin=0.2)
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict() and t.should_audit() == s.should_audit()


@pytest.mark.parametrize(("kw", "field"), [({"every": 0}, "audit.every"), ({"skip_margin": 1.0}, "audit.skip_margin"),
                                           ({"skip_history": 0}, "audit.skip_history"), ({"max_skips": -1}, "audit.max_skips")])
def test_bad_settings_fail_naming_the_field(kw: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        AuditSchedule(threshold=0.7, **kw)  # type: ignore[arg-type]
