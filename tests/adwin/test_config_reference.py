"""The config reference (docs/config.md) is generated from the models and says truly which scheduler reads what."""

from __future__ import annotations

from pathlib import Path

import pytest

from adwin.config import TrainConfig, load_config
from adwin.config.reference import leaves, read_by, render
from adwin.config.run import SYNC_ONLY

ROOT = Path(__file__).resolve().parents[2]
# another value of each sync-only field, with what it needs to load under sync
OTHER: dict[str, dict[str, object]] = {
    "probes.backend": {"probes.backend": "inline"},
    "probes.workers": {"probes.workers": 2},
    "probes.ray_address": {"probes.backend": "ray", "probes.ray_address": "127.0.0.1:6379"},
    "probes.ray_num_cpus": {"probes.backend": "ray", "probes.ray_num_cpus": 1},
    "probes.fault_policy": {"probes.fault_policy": "drop"},
    "probes.max_reissues": {"probes.max_reissues": 0},
}


def test_the_reference_page_is_generated_from_the_models() -> None:
    assert (ROOT / "docs" / "config.md").read_text() == render(), \
        "docs/config.md is out of date: python -m adwin.config.reference > docs/config.md"


def test_every_field_has_a_description_and_a_row() -> None:
    page = render()
    for dotted, f, _ in leaves(TrainConfig):
        assert f.description, f"{dotted}: add a description= to the field (the reference is built from it)"
        assert f"| `{dotted}` |" in page


@pytest.mark.parametrize("field", sorted(SYNC_ONLY))
def test_a_sync_only_field_loads_under_sync_and_is_refused_under_asyncopd(field: str) -> None:
    assert read_by(field) == "sync"
    load_config(None, OTHER[field])
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        load_config(None, {field: OTHER[field][field], "scheduler": "asyncopd"})


def test_model_sharding_is_read_by_both_schedulers() -> None:
    """The run shell writes a sharded student's checkpoints and export for either schedule."""
    assert read_by("model.sharding") == "both"
    assert load_config(None, {"model.sharding": "fsdp", "scheduler": "asyncopd"}).model.sharding == "fsdp"


def test_the_asyncopd_section_is_read_by_asyncopd_only() -> None:
    assert read_by("asyncopd.queue_depth") == "asyncopd" and read_by("rollout.top_p") == "both"
    with pytest.raises(ValueError, match=r"asyncopd\.queue_depth"):
        load_config(None, {"asyncopd.queue_depth": 2})
