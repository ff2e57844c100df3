"""adwin bench audit-truth: the command on the tiny built-in task (one checkpoint sampled, then replayed from its
saved Gram), its refusals, and a checkpoint whose pool has no truth (the replay's rules: test_audit_replay.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.append(str(Path(__file__).resolve().parents[1] / "audit"))  # tests/adwin/audit/synthetic_pool.py
from synthetic_pool import synthetic_vectors  # noqa: E402

from adwin.audit.estimators import cross_gram  # noqa: E402
from adwin.bench.audit_replay import NOISE_RULE, RULES, SHIPPED  # noqa: E402
from adwin.cli import main  # noqa: E402

CANDS, HORIZON = [64, 128, 256, 512, 1024], 2048
TOKENS = [64, 64, 128, 256, 512, 1024]


def _h(cosines: list[float], signal: float, seed: int = 1) -> np.ndarray:
    return cross_gram(synthetic_vectors(128, cosines, signal=signal, tokens=TOKENS, seed=seed))


def test_the_command_samples_a_checkpoint_writes_its_tables_and_replays_from_the_saved_gram(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "audit-truth", "--task", "chain", "--profile", "tiny", "--rollouts", "24", "--sizes", "2,8",
            "--draws", "10", "--update-rollouts", "8", "--replay-audits", "3", "--replay-runs", "2",
            "--probe-batch", "2", "--out", str(tmp_path)]
    assert main(args) == 0
    (run,) = tmp_path.iterdir()
    report = json.loads((run / "truth.json").read_text())
    (ck,) = report["checkpoints"]
    assert ck["step"] == 0 and ck["pool"]["rollouts"] == 24
    assert set(ck["population"]) == {str(c) for c in ck["candidates"]}
    (fold,) = ck["folds"]  # --split half, the default
    assert len(fold["truth_samples"]) == 12 and fold["replay_samples"] == 12
    assert fold["noise_source"] == "token counts" and ck["token_floor"] is not None
    names = set(fold["replay"]["2"])
    assert {r.name for r in RULES} | {NOISE_RULE, f"constant {ck['horizon']}"} <= names
    assert {f"constant {c}" for c in ck["candidates"]} <= names
    assert {(g["rule"], g["P"]) for g in report["goals"]} == {(r.name, 2) for r in RULES}
    text = (run / "truth.md").read_text()
    for words in ("Truth's window", "Noise-reading window", "Verdict:", "| admissible |", "## Goals", SHIPPED):
        assert words in text, words
    assert "Truth's window" in capsys.readouterr().out
    with np.load(run / "gram-0.npz") as z:
        assert z["lengths"].shape == (24,) and z["lengths"].max() <= ck["horizon"]
    again = args[:-2] + ["--out", str(tmp_path / "again"), "--from-npz", str(run / "gram-0.npz")]
    assert main(again + ["--split", "cross"]) == 0
    (rerun,) = (tmp_path / "again").iterdir()
    replayed = json.loads((rerun / "truth.json").read_text())["checkpoints"][0]
    assert replayed["population"] == ck["population"] and replayed["truth_window"] == ck["truth_window"]
    # the run's window.initial travels with the pool: the replay from the saved Gram starts where the sampled one did
    assert replayed["replay_initial"] == ck["replay_initial"] == report["meta"]["initial"]
    first, second = replayed["folds"]  # the halves swapped
    assert first["truth_samples"] == fold["truth_samples"] and first["population"] == fold["population"]
    assert sorted(first["truth_samples"] + second["truth_samples"]) == list(range(24))


def test_more_probes_than_the_pool_holds_is_refused_before_any_compute(tmp_path: Path) -> None:
    assert main(["bench", "audit-truth", "--task", "chain", "--profile", "tiny", "--rollouts", "4", "--sizes", "8",
                 "--out", str(tmp_path)]) == 2
    # 4 audits of 8 fit in 40 rollouts, not in the replay's half of them
    assert main(["bench", "audit-truth", "--task", "chain", "--profile", "tiny", "--rollouts", "40", "--sizes", "8",
                 "--update-rollouts", "8", "--probe-batch", "8", "--replay-audits", "4", "--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())


def test_a_default_replay_that_outgrows_the_pools_half_is_refused_before_any_rollout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from adwin.bench.compare import command

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("models loaded before the replay was checked")

    monkeypatch.setattr(command, "load_run_parts", refuse)
    # the replay's default P includes 8: 12 audits of 8 need 96 rollouts, a half of 128 holds 64
    assert main(["bench", "audit-truth", "--task", "chain", "--profile", "tiny", "--rollouts", "128", "--sizes", "8",
                 "--out", str(tmp_path)]) == 2
    assert not list(tmp_path.rglob("gram-*.npz"))


def test_a_pool_without_a_truth_replays_its_decisions_without_a_share_and_says_so() -> None:
    from adwin.bench.audit_replay import RULES as ALL
    from adwin.bench.audit_truth import measure_checkpoint, truth_markdown

    rules = [ALL[0], ALL[2]]
    ck = measure_checkpoint(_h([0.2, 0.3, 0.35, 0.5, 0.85], 0.0, seed=4), CANDS, HORIZON, 0.7, sizes=[8], draws=10,
                            r=8, p_run=[8], audits=4, runs=2, rng=np.random.default_rng(0), initial=512, rules=rules)
    assert ck["truth_window"] is None and ck["surely_admissible_window"] is None
    (fold,) = ck["folds"]
    assert fold["truth_window"] is None and fold["noise_source"] == "same-sample energies"
    for r in fold["replay"]["8"].values():
        assert r["exact"] is None and r["admissible"] is None and sum(r["windows"].values()) == pytest.approx(1.0)
    report = {"meta": {"task": "t"}, "checkpoints": [ck | {"step": 0, "pool": {"rollouts": 128, "mean_len": 1.0,
                                                                                "at_horizon": 0.0}}]}
    text = truth_markdown(report)
    assert "not identifiable" in text and "| n/a |" in text and "**no truth**" in text
    assert text.count("n/a |") >= len(CANDS) + 1 + 4 * len(fold["replay"]["8"])  # no update view, no shares
    assert "Replay at P = 8" in text


def test_checkpoints_on_adwins_own_trajectory_carry_the_windows_that_run_chose(tmp_path: Path) -> None:
    args = ["bench", "audit-truth", "--task", "chain", "--profile", "tiny", "--rollouts", "24", "--sizes", "2",
            "--draws", "5", "--update-rollouts", "8", "--replay-audits", "3", "--replay-runs", "2",
            "--probe-batch", "2", "--at", "2", "--trajectory", "adwin-0.7", "--out", str(tmp_path)]
    assert main(args) == 0
    (run,) = tmp_path.iterdir()
    report = json.loads((run / "truth.json").read_text())
    assert report["meta"]["trajectory"] == "adwin-0.7"
    (ck,) = report["checkpoints"]
    assert ck["step"] == 2 and len(ck["trained_windows"]) == 2
    assert all(1 <= w <= ck["horizon"] for w in ck["trained_windows"])
    text = (run / "truth.md").read_text()
    assert "reached by `adwin-0.7` training" in text and "Windows the run trained under in its last 2 steps" in text
    # the windows travel with the saved pool
    with np.load(run / "gram-2.npz") as z:
        assert json.loads(str(z["meta"]))["trained_windows"] == ck["trained_windows"]
    # two reports (as of two seeds) judged together, as replayed: nothing sampled
    other = json.loads((run / "truth.json").read_text())
    other["meta"]["seed"] = 7
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert main(["bench", "audit-truth", "--combine", str(run / "truth.json"), str(tmp_path / "other.json"),
                 "--out", str(tmp_path / "combined")]) == 0
    (comb,) = (tmp_path / "combined").iterdir()
    combined = json.loads((comb / "combined.json").read_text())
    assert {(g["rule"], g["P"]) for g in combined["goals"]} == {(r.name, 2) for r in RULES}
    truth = ck["truth_window"]
    assert combined["trained_judged"] == (4 if truth is not None else 0)
    assert combined["trained_below"] == (2 * sum(w < truth for w in ck["trained_windows"]) if truth else 0)
    assert "seed 7" in (comb / "combined.md").read_text()
    # a report replayed from several seeds' pools keeps each checkpoint's own seed
    several = json.loads((run / "truth.json").read_text())
    several["checkpoints"][0]["label"] = "seed 3, step 2"
    (tmp_path / "several.json").write_text(json.dumps(several))
    assert main(["bench", "audit-truth", "--combine", str(run / "truth.json"), str(tmp_path / "several.json"),
                 "--out", str(tmp_path / "combined2")]) == 0
    (comb,) = (tmp_path / "combined2").iterdir()
    assert "seed 3, step 2" in (comb / "combined.md").read_text()


def test_an_unknown_trajectory_is_refused(tmp_path: Path) -> None:
    assert main(["bench", "audit-truth", "--task", "chain", "--profile", "tiny", "--rollouts", "24", "--sizes", "2",
                 "--update-rollouts", "8", "--probe-batch", "2", "--replay-audits", "3", "--trajectory", "nope",
                 "--out", str(tmp_path)]) == 2
    assert not list(tmp_path.rglob("gram-*.npz"))


def test_pools_of_several_training_seeds_replay_together_each_named_by_its_seed(tmp_path: Path) -> None:
    paths = []
    for seed in (0, 1):
        h = _h([0.5, 0.8, 0.95, 0.99, 1.0], signal=4.0, seed=seed + 3)
        meta = {"step": 5, "candidates": CANDS, "horizon": HORIZON, "threshold": 0.7, "seed": seed,
                "pool": {"rollouts": 128, "mean_len": 900.0, "at_horizon": 0.1, "seconds": 1.0},
                "probe_batch": 2, "initial": 512, "staleness_limit": 5, "trajectory": "adwin-0.7"}
        paths.append(tmp_path / f"gram-seed{seed}.npz")
        np.savez_compressed(paths[-1], h=h, lengths=np.full(128, 900.0), meta=json.dumps(meta))
    assert main(["bench", "audit-truth", "--task", "chain-long", "--from-npz", *map(str, paths), "--sizes", "2",
                 "--draws", "5", "--replay-audits", "4", "--replay-runs", "2", "--probe-batch", "2",
                 "--out", str(tmp_path / "out")]) == 0
    (run,) = (tmp_path / "out").iterdir()
    report = json.loads((run / "truth.json").read_text())
    assert [ck["label"] for ck in report["checkpoints"]] == ["seed 0, step 5", "seed 1, step 5"]
    assert "## Seed 1, step 5:" in (run / "truth.md").read_text()
