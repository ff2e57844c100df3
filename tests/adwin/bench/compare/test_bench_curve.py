"""``adwin bench curve``: when a measure has moved, the paired rows against the start, when the run stops (moved,
budget), what it writes as it goes, and a smoke run of the command on the tiny profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adwin.bench.compare.curve import Curve, CurveStop, first_moved_step, measure_rows, moved
from adwin.cli import main
from adwin.loop.evaluate import EvalRows


def _row(step: int, lo: float) -> dict[str, Any]:
    return {"step": step, "measures": {"lines_right": {"diff_to_start": {"mean": lo + 0.01, "lo": lo, "hi": lo + 0.02}}}}


def test_a_measure_has_moved_when_its_paired_ci_lies_above_the_start_on_enough_evaluations_in_a_row() -> None:
    rows = [_row(0, 0.0), _row(5, 0.01), _row(10, -0.01), _row(15, 0.02), _row(20, 0.03), _row(25, 0.01)]
    assert [moved(r, "lines_right") for r in rows] == [False, True, False, True, True, True]
    assert not moved(rows[1], "accuracy")  # a measure the row does not have never moved
    assert first_moved_step(rows, "lines_right", 1) == 5
    assert first_moved_step(rows, "lines_right", 2) == 15  # step 5 alone was not followed by a second
    assert first_moved_step(rows, "lines_right", 3) == 15
    assert first_moved_step(rows, "lines_right", 4) is None


def test_each_measure_is_paired_with_the_start_problem_by_problem() -> None:
    start = EvalRows(0, 2, {"accuracy": [0, 0, 1, 1, 0, 0], "lines_right": [0.1, 0.1, 0.5, 0.5, 0.0, 0.2]})
    now = EvalRows(0, 2, {"accuracy": [1, 0, 1, 1, 0, 0], "lines_right": [0.3, 0.1, 0.5, 0.7, 0.2, 0.2]})
    rows = measure_rows(now, start)
    assert set(rows) == {"accuracy", "lines_right"}
    assert rows["lines_right"]["value"]["mean"] == pytest.approx((0.2 + 0.6 + 0.2) / 3)
    assert rows["lines_right"]["diff_to_start"]["mean"] == pytest.approx((0.1 + 0.1 + 0.1) / 3)
    assert rows["lines_right"]["diff_to_start"]["lo"] == pytest.approx(0.1)  # every problem gained 0.1: no spread
    assert measure_rows(start, start)["accuracy"]["diff_to_start"]["hi"] == 0.0


class _Parts:
    def __init__(self) -> None:
        self.eval_log: list[EvalRows] = []


def _curve(tmp_path: Path, budget_s: float, confirm: int = 2) -> tuple[Curve, _Parts]:
    parts = _Parts()
    meta = {"task": "chain-long", "rollouts_per_step": 32, "eval_problems": 3, "eval_every": 2, "budget_min": 1.0,
            "command": "adwin bench curve", "commit": "abc"}
    return Curve(tmp_path, parts, "lines_right", confirm, 2, budget_s, meta, plots=False), parts


def _evaluation(parts: _Parts, gain: float) -> None:
    parts.eval_log.append(EvalRows(0, 1, {"accuracy": [0.0, 0.0, 0.0], "lines_right": [gain, 0.2 + gain, gain]}))


def _step(curve: Curve, t: int, evaluated: bool) -> None:
    m = {"time/rollout": 1.0, "time/teacher": 0.5, "time/train": 0.5, "rollout/sync_tokens": 100.0}
    if evaluated:
        m |= {"time/eval": 3.0, "eval/mean_len": 50.0, "eval/teacher_kl": 0.1}
    curve.on_step(t, m)


def test_the_curve_stops_once_the_measure_moved_on_two_evaluations_in_a_row(tmp_path: Path) -> None:
    curve, parts = _curve(tmp_path, budget_s=3600.0)
    _evaluation(parts, 0.0)  # the start-of-run evaluation, before step 0's callback
    _step(curve, 0, False)
    _evaluation(parts, 0.1)
    _step(curve, 1, True)  # moved once
    _step(curve, 2, False)
    _evaluation(parts, 0.2)
    with pytest.raises(CurveStop, match="moved"):
        _step(curve, 3, True)
    rows = [json.loads(x) for x in (tmp_path / "curve.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 4]
    assert rows[2]["measures"]["lines_right"]["diff_to_start"]["mean"] == pytest.approx(0.2)
    steps = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4] and steps[0]["step_s"] == pytest.approx(2.0)
    assert curve.summary("moved")["moved_at_step"] == 2
    assert "| 4 |" in (tmp_path / "curve.md").read_text()


def test_the_curve_stops_before_a_block_that_would_pass_the_budget(tmp_path: Path) -> None:
    curve, parts = _curve(tmp_path, budget_s=0.0, confirm=5)
    _evaluation(parts, 0.0)
    _step(curve, 0, False)
    _evaluation(parts, 0.0)
    with pytest.raises(CurveStop, match="budget"):
        _step(curve, 1, True)  # 2 more steps of 2 s and a 3 s evaluation do not fit a 0 s budget
    assert len((tmp_path / "curve.jsonl").read_text().splitlines()) == 2  # the rows made so far are kept


def test_curve_smoke_run_on_the_tiny_profile_writes_its_rows_table_and_plot(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ADWIN_HOME", str(tmp_path / "home"))
    rc = main(["bench", "curve", "--profile", "tiny", "--task", "chain-late-long", "--max-steps", "2",
               "--eval-every", "1", "--budget-min", "10", "--out", str(tmp_path / "out")])
    assert rc == 0
    (folder,) = (tmp_path / "out").iterdir()
    rows = [json.loads(x) for x in (folder / "curve.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert set(rows[1]["measures"]) == {"accuracy", "lines_right", "closing_right", "forced_lines"}
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["measure"] == "closing_right" and summary["steps"] == 2 and summary["rollouts_per_step"] == 4
    assert (folder / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "stopped: max steps (2)" in (folder / "curve.md").read_text()
    assert len((folder / "steps.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(("argv", "match"), [
    (["--eval-every", "0"], "eval-every"),
    (["--task", "chain-long", "--measure", "closing_right"], "closing_right"),
])
def test_bad_curve_arguments_are_refused_before_any_run(tmp_path: Path, monkeypatch, capsys, argv: list[str],
                                                          match: str) -> None:
    monkeypatch.setenv("ADWIN_HOME", str(tmp_path / "home"))
    assert main(["bench", "curve", "--profile", "tiny", "--out", str(tmp_path / "out"), *argv]) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
