"""The optional cosine interval of an audit (AuditIn.cosine_ci): validated, stored with the audit, and the
evidence a ``confidence`` ADWIN run decides on. In-process and over HTTP."""

from __future__ import annotations

import numpy as np
import pytest
from controller_harness import CANDIDATES, MAX_LEN, run_spec, sketch_b64
from controller_harness import ready_batch as _batch

from adwin.controller import InvalidInput
from adwin.controller.schemas import AuditIn

SURE = {"name": "adwin", "candidates": CANDIDATES, "max_len": MAX_LEN, "options": {"confidence": 1.0}}


def test_a_straddling_interval_keeps_the_window_a_clear_one_moves_it(api):
    rid = api.register_run(run_spec(policy=SURE)).run_id
    cos = {4: 0.72, 8: 0.8, 16: 0.95}  # the point rule would pick 4
    out = api.submit_audit(rid, _batch(api, rid).audit_id,
                           AuditIn(cosines=cos, cosine_ci={4: (0.6, 0.8), 8: (0.65, 0.9), 16: (0.9, 1.0)}))
    assert out.decision.window == 16
    out = api.submit_audit(rid, _batch(api, rid, step=1).audit_id,
                           AuditIn(cosines=cos, cosine_ci={4: (0.6, 0.8), 8: (0.71, 0.9), 16: (0.9, 1.0)}))
    assert out.decision.window == 8
    stats = api.telemetry(rid).audits[-1]["stats"]
    assert (stats["cos_ci_low_8"], stats["cos_ci_high_8"]) == (0.71, 0.9)


def test_a_confidence_run_refuses_an_audit_without_intervals(api):
    rid = api.register_run(run_spec(policy=SURE)).run_id
    with pytest.raises(InvalidInput, match="audit.ci_level"):
        api.submit_audit(rid, _batch(api, rid).audit_id, AuditIn(cosines={4: 0.9, 8: 0.9, 16: 0.9}))


def test_a_plain_run_stores_the_interval_and_decides_on_the_points(api):
    rid = api.register_run(run_spec()).run_id
    out = api.submit_audit(rid, _batch(api, rid).audit_id,
                           AuditIn(cosines={4: 0.72, 8: 0.8, 16: 0.95}, cosine_ci={4: (0.6, 0.8)}))
    assert out.decision.window == 4
    assert api.telemetry(rid).audits[-1]["stats"]["cos_ci_low_4"] == 0.6


@pytest.mark.parametrize("ci", [{4: (0.8, 0.6)}, {4: (-1.5, 0.2)}, {5: (0.1, 0.2)}])
def test_malformed_intervals_are_refused(api, ci):
    rid = api.register_run(run_spec()).run_id
    batch = _batch(api, rid)
    with pytest.raises(InvalidInput):
        api.submit_audit(rid, batch.audit_id, AuditIn(cosines={4: 0.9}, cosine_ci=ci))
    assert api.submit_audit(rid, batch.audit_id, AuditIn(cosines={4: 0.95})).decision.window == 4


def test_non_finite_intervals_are_refused_as_a_fallback(api):
    rid = api.register_run(run_spec()).run_id
    batch = _batch(api, rid)
    with pytest.raises(InvalidInput, match="non-finite"):
        api.submit_audit(rid, batch.audit_id, AuditIn(cosines={4: 0.9}, cosine_ci={4: (float("nan"), 0.9)}))
    assert api.get_window(rid, 1).reason == "fallback"


def test_intervals_with_multi_rank_sketches_are_refused(api):
    rid = api.register_run(run_spec(world_size=2)).run_id
    batch = _batch(api, rid)
    sk = np.ones((4, 8), dtype=np.float32)
    with pytest.raises(InvalidInput, match="world_size 1"):
        api.submit_audit(rid, batch.audit_id, AuditIn(sketch_b64=sketch_b64(sk), sketch_shape=(4, 8), cosine_ci={4: (0.1, 0.2)}))
