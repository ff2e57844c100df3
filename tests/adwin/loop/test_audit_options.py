"""The audit's config options reach the audit the trainer runs, and what it returns reaches the controller."""

from __future__ import annotations

from pathlib import Path

from trainer_fixtures import tiny_overrides

from adwin.config import AuditConfig, load_config
from adwin.controller import Controller
from adwin.loop.trainer import train
from adwin.probes.settings import run_audit_settings

FIXED = {"loss"}  # the audit's loss is reverse_kl_pg by definition (one allowed value)
SCHEDULE = {"every", "skip_margin", "skip_history", "max_skips"}  # which batches to audit: ProbeClient.schedule
BUDGET = {"budget", "pool_max", "budget_seconds"}  # when to offer and audit: adwin.audit.budget.DecisionBudget


def test_every_audit_option_of_the_config_reaches_the_audit_settings(tmp_path: Path) -> None:
    chosen = {"audit.method": "reference", "audit.metric": "adam", "audit.sketch_dim": 64, "audit.macro": True,
              "audit.params": "top:1", "audit.estimator": "debiased", "audit.ci_level": 0.8, "audit.ci_samples": 50,
              "audit.evidence_audits": 3, "audit.evidence_decay": 0.5}
    cfg = load_config(None, tiny_overrides(tmp_path, **chosen))
    settings = run_audit_settings(cfg)
    for name in set(AuditConfig.model_fields) - FIXED - SCHEDULE - BUDGET:
        assert getattr(settings, name) == getattr(cfg.audit, name), name
    assert {k.split(".")[1] for k in chosen} == set(AuditConfig.model_fields) - FIXED - SCHEDULE - BUDGET  # none untested


def test_confidence_run_sends_intervals_and_logs_changes_per_audit(tmp_path: Path) -> None:
    cfg = load_config(None, tiny_overrides(tmp_path, steps=4, name="ci", **{
        "audit.ci_level": 0.9, "window.confidence": True, "audit.params": "top:1", "probes.backend": "inline"}))
    controller = Controller()
    res = train(cfg, controller)
    audited = [h for h in res.history if "audit/id" in h]
    assert audited, "a 4-step run with P=2 must audit"
    for h in audited:
        for c in cfg.window.candidates:
            assert h[f"audit/cos_ci_low_{c}"] <= h[f"audit/micro_cos_{c}"] <= h[f"audit/cos_ci_high_{c}"]
        assert 0.0 <= h["window/changes_per_audit"] <= 1.0
    stored = [a for a in controller.telemetry(res.run_id).audits if a["state"] == "decided"]
    assert stored and all(f"cos_ci_low_{cfg.window.candidates[0]}" in a["stats"] for a in stored)


def test_audit_every_two_audits_every_other_ready_batch_and_closes_the_rest(tmp_path: Path) -> None:
    cfg = load_config(None, tiny_overrides(tmp_path, steps=6, name="every", **{
        "audit.every": 2, "audit.budget": None, "probes.backend": "inline"}))
    controller = Controller()
    res = train(cfg, controller)
    audited = sum(h.get("audit/submitted", 0.0) for h in res.history)
    skipped = sum(h.get("audit/skipped", 0.0) for h in res.history)
    assert audited >= 1 and skipped >= 1 and audited - skipped in (0.0, 1.0)  # 1st, 3rd, ... of the ready batches
    tel = controller.telemetry(res.run_id)
    kinds = [a["kind"] for a in tel.audits if a["state"] == "decided"]
    assert kinds.count("skipped") == skipped and len(kinds) - kinds.count("skipped") == audited
    assert kinds[0] != "skipped" and not [a for a in tel.audits if a["state"] == "pending"]
    assert len([d for d in tel.decisions if d["reason"] == "audit"]) == audited  # a skip decides nothing
