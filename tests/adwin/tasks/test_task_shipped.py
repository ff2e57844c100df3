"""The built-in models that ship with adwin: one set per task of the current recipe, intact, in the package, read
before anything is prepared, never served when stale, and compared with a rebuild by ``adwin prepare``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import tomllib

from adwin.cli import main as cli_main
from adwin.tasks import shipped as shipped_mod
from adwin.tasks.assets import META_FILE, ensure_prepared, folder_name, is_prepared, load_assets
from adwin.tasks.shipped import (
    SHIPPED_DIR,
    builtin_assets,
    describe,
    file_sha256,
    ship,
    shipped_root,
    weights_id,
)
from adwin.tasks.suite import TASK_NAMES

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("task", TASK_NAMES)
def test_every_builtin_task_ships_default_models_of_the_current_recipe(task: str) -> None:
    # fails when a recipe (profile, format, schedule) changes without the shipped models being rebuilt:
    # python docs/scripts/ship_builtin_models.py
    assert is_prepared(shipped_root("default", 0, task), "default", task)


@pytest.mark.parametrize("task", TASK_NAMES)
def test_shipped_weights_are_the_ones_their_meta_names(task: str) -> None:
    root = shipped_root("default", 0, task)
    meta = json.loads((root / META_FILE).read_text())
    assert meta["weights_sha256"] == {sub: file_sha256(root / sub / "model.safetensors")
                                      for sub in ("student", "teacher")}
    assert (root / "tokenizer" / "tokenizer.json").is_file()


@pytest.mark.parametrize("task", TASK_NAMES)
def test_shipped_meta_names_no_path_of_the_machine_that_built_it(task: str) -> None:
    meta = json.loads((shipped_root("default", 0, task) / META_FILE).read_text())
    assert "root" not in meta
    for key in ("warm_from", "teacher_warm_from"):
        value = meta["sft"].get(key)
        assert value is None or not Path(value).is_absolute(), (key, value)


def test_the_package_data_takes_every_shipped_file() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "adwin.tasks.builtin_models" in setuptools["packages"]
    patterns = setuptools["package-data"]["adwin.tasks.builtin_models"]
    taken = {p for pattern in patterns for p in SHIPPED_DIR.glob(pattern) if p.is_file()}
    files = {p for p in SHIPPED_DIR.rglob("*") if p.is_file()}
    assert files and files <= taken, sorted(str(p) for p in files - taken)


def test_a_run_reads_the_shipped_models_without_preparing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADWIN_HOME", str(tmp_path))

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("prepared although models ship")

    monkeypatch.setattr(shipped_mod, "ensure_prepared", refuse)
    assets = builtin_assets("default", 0, "chain-long")
    assert assets.root == shipped_root("default", 0, "chain-long")
    assert describe(assets) == f"shipped chain-long-default-seed0 (weights {weights_id(assets.meta)})"
    assert not (tmp_path / "builtin").exists()


@pytest.fixture(scope="module")
def tiny_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("adwin_home")
    ensure_prepared(home=home, profile="tiny", seed=0, threads=1)
    return home


@pytest.fixture
def tiny_shipped(tiny_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny profile's build shipped into a package folder of the test's own."""
    shipped_dir = tmp_path / "builtin_models"
    shipped_dir.mkdir()
    monkeypatch.setattr(shipped_mod, "SHIPPED_DIR", shipped_dir)
    return ship(load_assets(tiny_home / "builtin" / "tiny-seed0"), shipped_dir / folder_name("tiny", 0))


def test_ship_writes_a_folder_that_loads_and_hashes_its_weights(tiny_shipped: Path, tiny_home: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert is_prepared(tiny_shipped, "tiny")
    assert str(tiny_home) not in (tiny_shipped / META_FILE).read_text()
    tok = AutoTokenizer.from_pretrained(str(tiny_shipped / "tokenizer"))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_shipped / "student"))
    assert model.config.vocab_size == len(tok)
    assert weights_id(load_assets(tiny_shipped).meta) != "local"


