from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from adwin.config import TrainConfig, apply_policy_spec, load_config, parse_set


def test_defaults_validate():
    cfg = TrainConfig()
    assert cfg.window.threshold == 0.7 and cfg.window.policy == "adwin"


@pytest.mark.parametrize(
    "override, field",
    [
        ({"window.threshold": 1.5}, "threshold"),
        ({"window.threshold": 0}, "threshold"),
        ({"probes.staleness_limit": 0}, "staleness_limit"),
        ({"rollout.temperature": -1}, "temperature"),
        ({"window.candidates": [64, 32]}, "strictly increasing"),
        ({"window.candidates": [64, 100000]}, "max_len"),
        ({"optim.lr": 0}, "lr"),
        ({"rollout.typo_field": 1}, "typo_field"),
        ({"loss.name": "k3", "loss.is_method": "icepop"}, "loss.is_method"),
        ({"loss.name": "forward_kl", "loss.clip_low": 0.2, "loss.clip_high": 0.2}, "loss.clip_low"),
        ({"loss.clip_low": 0.2}, "loss.clip_high"),
        ({"loss.is_method": "clip", "loss.clip_low": 0.2, "loss.clip_high": 0.2}, "not both"),
        ({"loss.is_method": "clip", "loss.is_low": 3.0}, "loss.is_low"),
        ({"probes.is_method": "icepop", "probes.is_low": 3.0}, "probes.is_low"),
        ({"asyncopd.queue_depth": 2}, "asyncopd.queue_depth"),
        ({"asyncopd.workers": "ray"}, "asyncopd.workers"),
        ({"loss.name": "reverse_kl_mc"}, "scheduler: asyncopd"),
    ],
)
def test_invalid_config_fails_naming_the_field(override, field):
    with pytest.raises(ValidationError, match=field):
        load_config(None, override)


def test_yaml_preset_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("# adwin train --config c.yaml\nsteps: 3\nwindow:\n  threshold: 0.8\n")
    cfg = load_config(p, {"seed": 5})
    assert (cfg.steps, cfg.window.threshold, cfg.seed) == (3, 0.8, 5)


def test_a_prompt_file_set_on_the_command_line_is_the_task_and_a_built_in_task_refuses_one(tmp_path) -> None:
    """``--set data.path`` on a built-in-task preset trains on the file; a config that names a file for the built-in
    task (which makes its own prompts) is refused, naming the field, instead of leaving the file unread."""
    ov = parse_set([f"data.path={tmp_path / 'train.jsonl'}"])
    assert ov["data.task"] == "jsonl"
    assert load_config("configs/default.yaml", ov).data.task == "jsonl"
    assert parse_set(["data.path=x.jsonl", "data.task=builtin"])["data.task"] == "builtin"  # named: kept, then refused
    for field in ("path", "eval_path"):
        with pytest.raises(ValueError, match=f"data.{field} is read only when data.task is 'jsonl'"):
            load_config("configs/default.yaml", {f"data.{field}": "x.jsonl"})


def test_policy_spec_becomes_overrides():
    cfg = load_config(None, apply_policy_spec({}, "fixed:64"))
    assert cfg.window.policy == "fixed" and cfg.window.window == 64


def test_set_items_parse_as_yaml_and_new_candidates_drop_the_presets_initial_window() -> None:
    assert parse_set(["window.threshold=0.8", "rollout.top_p=1"]) == {"window.threshold": 0.8, "rollout.top_p": 1}
    ov = parse_set(["window.candidates=[8, 16]"])
    assert ov == {"window.candidates": [8, 16], "window.initial": None}
    cfg = load_config("configs/default.yaml", ov | {"rollout.max_response_len": 64})
    assert cfg.window.initial is None  # the preset's 128 would not fit the new candidates and horizon
    assert parse_set(["window.candidates=[8, 16]", "window.initial=8"])["window.initial"] == 8
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_set(["window.threshold"])


@pytest.mark.parametrize("spec", ["full", "fixed:32", "linear:32:8", "surprise", "adwin"])
def test_every_window_policy_spec_loads_on_the_default_preset(spec: str) -> None:
    # a preset may turn on window.confidence, which only audited policies accept: a switch of policy
    # (--window-policy, bench compare, bench probes) must not be refused for it
    from adwin.policies.registry import is_audited

    on = {"window.confidence": True}  # as a preset with the interval rule sets it
    cfg = load_config("configs/default.yaml", apply_policy_spec(dict(on), spec))
    assert cfg.window.policy == spec.split(":")[0] and cfg.window.confidence == is_audited(cfg.window.policy)
    with pytest.raises(ValidationError, match="window.confidence"):  # set by hand on a non-audited policy: refused
        load_config("configs/default.yaml", {"window.policy": "full", "window.confidence": True})

def test_window_unresolved_is_validated_before_compute_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="window.unresolved"):
        load_config(None, {"window.unresolved": "shrink"})
    with pytest.raises(ValidationError, match="resolve_samples"):
        load_config(None, {"window.resolve_samples": -1})
    # a fallback that moves the window needs audits that measure their signal z and noise scale
    with pytest.raises(ValidationError, match="window.unresolved: 'horizon' .* audit.ci_level"):
        load_config(None, {"window.unresolved": "horizon"})
    with pytest.raises(ValidationError, match="window.unresolved: 'noise_rule' .* audit.estimator"):
        load_config(None, {"window.unresolved": "noise_rule", "audit.estimator": "debiased"})
    cfg = load_config(None, {"window.unresolved": "noise_rule", "audit.ci_level": 0.9, "window.resolve_samples": 2})
    opts = cfg.window.policy_options()
    assert (opts["unresolved"], opts["resolve_samples"], opts["signal_z"]) == (2.0, 2.0, 3.0)
    assert "unresolved" not in load_config(None, {"window.policy": "full"}).window.policy_options()
    assert load_config(None, {"window.unresolved": "horizon", "window.policy": "full"}).window.policy == "full"


def test_asyncopd_knobs_load_under_their_scheduler_and_a_sync_run_reloads_its_own_dump() -> None:
    cfg = load_config(None, {"scheduler": "asyncopd", "asyncopd.queue_depth": 2})
    assert cfg.asyncopd.queue_depth == 2
    sync = TrainConfig()
    assert TrainConfig.model_validate(sync.model_dump(mode="json")) == sync  # --resume reads config.json back


@pytest.mark.parametrize(("field", "value"), [("backend", "inline"), ("workers", 2), ("fault_policy", "drop")])
def test_asyncopd_refuses_probe_worker_knobs_it_cannot_honour_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"probes\.{field}: scheduler 'asyncopd'"):
        load_config(None, {"scheduler": "asyncopd", f"probes.{field}": value})
    load_config(None, {"scheduler": "sync", f"probes.{field}": value})


def test_the_bare_word_off_in_yaml_or_set_means_off_not_false(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  autocast: off\nlogging:\n  wandb: off\n")  # YAML 1.1 reads both as false
    cfg = load_config(path, parse_set(["model.autocast=off"]))
    assert (cfg.model.autocast, cfg.logging.wandb) == ("off", "off")
    with pytest.raises(ValidationError, match="model.autocast"):  # on is not a value of the field
        load_config(None, parse_set(["model.autocast=on"]))
