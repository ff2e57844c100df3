"""Rules across config sections: one "does this run probe?", one loss table, one declaration of the policy
fields, the data-parallel probe backend, and settings no loop reads refused at load."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import typing

import pytest
from pydantic import ValidationError

from adwin.config import WindowSection, load_config
from adwin.config.loss import LossConfig
from adwin.controller.schemas import PolicyIn
from adwin.loop.sharding import check_data_parallel
from adwin.objectives.loss_table import LOSS_TRAIT_NAMES, LOSSES, losses_where
from adwin.objectives.losses import LOSS_NAMES
from adwin.policies.base import PolicyFields
from adwin.policies.fields import PolicyKnobs
from adwin.policies.registry import POLICIES, POLICY_NAMES, build_policy, is_audited

# --- "does this run probe?" -------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("offers", [0, 3])
def test_a_run_probes_exactly_when_its_policy_audits_and_offers_are_taken(policy: str, offers: int) -> None:
    ov = {"window.policy": policy, "probes.offers_per_step": offers}
    if policy == "fixed":
        ov["window.window"] = 64
    if policy == "linear":
        ov |= {"window.start": 32, "window.step": 8}
    assert load_config(None, ov).probing == (is_audited(policy) and offers > 0)


# --- the loss table ---------------------------------------------------------------------------------


def test_the_config_and_opd_loss_take_the_tables_names() -> None:
    assert typing.get_args(LossConfig.model_fields["name"].annotation) == tuple(LOSSES)
    assert set(LOSS_NAMES) == {n for n, t in LOSSES.items() if t.teacher != "sequence"}
    assert losses_where() == tuple(LOSSES)
    with pytest.raises(TypeError):
        losses_where(no_such_trait=True)


def _loads(ov: dict[str, object]) -> bool:
    try:
        load_config(None, ov)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("name", list(LOSSES))
def test_every_losss_traits_are_what_the_config_accepts(name: str) -> None:
    t = LOSSES[name]
    assert _loads({"loss.name": name}) == t.sync
    assert _loads({"loss.name": name, "scheduler": "asyncopd"}) == t.asyncopd
    scheduler = "sync" if t.sync else "asyncopd"
    base = {"loss.name": name, "scheduler": scheduler}
    assert _loads(base | {"loss.is_method": "clip"}) == t.behavior_weighted
    assert _loads(base | {"loss.iw_gamma": 0.5}) == t.sampled_token
    assert set(LOSS_TRAIT_NAMES) == {"teacher", "behavior_weighted", "sampled_token", "sync", "asyncopd"}


# --- the policy fields ------------------------------------------------------------------------------


def test_the_config_section_the_controller_schema_and_build_policy_share_one_set_of_policy_fields() -> None:
    knobs = set(PolicyKnobs.model_fields)
    built = {f.name for f in dataclasses.fields(PolicyFields)}
    keywords = {p for p in inspect.signature(build_policy).parameters if p != "name"}
    assert knobs == built - {"max_len", "options"} and keywords == built
    for model in (WindowSection, PolicyIn):
        assert issubclass(model, PolicyKnobs)
        for k in knobs:  # same type and bounds (defaults may differ: the config proposes candidates)
            assert model.model_fields[k].annotation == PolicyKnobs.model_fields[k].annotation, (model, k)
            assert model.model_fields[k].metadata == PolicyKnobs.model_fields[k].metadata, (model, k)
    for cls in POLICIES.values():
        assert set(cls.spec_args) <= knobs, cls.name


def test_a_config_window_section_registers_as_the_same_policy_on_the_controller() -> None:
    cfg = load_config(None, {"window.policy": "linear", "window.start": 32, "window.step": 8})
    w = cfg.window
    spec = PolicyIn(name=w.policy, max_len=cfg.rollout.max_response_len, options=w.policy_options(), **w.knobs())
    assert spec.knobs() == w.knobs()
    built = build_policy(spec.name, max_len=spec.max_len, options=spec.options, **spec.knobs())
    assert [built.window(s) for s in range(5)] == [32, 40, 48, 56, 64]


# --- data-parallel probe backend ----------------------------------------------------------------------


def test_several_ranks_extend_probes_inline_when_the_config_names_no_backend(caplog) -> None:
    one = load_config(None, {})
    assert one.probes.backend == "thread"
    with caplog.at_level(logging.INFO, logger="adwin.config"):
        two = load_config(None, {}, world=2)
    assert two.probes.backend == "inline" and two.model_dump(exclude={"probes"}) == one.model_dump(exclude={"probes"})
    assert [r for r in caplog.records if "probes.backend: inline" in r.getMessage()]
    check_data_parallel(two, 2)


def test_the_chosen_backend_is_what_per_sample_seeding_needs() -> None:
    with pytest.raises(ValidationError, match="probes.backend: inline"):
        load_config(None, {"rollout.seeding": "per_sample"})
    assert load_config(None, {"rollout.seeding": "per_sample"}, world=2).probes.backend == "inline"


@pytest.mark.parametrize("named", ["thread", "ray"])
def test_a_named_backend_is_kept_and_refused_naming_the_fix(named: str, tmp_path) -> None:
    by_flag = load_config(None, {"probes.backend": named}, world=2)
    path = tmp_path / "c.yaml"
    path.write_text(f"probes: {{backend: {named}}}\n")
    for cfg in (by_flag, load_config(path, world=2)):
        assert cfg.probes.backend == named
        with pytest.raises(ValueError, match="probes.backend: inline"):
            check_data_parallel(cfg, 2)


def test_a_run_without_probes_keeps_its_backend() -> None:
    assert load_config(None, {"probes.offers_per_step": 0}, world=2).probes.backend == "thread"
    assert load_config(None, {"window.policy": "full"}, world=2).probes.backend == "thread"


def test_a_config_invalid_either_way_fails_with_its_own_error() -> None:
    with pytest.raises(ValidationError, match="window.threshold"):
        load_config(None, {"window.threshold": 2.0}, world=2)


# --- settings no loop reads ---------------------------------------------------------------------------


@pytest.mark.parametrize("override,field,fix", [
    ({"probes.ray_address": "10.0.0.1:6379"}, "probes.ray_address", "probes.backend: ray"),
    ({"probes.ray_num_cpus": 4, "probes.backend": "inline"}, "probes.ray_num_cpus", "probes.backend: ray"),
    ({"probes.workers": 2, "probes.backend": "inline"}, "probes.workers", "probes.backend: thread"),
    ({"eval.compact": False, "rollout.backend": "vllm", "probes.backend": "inline"}, "eval.compact",
     "rollout.backend: hf"),
    ({"data.task": "jsonl", "data.path": "p.jsonl", "data.n_eval": 65, "eval.n_problems": 64}, "data.n_eval",
     "data.n_eval <= 64"),
    ({"rollout.compile": True, "rollout.backend": "vllm", "probes.backend": "inline"}, "rollout.compile",
     "rollout.backend: hf"),
])
def test_a_setting_no_loop_reads_is_refused_naming_field_value_and_fix(override, field, fix) -> None:
    with pytest.raises(ValidationError) as e:
        load_config(None, override)
    message = str(e.value)
    value = next(v for k, v in override.items() if k == field)
    assert field in message and fix in message and str(value).lower() in message.lower()


@pytest.mark.parametrize("ok", [
    {"probes.ray_address": "10.0.0.1:6379", "probes.backend": "ray", "probes.ray_num_cpus": 4},
    {"probes.workers": 2, "probes.backend": "thread"},
    {"eval.compact": False},
    {"data.task": "jsonl", "data.path": "p.jsonl", "data.n_eval": 64, "eval.n_problems": 64},
    {"data.task": "jsonl", "data.path": "p.jsonl"},
    {"rollout.compile": True},
    {"rollout.compile": "auto", "rollout.backend": "vllm", "probes.backend": "inline"},
])
def test_the_same_settings_where_a_loop_reads_them_load(ok: dict[str, object]) -> None:
    load_config(None, ok)


@pytest.mark.parametrize("where", [{}, {"data.task": "jsonl", "data.path": "p.jsonl", "data.eval_path": "e.jsonl"}])
def test_an_unread_n_eval_warns_naming_it_and_still_loads(where: dict[str, object], caplog) -> None:
    n = 17 + len(where)  # a value no other test warned about (the warning is said once per process)
    with caplog.at_level(logging.WARNING, logger="adwin.config"):
        cfg = load_config(None, where | {"data.n_eval": n})
    assert cfg.data.n_eval == n
    assert [r for r in caplog.records if "data.n_eval" in r.getMessage() and f"={n}" in r.getMessage()]

