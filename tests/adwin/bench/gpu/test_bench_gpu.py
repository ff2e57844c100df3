"""``adwin bench gpu``: the ``--quick`` smoke run on the CPU, and the pieces that keep a cut bench honest (a part
cut at its deadline keeps what it wrote, a run's row comes from its metrics rows, finished or not)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
import torch

from adwin.bench.gpu.command import goals, report
from adwin.bench.gpu.models import TINY, build_pair
from adwin.bench.gpu.runs import summarize, with_ratios
from adwin.bench.gpu.setup import bounded, gpu_tests, junit_counts
from adwin.cli import main


@pytest.mark.slow
def test_quick_runs_every_part_on_the_cpu_baselines_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "gpu", "--quick", "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "gpu-bench.json").read_text())
    assert res["setup"]["device"] == "cpu" and res["setup"]["torch"] == torch.__version__
    assert res["tests"]["status"] in ("passed", "all skipped")  # on a CPU every GPU test skips
    assert res["tests"].get("failed", 0) == 0
    paths = {r["path"]: r for r in res["decode"]["paths"]}
    assert list(paths) == ["static", "engine compiled", "engine"] and not res["decode"]["cut"]
    assert paths["static"]["x_static"] == 1.0 and all(r["ms_per_step"] > 0 for r in paths.values())
    assert all(r["decode_steps"] == res["decode"]["new_tokens"] for r in paths.values())  # the whole budget
    runs = res["runs"]
    assert [r["variant"] for r in runs] == ["fixed", "full", "inline", "rollout", "thread"]
    assert all(r["status"] == "done" and r["steps"] == r["planned_steps"] == 3 for r in runs)
    assert runs[0]["x_fixed"] == 1.0 and runs[0]["mean_window"] == 16 and runs[1]["mean_window"] == 32
    assert runs[2]["probe_tokens"] > 0 and runs[0]["probe_tokens"] == 0 and runs[1]["probe_tokens"] == 0
    assert all(0 <= r["learner_share"] < 1 for r in runs)
    journal = [json.loads(x)["part"] for x in (tmp_path / "parts.jsonl").read_text().splitlines()]
    assert journal == ["setup", "pair", "tests", "decode", "run:fixed", "run:full", "run:inline", "run:rollout",
                       "run:thread"]  # each written as it finished, baselines first
    assert set(res["goals"]["adwin_x_fixed"]) == {"goal", "inline", "rollout", "thread"}
    out = capsys.readouterr().out
    assert "| engine compiled |" in out and "| thread | done |" in out and res["setup"]["commit"] in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_device_without_cuda_exits_2_before_building_anything(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "gpu", "--device", "cuda", "--out", str(tmp_path)]) == 2
    assert "sees no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "pair").exists()


def test_unknown_parts_and_a_lone_student_are_refused(tmp_path: Path) -> None:
    assert main(["bench", "gpu", "--quick", "--parts", "setup,bench", "--out", str(tmp_path)]) == 2
    assert main(["bench", "gpu", "--quick", "--student", str(tmp_path), "--out", str(tmp_path)]) == 2


def test_a_part_cut_at_its_deadline_keeps_what_it_wrote(tmp_path: Path) -> None:
    path, script = tmp_path / "part.jsonl", tmp_path / "part.py"
    script.write_text(f"import pathlib, time\npathlib.Path({str(path)!r}).write_text('finished part\\n')\n"
                      "time.sleep(60)\n")  # a light child: the test module's imports would eat the deadline
    ended = bounded(runpy.run_path, {"path_name": str(script)}, timeout_s=8.0)
    assert ended["cut"] and ended["seconds"] < 40
    assert path.read_text() == "finished part\n"


def test_a_run_row_comes_from_its_metrics_rows_cut_or_not() -> None:
    step = {"time/eval": 0.5, "time/probe": 0.1, "time/audit": 0.1, "time/rollout": 1.0, "window/current": 16,
            "rollout/compile_s": 0.0}
    rows = [step | {"time/wall": 2.5, "rollout/compile_s": 1.0}, step | {"time/wall": 4.0}]
    s = summarize(rows)
    # wall 4.0 - eval 1.0 - compile 1.0 over 2 steps
    assert s["steps"] == 2 and s["s_per_step"] == pytest.approx(1.0) and s["compile_s"] == 1.0
    assert s["learner_share"] == pytest.approx(0.4 / 2.0) and s["rollout_s_per_step"] == 1.0
    assert summarize([]) == {"steps": 0}
    runs = with_ratios([{"variant": "fixed", **s}, {"variant": "inline", "steps": 1, "s_per_step": 1.5},
                        {"variant": "thread", "steps": 0}])
    assert [r["x_fixed"] for r in runs] == [1.0, 1.5, None]


def test_the_report_marks_what_a_cut_bench_did_not_measure() -> None:
    result = {"quick": False, "budget_s": 480.0, "total_s": 480.0,
              "setup": {"commit": "abc1234", "device": "cuda", "device_name": "GPU", "python": "3.12", "torch": "2.11",
                        "cuda_runtime": "13.0", "transformers": "5.17.0", "bf16": True},
              "decode": {"rows": 64, "prompt_len": 16, "new_tokens": 256, "cut": True, "missing": ["engine compiled"],
                         "paths": [{"path": "engine", "first_s": 9.0, "compile_s": 0.0, "ms_per_step": 20.0,
                                    "x_static": 5.0},
                                   {"path": "static", "first_s": 40.0, "compile_s": 35.0, "ms_per_step": 4.0,
                                    "x_static": 1.0}]},
              "runs": [{"variant": "fixed", "status": "done", "planned_steps": 6, "steps": 6, "s_per_step": 2.0,
                        "x_fixed": 1.0, "learner_share": 0.0},
                       {"variant": "inline", "status": "cut", "planned_steps": 6, "steps": 2, "s_per_step": 2.5,
                        "x_fixed": 1.25, "learner_share": 0.2},
                       {"variant": "thread", "status": "skipped", "planned_steps": 6, "note": "3 s left"}]}
    result["goals"] = goals(result)
    assert result["goals"]["decode_x_static"] == {"goal": 1.25, "engine": 5.0, "engine compiled": None}
    assert result["goals"]["adwin_x_fixed"] == {"goal": 1.1, "inline": 1.25}
    text = report(result)
    assert "engine compiled not measured" in text and "| inline | cut | 2/6 |" in text
    assert "| thread | skipped | 0/6 | — |" in text


def test_gpu_tests_run_only_the_marked_modules_and_skip_without_a_tests_folder(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_marked.py").write_text(
        "import pytest\npytestmark = pytest.mark.gpu\n\n"
        "def test_runs():\n    assert True\n\n"
        "@pytest.mark.skip(reason='no CUDA')\ndef test_skips():\n    pass\n")
    (tests / "test_other.py").write_text("import a_package_that_is_not_installed\n")  # never collected
    res = gpu_tests(tests, 120, tmp_path)
    assert (res["status"], res["files"], res["passed"], res["skipped"], res["failed"]) == ("passed", 1, 1, 1, 0)
    assert gpu_tests(tmp_path / "nowhere", 120, tmp_path)["status"] == "skipped"
    assert junit_counts(tmp_path / "gpu-tests.xml")["tests"] == 2


def test_the_built_pair_is_reused_and_the_teacher_is_a_perturbed_copy(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    student, teacher = build_pair(tmp_path, TINY, "float32")
    stamp = (student / "config.json").stat().st_mtime_ns
    assert build_pair(tmp_path, TINY, "float32") == (student, teacher)
    assert (student / "config.json").stat().st_mtime_ns == stamp  # not rebuilt
    s = AutoModelForCausalLM.from_pretrained(student).model.layers[0].mlp.up_proj.weight.detach()
    t = AutoModelForCausalLM.from_pretrained(teacher).model.layers[0].mlp.up_proj.weight.detach()
    rel = float((t - s).std() / s.std())
    assert 0.3 < rel < 0.7 and float(torch.corrcoef(torch.stack([s.flatten(), t.flatten()]))[0, 1]) > 0.8
