"""``adwin bench eval``: a smoke run on the tiny profile (both samplers time the same evaluation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adwin.cli import main


def test_bench_eval_times_both_samplers_which_agree_under_per_sample_seeding(tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    assert main(["bench", "eval", "--profile", "tiny", "--problems", "6", "--repeats", "2", "--json", str(out),
                 "--set", "rollout.max_response_len=24", "--set", "window.candidates=[8,16]", "--set", "window.initial=null",
                 "--set", "rollout.seeding=per_sample",
                 "--set", "probes.backend=inline", "--set", "eval.batch_size=4"]) == 0
    res = json.loads(out.read_text())
    gen, compact = res["summary"]["generate"], res["summary"]["compact"]
    assert len(res["runs"]["generate"]) == len(res["runs"]["compact"]) == 2
    assert gen["seconds"] > 0 and compact["seconds"] > 0
    assert res["speedup"] == pytest.approx(gen["seconds"] / compact["seconds"])
    # per-row seeds: the same samples whichever sampler drew them
    assert compact["eval/accuracy"] == gen["eval/accuracy"] and compact["eval/mean_len"] == gen["eval/mean_len"]
    assert compact["eval/teacher_kl"] == pytest.approx(gen["eval/teacher_kl"], rel=1e-5)
    assert res["meta"]["rows"] == 6


def test_bench_eval_refuses_an_empty_evaluation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "eval", "--profile", "tiny", "--problems", "0"]) != 0
    assert "--problems" in capsys.readouterr().err
