"""The audit section of the config and window.confidence: invalid settings fail at load, naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from adwin.config import load_config
from adwin.policies.adaptive import AdaptiveWindow
from adwin.policies.registry import build_policy


@pytest.mark.parametrize(("key", "value", "field"), [
    ("audit.params", "top:0", "audit.params"), ("audit.params", "last:2", "audit.params"),
    ("audit.estimator", "split", "estimator"), ("audit.ci_level", 1.0, "ci_level"),
    ("audit.ci_samples", 5, "ci_samples"), ("audit.every", 0, "every"), ("audit.skip_margin", 1.0, "skip_margin"),
])
def test_bad_audit_settings_fail_at_load_naming_the_field(key: str, value: object, field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        load_config(None, {key: value})


def test_confidence_needs_an_interval_and_an_audited_policy() -> None:
    with pytest.raises(ValidationError, match="audit.ci_level"):
        load_config(None, {"window.confidence": True})
    with pytest.raises(ValidationError, match="window.confidence"):
        load_config(None, {"window.confidence": True, "window.policy": "full", "audit.ci_level": 0.9})


def test_confidence_reaches_the_policy() -> None:
    cfg = load_config(None, {"window.confidence": True, "audit.ci_level": 0.9, "audit.params": "top:2"})
    w = cfg.window
    p = build_policy(w.policy, max_len=cfg.rollout.max_response_len, candidates=w.candidates,
                     threshold=w.threshold, options=w.policy_options())
    assert isinstance(p, AdaptiveWindow) and p.confidence
    assert cfg.audit.params == "top:2" and not cfg.audit.macro


def test_a_run_config_written_with_the_retired_audit_loss_still_loads() -> None:
    # config.json of runs made before audit.loss was removed (its only value was reverse_kl_pg): --resume
    assert load_config(None, {"audit.loss": "reverse_kl_pg"}).audit.method == "fast"
    with pytest.raises(ValidationError, match="loss"):
        load_config(None, {"audit.loss": "k3"})
