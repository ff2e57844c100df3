"""Smoke tests of ``adwin bench audit-agreement`` on a tiny code-built model (every --what)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adwin.cli import main

TINY = ["--model", "llama", "--layers", "2", "--hidden", "32", "--vocab", "64", "--rollouts", "8",
        "--response-len", "24", "--threads", "1"]


def _run(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "r.json"
    assert main(["bench", "audit-agreement", *TINY, *extra, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_agreement_compares_every_top_n_with_all(tmp_path: Path) -> None:
    rows = _run(tmp_path, "--what", "agreement", "--probe-batch", "4")["rows"]
    assert [r["params"] for r in rows] == ["all", "top:1"]
    assert rows[0]["agreement"] == 1.0 and rows[0]["mean_abs_dcos"] == 0.0
    assert 0.0 <= rows[1]["agreement"] <= 1.0 and rows[1]["mean_abs_dcos"] > 0.0


def test_vs_p_reports_both_estimators_per_size(tmp_path: Path) -> None:
    rows = _run(tmp_path, "--what", "vs-p", "--sizes", "2,4", "--repeats", "2")["rows"]
    assert [(r["P"], r["estimator"]) for r in rows] == [(2, "batch"), (2, "debiased"), (4, "batch"), (4, "debiased")]
    assert all(-1.0 <= m <= 1.0 for r in rows for m in r["mean"])


def test_stability_counts_changes_for_the_point_and_confidence_rules(tmp_path: Path) -> None:
    rep = _run(tmp_path, "--what", "stability", "--probe-batch", "4", "--audits", "3", "--levels", "0.8")
    assert [r["rule"] for r in rep["rows"]] == ["point", "confidence 0.8"]
    assert all(0.0 <= r["changes_per_audit"] <= 1.0 for r in rep["rows"])


def test_replay_counts_saved_audits_and_differing_decisions(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    far, near = {"audit/micro_cos_32": 0.1, "audit/micro_cos_64": 0.95}, {"audit/micro_cos_32": 0.75, "audit/micro_cos_64": 0.95}
    metrics.write_text("\n".join(json.dumps({"step": i, **m}) for i, m in enumerate([far, far, far, near, far, far])))
    out = tmp_path / "r.json"
    assert main(["bench", "audit-agreement", "--what", "replay", "--replay", str(metrics), "--json", str(out)]) == 0
    rows = {(r["every"], r["skip_margin"]): r for r in json.loads(out.read_text())["rows"]}
    assert rows[(1, 0.0)]["saved"] == 0 and rows[(1, 0.0)]["differ"] == 0
    assert rows[(2, 0.0)]["saved"] == 3 and rows[(2, 0.0)]["differ"] == 1  # the near audit (window 32) was skipped
    assert rows[(1, 0.2)]["saved"] == 4


def test_replay_without_audits_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 0, "loss/total": 1.0}))
    assert main(["bench", "audit-agreement", "--what", "replay", "--replay", str(metrics)]) != 0
    assert "micro_cos" in capsys.readouterr().err