def test_shipped_is_the_default_and_prepared_reads_this_machines_build(tiny_shipped: Path, tiny_home: Path) -> None:
    assert builtin_assets("tiny", 0, "chain", "shipped", home=tiny_home).root == tiny_shipped
    local = builtin_assets("tiny", 0, "chain", "prepared", home=tiny_home)
    assert local.root == tiny_home / "builtin" / "tiny-seed0"
    assert describe(local) == "prepared tiny-seed0 on this machine"


def test_a_stale_shipped_folder_is_never_served(tiny_shipped: Path, tiny_home: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    meta = json.loads((tiny_shipped / META_FILE).read_text())
    (tiny_shipped / META_FILE).write_text(json.dumps(meta | {"fingerprint": "an-older-recipe"}))
    with caplog.at_level(logging.WARNING, logger="adwin.tasks.shipped"):
        assets = builtin_assets("tiny", 0, "chain", "shipped", home=tiny_home)
    assert assets.root == tiny_home / "builtin" / "tiny-seed0"
    assert "an-older-recipe" in caplog.text


def test_a_task_without_shipped_models_is_prepared(tiny_shipped: Path, tmp_path: Path) -> None:
    assets = builtin_assets("tiny", 1, "chain", "shipped", home=tmp_path / "home")
    assert assets.root == tmp_path / "home" / "builtin" / "tiny-seed1"


def test_an_unknown_source_is_refused() -> None:
    with pytest.raises(ValueError, match="source"):
        builtin_assets("tiny", 0, "chain", "downloaded")  # type: ignore[arg-type]


def test_builtin_source_is_validated_naming_the_field() -> None:
    from pydantic import ValidationError

    from adwin.config import TrainConfig

    assert TrainConfig().model.builtin_source == "shipped"
    with pytest.raises(ValidationError, match="builtin_source"):
        TrainConfig.model_validate({"model": {"builtin_source": "hub"}})


def _prepare_json(home: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert cli_main(["prepare", "--tiny", "--home", str(home), "--threads", "1", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_prepare_reports_a_rebuild_identical_to_the_shipped_models(tiny_shipped: Path, tiny_home: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    report = _prepare_json(tiny_home, capsys)["against_shipped"]
    assert report["identical"] and report["shipped_is_current_recipe"]
    assert report["weights_relative_l2"] == {"student": 0.0, "teacher": 0.0}
    assert report["measures"]["teacher_accuracy_t1"]["diff"] == 0.0


def test_prepare_reports_how_a_rebuild_differs_from_the_shipped_models(tiny_shipped: Path, tiny_home: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file, save_file

    path = tiny_shipped / "student" / "model.safetensors"
    weights = load_file(str(path))
    save_file({k: v * 1.1 for k, v in weights.items()}, str(path), metadata={"format": "pt"})
    meta = json.loads((tiny_shipped / META_FILE).read_text())
    meta["measured"]["teacher_accuracy_t1"] -= 0.5
    meta["eval"]["problems"] = 1000  # two standard errors of 0.5 - 1.0 accuracies over 1,000 problems: <= 0.045
    (tiny_shipped / META_FILE).write_text(json.dumps(meta))
    report = _prepare_json(tiny_home, capsys)["against_shipped"]
    assert not report["identical"]
    assert report["weights_relative_l2"]["student"] == pytest.approx(0.1 / 1.1, rel=1e-4)
    assert report["weights_relative_l2"]["teacher"] == 0.0
    assert report["measures"]["teacher_accuracy_t1"]["diff"] == pytest.approx(0.5)
    assert report["measures"]["teacher_accuracy_t1"]["beyond_2se"]
    assert cli_main(["prepare", "--tiny", "--home", str(tiny_home), "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "against the shipped models" in text and "beyond 2 SE" in text


def test_prepare_without_shipped_models_reports_no_comparison(tiny_home: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(shipped_mod, "SHIPPED_DIR", tmp_path / "none")
    assert _prepare_json(tiny_home, capsys)["against_shipped"] is None


def test_the_shipped_folders_are_the_five_tasks_at_the_default_profile_and_seed_0() -> None:
    names = sorted(p.name for p in SHIPPED_DIR.iterdir() if p.is_dir())
    assert names == sorted(folder_name("default", 0, t) for t in TASK_NAMES)
