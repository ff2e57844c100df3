"""A run with window.noise_hold and audit.evidence_audits: every audit logs its pure-noise readings and signal z,
pooled decisions log what they read, and the controller's policy decided on the same evidence."""

from __future__ import annotations

from pathlib import Path

from trainer_fixtures import tiny_overrides

from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop.trainer import train


def test_audits_carry_noise_readings_and_signal_z_and_pool_earlier_audits(tmp_path: Path) -> None:
    cfg = load_config(None, tiny_overrides(
        tmp_path, steps=6, name="evidence", **{"probes.backend": "inline", "audit.ci_level": 0.9,
                                               "audit.estimator": "debiased", "window.confidence": True,
                                               "window.noise_hold": True, "audit.evidence_audits": 3,
                                               "audit.budget": None}))
    controller = Controller()
    res = train(cfg, controller)
    audits = [h for h in res.history if "audit/id" in h]
    assert len(audits) >= 2
    for h in audits:
        assert "audit/signal_z" in h
        assert all(h[f"audit/noise_cos_{c}"] == 0.0 for c in cfg.window.candidates)  # debiased: noise reads 0
    assert max(h.get("audit/evidence_audits", 1.0) for h in audits) >= 2  # a later decision read earlier audits
    assert max(h.get("audit/evidence_samples", 0.0) for h in audits) >= 2 * cfg.probes.batch_size
    tel = controller.telemetry(res.run_id)
    decided = [a for a in tel.audits if a["state"] == "decided"]
    assert decided and all("signal_z" in a["stats"] and "noise_cos_4" in a["stats"] for a in decided)
