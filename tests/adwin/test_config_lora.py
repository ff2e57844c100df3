"""``model.lora``: the section's ranges, how it reads from overrides and presets, and what it refuses at load."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from adwin.config import LoraSection, load_config, parse_set
from adwin.config.sections import LLAMA_PROJECTIONS


def test_lora_is_off_by_default_and_one_override_turns_it_on_with_the_section_defaults() -> None:
    assert load_config(None).model.lora is None
    lora = load_config(None, parse_set(["model.lora.r=4"])).model.lora
    assert lora == LoraSection(r=4) and lora.alpha == 32.0 and lora.dropout == 0.0
    assert lora.target_modules == list(LLAMA_PROJECTIONS)
    assert load_config(None, {"model.lora": {}}).model.lora == LoraSection()
    assert load_config(None, {"model.lora.target_modules": "all-linear"}).model.lora.target_modules == "all-linear"


def test_a_run_reloads_its_own_resolved_lora_config() -> None:
    cfg = load_config(None, {"model.lora.r": 8, "model.lora.dropout": 0.05, "model.lora.target_modules": ["q_proj"]})
    again = load_config(None, {"model": cfg.model.model_dump(mode="json")})
    assert again.model.lora == cfg.model.lora


@pytest.mark.parametrize("override, field", [
    ({"model.lora.r": 0}, "model.lora.r"),
    ({"model.lora.alpha": 0}, "model.lora.alpha"),
    ({"model.lora.dropout": 1.0}, "model.lora.dropout"),
    ({"model.lora.dropout": -0.1}, "model.lora.dropout"),
    ({"model.lora.target_modules": []}, "model.lora.target_modules"),
    ({"model.lora.target_modules": ["q_proj", "q_proj"]}, "model.lora.target_modules"),
    ({"model.lora.target_modules": "all"}, "model.lora.target_modules"),
    ({"model.lora.rank": 4}, "model.lora.rank"),
])
def test_invalid_lora_settings_fail_at_load_naming_the_field(override: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        load_config(None, override)
    locs = {".".join(str(x) for x in e["loc"][:3]) for e in err.value.errors()}
    assert any(loc.startswith(field) for loc in locs), locs


def test_vllm_rollouts_refuse_a_lora_student_naming_both_fields() -> None:
    with pytest.raises(ValidationError, match=r"model\.lora: rollout\.backend 'vllm'.*rollout\.backend: hf"):
        load_config(None, {"model.lora.r": 4, "rollout.backend": "vllm", "probes.backend": "inline"})
    load_config(None, {"model.lora.r": 4, "rollout.backend": "hf"})
