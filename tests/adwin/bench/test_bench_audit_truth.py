"""adwin bench audit-truth: the replay of ADWIN's online rule on pools whose truth is set, and the command on the
tiny built-in task (one checkpoint sampled, then replayed from its saved Gram)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.append(str(Path(__file__).resolve().parents[1] / "audit"))  # tests/adwin/audit/synthetic_pool.py
from synthetic_pool import synthetic_vectors  # noqa: E402

from adwin.audit.estimators import cross_gram  # noqa: E402
from adwin.bench.audit_truth import RULES, Rule, replay  # noqa: E402
from adwin.cli import main  # noqa: E402

CANDS, HORIZON = [64, 128, 256, 512, 1024], 2048
TOKENS = [64, 64, 128, 256, 512, 1024]
NOISE_HOLD = [r for r in RULES if r.noise_hold]
(PRESETS,) = [r for r in RULES if r.name == "batch, point, 8 audits pooled (decay 0.9)"]  # what the presets ship


def _h(cosines: list[float], signal: float, seed: int = 1) -> np.ndarray:
    return cross_gram(synthetic_vectors(128, cosines, signal=signal, tokens=TOKENS, seed=seed))


@pytest.mark.parametrize("p", [2, 8])
@pytest.mark.parametrize("rule", NOISE_HOLD, ids=[r.name for r in NOISE_HOLD])
def test_pure_noise_never_moves_a_noise_hold_window(rule: Rule, p: int) -> None:
    out = replay(_h([0.2, 0.3, 0.35, 0.5, 0.85], 0.0), CANDS, HORIZON, 0.7, rule, p=p, audits=12, runs=6,
                 truth_window=1024, rng=np.random.default_rng(0))
    assert out["windows"] == {"1024": 1.0}  # the initial window, the largest candidate


def test_the_replay_starts_where_the_run_starts() -> None:
    (rule,) = [r for r in NOISE_HOLD if r.pool == 1 and r.estimator == "debiased" and r.grow_to == "sure"]
    out = replay(_h([0.2, 0.3, 0.35, 0.5, 0.85], 0.0), CANDS, HORIZON, 0.7, rule, p=8, audits=6, runs=3,
                 truth_window=1024, rng=np.random.default_rng(0), initial=256)
    assert out["windows"] == {"256": 1.0}  # held on noise: the run's window.initial, not the largest candidate


def test_a_pooled_rule_reads_no_audit_older_than_the_staleness_limit() -> None:
    h = _h([0.9, 0.95, 0.97, 0.98, 0.99], np.sqrt(sum(TOKENS) / 6))

    def run(rule: Rule, **kw: int) -> dict:
        out = replay(h, CANDS, HORIZON, 0.7, rule, p=8, audits=8, runs=4, truth_window=64,
                     rng=np.random.default_rng(3), **kw)
        return {k: v for k, v in out.items() if k != "pooled_audits"}  # the rule's setting, not what it read

    # audits 3 steps apart under a limit of 2: every pool holds its own audit alone, as the paper's rule reads it
    assert run(PRESETS, cadence=3, max_age=2) == run(RULES[0], cadence=3, max_age=2)
    assert run(PRESETS, cadence=1, max_age=5) != run(RULES[0], cadence=1, max_age=5)


def test_on_pure_noise_the_papers_rule_moves_the_window() -> None:
    """Why noise_hold exists: the batch cosine of a long prefix reads sqrt(w / H) in noise, near the threshold."""
    out = replay(_h([0.2, 0.3, 0.35, 0.5, 0.85], 0.0), CANDS, HORIZON, 0.7, RULES[0], p=8, audits=12, runs=6,
                 truth_window=1024, rng=np.random.default_rng(0))
    assert out["windows"].get("2048", 0.0) > 0.1


@pytest.mark.parametrize("p, rule", [(8, "debiased, confidence, noise hold"),
                                     (2, "debiased, confidence, noise hold, 4 audits pooled")])
def test_at_small_p_the_debiased_noise_hold_rule_lands_on_the_true_window(p: int, rule: str) -> None:
    aligned = _h([0.9, 0.95, 0.97, 0.98, 0.99], np.sqrt(sum(TOKENS) / 6))  # truth: 64, noise scale 6
    (r,) = [x for x in RULES if x.name == rule]
    out = replay(aligned, CANDS, HORIZON, 0.7, r, p=p, audits=12, runs=6, truth_window=64,
                 rng=np.random.default_rng(0))
    # the first audit starts at the largest candidate; from the second on the rule sits at the truth
    assert out["within_one_rung"] >= 0.8


@pytest.mark.parametrize("p, cosines, truth_window, initial", [
    (8, [0.9, 0.95, 0.97, 0.98, 0.99], 64, 512),  # shrinks from the run's start to the truth
    (2, [0.2, 0.3, 0.5, 0.8, 0.9], 512, 128),  # grows to it, at the suite's P
])
def test_the_presets_pooled_point_rule_at_small_p_lands_on_the_true_window(p: int, cosines: list[float],
                                                                         truth_window: int, initial: int) -> None:
    h = _h(cosines, np.sqrt(sum(TOKENS) / 6))  # noise scale 6, as chain-long's prepared student
    out = replay(h, CANDS, HORIZON, 0.7, PRESETS, p=p, audits=12, runs=6, truth_window=truth_window,
                 rng=np.random.default_rng(0), initial=initial)
    assert out["within_one_rung"] >= 0.8


@pytest.mark.parametrize("preset", ["default", "long", "suite"])
def test_the_rule_the_replay_calls_the_presets_is_the_one_the_adwin_presets_ship(preset: str) -> None:
    from adwin.config import load_config
    from adwin.config.loading import preset_path

    cfg = load_config(preset_path(preset))
    shipped = Rule("shipped", cfg.audit.estimator, cfg.window.confidence, noise_hold=cfg.window.noise_hold,
                   grow_to=cfg.window.grow_to, signal_z=cfg.window.signal_z, pool=cfg.audit.evidence_audits,
                   decay=cfg.audit.evidence_decay)
    assert cfg.window.policy == "adwin" and shipped == dataclasses.replace(PRESETS, name="shipped")


def test_the_batch_estimator_at_small_p_is_held_above_the_true_window_by_its_bias() -> None:
    aligned = _h([0.9, 0.95, 0.97, 0.98, 0.99], np.sqrt(sum(TOKENS) / 6))
    (rule,) = [r for r in RULES if r.name == "batch, confidence"]
    out = replay(aligned, CANDS, HORIZON, 0.7, rule, p=8, audits=12, runs=6, truth_window=64,
                 rng=np.random.default_rng(0))
    assert out["within_one_rung"] < 0.2


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
    assert set(ck["replay"]["2"]) == {r.name for r in RULES}
    assert "Truth's window" in (run / "truth.md").read_text() and "Truth's window" in capsys.readouterr().out
    assert main(args[:-2] + ["--out", str(tmp_path / "again"), "--from-npz", str(run / "gram-0.npz")]) == 0
    (again,) = (tmp_path / "again").iterdir()
    replayed = json.loads((again / "truth.json").read_text())["checkpoints"][0]
    assert replayed["population"] == ck["population"] and replayed["truth_window"] == ck["truth_window"]
    # the run's window.initial travels with the pool: the replay from the saved Gram starts where the sampled one did
    assert replayed["replay_initial"] == ck["replay_initial"] == report["meta"]["initial"]


def test_more_probes_than_the_pool_holds_is_refused_before_any_compute(tmp_path: Path) -> None:
    assert main(["bench", "audit-truth", "--task", "chain", "--profile", "tiny", "--rollouts", "4", "--sizes", "8",
                 "--out", str(tmp_path)]) == 2
    assert main(["bench", "audit-truth", "--task", "chain", "--profile", "tiny", "--rollouts", "40", "--sizes", "8",
                 "--update-rollouts", "8", "--probe-batch", "8", "--replay-audits", "6", "--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())


def test_a_pool_without_a_truth_replays_its_decisions_without_a_share_and_says_so() -> None:
    from adwin.bench.audit_truth import measure_checkpoint, truth_markdown

    ck = measure_checkpoint(_h([0.2, 0.3, 0.35, 0.5, 0.85], 0.0, seed=4), CANDS, HORIZON, 0.7, sizes=[8], draws=10,
                            r=8, p_run=[8], audits=4, runs=2, rng=np.random.default_rng(0), initial=512)
    assert ck["truth_window"] is None and ck["surely_admissible_window"] is None
    for r in ck["replay"]["8"].values():
        assert r["within_one_rung"] is None and sum(r["windows"].values()) == pytest.approx(1.0)
    report = {"meta": {"task": "t"}, "checkpoints": [ck | {"step": 0, "pool": {"rollouts": 128, "mean_len": 1.0,
                                                                                "at_horizon": 0.0}}]}
    text = truth_markdown(report)
    assert "not identifiable" in text and "| n/a |" in text
    assert text.count("n/a |") >= len(CANDS) + 1 + 3 * len(RULES)  # no update view, no shares
    assert "Replay at P = 8, no truth:" in text
