"""``loss.oapl`` and ``asyncopd.sync_every``: what loads, and every refusal names its field and the fix."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from adwin.config import lag_of, load_config

OAPL = {"scheduler": "asyncopd", "loss.name": "oapl", "rollout.samples_per_prompt": 4, "window.policy": "full"}


def test_oapl_loads_with_its_defaults_and_the_paper_s_two_betas() -> None:
    cfg = load_config(None, OAPL | {"loss.oapl.beta": 1e-3, "loss.oapl.value_beta": 1.0, "loss.oapl.lag": 50})
    o = cfg.loss.oapl
    assert (o.beta, o.value_beta, o.lag, o.reward) == (1e-3, 1.0, 50, "teacher")
    assert lag_of(cfg) == 50
    assert lag_of(load_config(None, {"scheduler": "asyncopd", "asyncopd.sync_every": 4})) == 4
    assert lag_of(load_config(None, OAPL)) == 1
    # teacher reward is defined on any window, audited ones included, while the lag stays within S
    adwin = load_config(None, OAPL | {"window.policy": "adwin", "loss.oapl.lag": 5, "probes.staleness_limit": 5})
    assert adwin.window.policy == "adwin"
    weighted = load_config(None, OAPL | {"loss.oapl.reward": "weighted", "loss.oapl.task_weight": 2.0})
    assert weighted.loss.oapl.task_weight == 2.0


@pytest.mark.parametrize("overrides,field,fix", [
    ({"scheduler": "sync"}, "loss.name", "scheduler: asyncopd"),
    ({"rollout.samples_per_prompt": 1}, "rollout.samples_per_prompt", ">= 2"),
    ({"rollout.temperature": 0.7}, "rollout.temperature", "1.0"),
    ({"asyncopd.sync_every": 4}, "asyncopd.sync_every", "loss.oapl.lag"),
    ({"loss.oapl.reward": "task", "window.policy": "adwin"}, "loss.oapl.reward", "window.policy: full"),
    ({"loss.oapl.reward": "weighted", "window.policy": "fixed", "window.window": 64}, "loss.oapl.reward",
     "window.policy: full"),
    ({"window.policy": "adwin", "loss.oapl.lag": 16}, "loss.oapl.lag", "<= 5"),
    ({"loss.oapl.task_weight": 2.0}, "loss.oapl.task_weight", "reward: weighted"),
    ({"loss.oapl.reward": "weighted", "loss.oapl.task_weight": 0.0, "loss.oapl.teacher_weight": 0.0},
     "loss.oapl.task_weight", "both 0"),
    ({"loss.aggregation": "seq-mean-token-sum"}, "loss.aggregation", "default"),
    ({"loss.mc_samples": 8}, "loss.mc_samples", "leave it at 1"),
    ({"loss.is_method": "clip"}, "loss.is_method", "unset"),
    ({"loss.oapl.beta": 0.0}, "beta", "greater than 0"),
    ({"loss.oapl.lag": 0}, "lag", "greater than or equal to 1"),
])
def test_invalid_oapl_settings_fail_at_load_naming_the_field_and_the_fix(overrides: dict[str, Any], field: str,
                                                                         fix: str) -> None:
    with pytest.raises(ValidationError) as e:
        load_config(None, OAPL | overrides)
    assert field in str(e.value) and fix in str(e.value)


def test_oapl_knobs_without_oapl_and_the_lag_of_is_with_audits_are_refused() -> None:
    with pytest.raises(ValidationError, match=r"loss.oapl.lag: read only by loss.name: oapl"):
        load_config(None, {"scheduler": "asyncopd", "loss.oapl.lag": 4})
    with pytest.raises(ValidationError, match="asyncopd.sync_every: read only by scheduler 'asyncopd'"):
        load_config(None, {"asyncopd.sync_every": 4})
    with pytest.raises(ValidationError, match=r"asyncopd.sync_every: probes come from weights up to 7 updates old"):
        load_config(None, {"scheduler": "asyncopd", "asyncopd.sync_every": 8})
    ok = load_config(None, {"scheduler": "asyncopd", "asyncopd.sync_every": 8, "window.policy": "full"})
    assert ok.asyncopd.sync_every == 8
