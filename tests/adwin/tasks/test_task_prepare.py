"""``adwin prepare --profile tiny`` writes loadable models, a tokenizer and meta.json; the cache is
reused and the Python API points at it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adwin.cli import main as cli_main
from adwin.tasks import ROUTES, ensure_prepared


@pytest.fixture(scope="module")
def prepared_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("adwin_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ADWIN_HOME", str(home))
        assert cli_main(["prepare", "--profile", "tiny", "--threads", "1"]) == 0
    return home


def test_prepare_tiny_writes_loadable_models_and_meta(prepared_home: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = prepared_home / "builtin" / "tiny-seed0"
    meta = json.loads((root / "meta.json").read_text())
    assert meta["profile"] == "tiny" and meta["targets_enforced"] is False
    for key in ("teacher_accuracy_greedy", "teacher_accuracy_t1", "student_accuracy_t1", "wall_seconds"):
        assert key in meta["measured"]
    tok = AutoTokenizer.from_pretrained(str(root / "tokenizer"))
    for sub in ("student", "teacher"):
        model = AutoModelForCausalLM.from_pretrained(str(root / sub))
        assert model.config.vocab_size == len(tok)
        assert model.config.eos_token_id == tok.eos_token_id == meta["format"]["eos_token_id"]
        ids = tok(["muladd x=4 a=3 b=2 n=3\n"], return_tensors="pt")["input_ids"]
        assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tok))
    # the student is an earlier snapshot of the same run: same architecture, different weights
    s = AutoModelForCausalLM.from_pretrained(str(root / "student")).state_dict()
    t = AutoModelForCausalLM.from_pretrained(str(root / "teacher")).state_dict()
    assert s.keys() == t.keys()
    assert any(not (s[k] == t[k]).all() for k in s)


def test_ensure_prepared_reuses_the_cache(prepared_home: Path) -> None:
    meta_path = prepared_home / "builtin" / "tiny-seed0" / "meta.json"
    before = meta_path.stat().st_mtime_ns
    assets = ensure_prepared(home=prepared_home, profile="tiny")
    assert meta_path.stat().st_mtime_ns == before  # loaded, not rebuilt
    assert assets.root == meta_path.parent
    assert set(assets.teacher_paths) == set(ROUTES)
    assert all((p / "config.json").is_file() for p in assets.teacher_paths.values())
    assert (assets.student_path / "config.json").is_file()
    assert (assets.tokenizer_path / "tokenizer.json").is_file()
    assert assets.meta["fingerprint"]


def test_stale_cache_of_an_older_profile_version_is_rebuilt(prepared_home: Path, tmp_path: Path) -> None:
    import shutil

    home = tmp_path / "home"
    shutil.copytree(prepared_home, home)
    meta_path = home / "builtin" / "tiny-seed0" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["fingerprint"] = "older"
    meta_path.write_text(json.dumps(meta))
    assets = ensure_prepared(home=home, profile="tiny")
    assert assets.meta["fingerprint"] != "older"


def test_unknown_profile_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ensure_prepared(home=tmp_path, profile="huge")


def test_two_prepares_with_one_seed_give_identical_weights_whatever_threads_the_caller_set(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from adwin.tasks.profiles import PREPARE_THREADS

    before = torch.get_num_threads()
    roots = []
    try:
        for i, caller_threads in enumerate((1, PREPARE_THREADS + 1)):  # adwin train prepares on 1 thread
            torch.set_num_threads(caller_threads)
            roots.append(ensure_prepared(home=tmp_path / f"h{i}", profile="tiny", seed=0).root)
            assert torch.get_num_threads() == caller_threads  # restored after the prepare
    finally:
        torch.set_num_threads(before)
    metas = [json.loads((r / "meta.json").read_text()) for r in roots]
    assert [m["environment"]["torch_threads"] for m in metas] == [PREPARE_THREADS] * 2
    for sub in ("student", "teacher"):
        a, b = (load_file(r / sub / "model.safetensors") for r in roots)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), sub


def test_prepare_rejects_a_thread_count_below_one(tmp_path: Path, capsys) -> None:
    assert cli_main(["prepare", "--tiny", "--home", str(tmp_path), "--threads", "0"]) == 2
    assert "--threads must be >= 1" in capsys.readouterr().err
