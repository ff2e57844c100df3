"""Where a run's config comes from: shipped presets by name or path, from any working folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from adwin.config import (
    DEFAULT_PRESET,
    UnknownPreset,
    default_config_path,
    load_source,
    preset_names,
    preset_path,
    resolve_config,
)

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"
REPO_PRESETS = sorted(p.stem for p in REPO_CONFIGS.glob("*.yaml"))


def test_every_yaml_of_the_configs_folder_ships_as_a_preset_with_the_same_text() -> None:
    assert list(preset_names()) == REPO_PRESETS and DEFAULT_PRESET in REPO_PRESETS
    for name in REPO_PRESETS:
        assert preset_path(name).read_text() == (REPO_CONFIGS / f"{name}.yaml").read_text(), name


@pytest.mark.parametrize("cwd", ["repo", "elsewhere"])
def test_no_config_reads_the_default_preset_from_any_folder(cwd: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO_CONFIGS.parent if cwd == "repo" else tmp_path)
    source = resolve_config(None)
    assert source.preset == DEFAULT_PRESET and source.path == default_config_path()
    cfg, _ = load_source(None)
    assert cfg.name == "adwin-builtin" and cfg.probes.offer_finished == "always"  # the preset's, not the defaults


@pytest.mark.parametrize("name", REPO_PRESETS)
def test_the_repositorys_preset_file_by_path_is_the_preset(name: str, monkeypatch) -> None:
    monkeypatch.chdir(REPO_CONFIGS.parent)
    assert resolve_config(f"configs/{name}.yaml") == resolve_config(name)


@pytest.mark.parametrize("name", REPO_PRESETS)
def test_a_preset_is_found_by_name_and_by_its_headers_relative_path_from_another_folder(
        name: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    by_name, by_path = resolve_config(name), resolve_config(f"configs/{name}.yaml")
    assert by_name == by_path and by_name.preset == name and by_name.path == preset_path(name)


def test_an_existing_file_is_read_as_given_even_where_a_preset_has_its_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    mine = tmp_path / "configs" / "fixed.yaml"
    mine.write_text("# adwin train --config configs/fixed.yaml\nsteps: 7\n")
    source = resolve_config("configs/fixed.yaml")
    assert source.preset is None and source.path == mine.resolve()
    assert load_source("configs/fixed.yaml")[0].steps == 7
    assert resolve_config("fixed").path == preset_path("fixed")  # a bare name is always the preset


@pytest.mark.parametrize("spec", ["no-such-preset", "configs/no-such-preset.yaml", "elsewhere/fixed.yaml"])
def test_an_unknown_name_or_missing_file_is_refused_listing_the_presets(spec: str, tmp_path: Path,
                                                                      monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnknownPreset) as e:
        resolve_config(spec)
    assert spec in str(e.value) and all(name in str(e.value) for name in REPO_PRESETS)


def test_loading_logs_which_file_the_run_uses(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.chdir(tmp_path)
    with caplog.at_level("INFO", logger="adwin.config"):
        load_source("fixed")
    assert any("fixed" in r.getMessage() and str(preset_path("fixed")) in r.getMessage() for r in caplog.records)
