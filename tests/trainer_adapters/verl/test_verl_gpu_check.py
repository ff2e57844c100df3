"""The GPU check's command line and check list on CPU (verl-free): what needs CUDA is skipped, and the checks that
read a recorded verl run pass and fail on recordings written here. The checks themselves need GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from adwin.trainer_adapters.verl import gpu_check as gc


def test_the_six_checks_run_in_the_order_asked():
    assert gc.CHECKS == ("devices", "one_step", "first_audit", "update_and_sync", "ranks_agree", "step_time")


def test_arguments_parse_and_bad_ones_are_refused(tmp_path: Path):
    args = gc.parse_args(["--workdir", str(tmp_path)])
    assert args.only == list(gc.CHECKS) and args.steps == 3 and args.gpus is None
    assert gc.parse_args(["--workdir", str(tmp_path), "--only", "ranks_agree, devices"]).only == ["ranks_agree",
                                                                                                 "devices"]
    for bad in (["--only", "devcies"], ["--steps", "2"], ["--gpus", "0"], []):
        with pytest.raises(SystemExit):
            gc.parse_args(([] if bad == [] else ["--workdir", str(tmp_path)]) + bad)


def test_without_cuda_every_check_is_a_skip_line_in_order(tmp_path: Path):
    args = gc.parse_args(["--workdir", str(tmp_path)])
    args.gpus = 0  # what main finds on a machine without CUDA
    lines: list[str] = []
    outcomes = gc.run_checks(args, emit=lines.append)
    assert [line.split()[:2] for line in lines] == [["SKIP", f"{i}."] for i in range(1, 7)]
    assert all(o.passed is None for o in outcomes)


def test_one_gpu_runs_the_devices_and_first_audit_checks_only():
    assert [c for c in gc.CHECKS if gc.needs(c, 1) is None] == ["devices", "first_audit"]
    assert [c for c in gc.CHECKS if gc.needs(c, 2) is None] == list(gc.CHECKS)


def test_a_check_that_raises_is_a_fail_line_and_the_next_check_runs(tmp_path: Path, monkeypatch):
    args = gc.parse_args(["--workdir", str(tmp_path), "--only", "devices,first_audit"])
    args.gpus = 1

    def one(name, *_):
        if name == "devices":
            raise RuntimeError("no driver")
        return gc.Outcome(name, True, "ok")

    monkeypatch.setattr(gc, "_one", one)
    monkeypatch.setattr(gc, "build_assets", lambda workdir: {})
    lines: list[str] = []
    gc.run_checks(args, emit=lines.append)
    assert lines == ["FAIL 1. devices: RuntimeError: no driver", "PASS 3. first_audit: ok"]


def _run(window: int = 16, trained: int = 16, copies: tuple[int, ...] = (64, 40), eos: tuple[bool, ...] = (False, True),
         probe_rows: int = 0, uid: bool = True, steps: int = 3) -> list[dict]:
    """A recorded verl run as ``gpu_check_runner`` writes it."""
    events: list[dict] = [{"event": "sync", "step": 0}]
    for s in range(1, steps + 1):
        events.append({"event": "generate", "step": s, "window": window, "copy_lengths": list(copies),
                       "copy_caps": [gc.HORIZON] * len(copies), "copy_ended_eos": list(eos), "gen_s": 1.0})
        events.append({"event": "update", "step": s, "response_lengths": [trained, 3], "probe_rows": probe_rows,
                       "teacher_logprobs": True, "uid": uid})
        events.append({"event": "audit", "step": s, "after_update": True, "seconds": 0.5})
        events.append({"event": "sync", "step": s})
        if s > 1:
            events.append({"event": "metrics", "step": s, "of_step": s - 1, "step_s": 2.0, "gen_s": 1.0})
    return events


def test_the_recorded_run_checks_pass_and_fail_on_what_they_read():
    assert gc.check_one_step(_run()).passed
    assert not gc.check_one_step(_run(trained=17)).passed  # a trained row longer than the window
    assert not gc.check_one_step(_run(probe_rows=1)).passed  # a probe copy in update_actor's batch
    assert not gc.check_one_step(_run(eos=(False, False))).passed  # a copy cut before the horizon without EOS
    assert not gc.check_one_step(_run(uid=False)).passed
    assert gc.check_update_and_sync(_run(), 3).passed
    assert not gc.check_update_and_sync(_run(steps=2), 3).passed  # the run stopped early
    assert gc.check_step_time(_run(), _run()).passed
    assert not gc.check_step_time(_run(steps=2), _run()).passed  # no step past the first probe step was timed


def test_the_trainer_is_v1_unless_asked(tmp_path: Path):
    assert gc.parse_args(["--workdir", str(tmp_path)]).trainer == "v1"
    assert gc.parse_args(["--workdir", str(tmp_path), "--trainer", "legacy"]).trainer == "legacy"
    with pytest.raises(SystemExit):
        gc.parse_args(["--workdir", str(tmp_path), "--trainer", "v2"])


@pytest.mark.parametrize("trainer", ["v1", "legacy"])
def test_the_checks_verl_runs_pass_verls_and_adwins_config_checks(tmp_path: Path, trainer: str):
    """The overrides of checks 2, 4 and 6, composed with verl's Hydra config, through adwin's main up to Ray."""
    pytest.importorskip("verl.protocol")
    import verl
    from hydra import compose, initialize_config_dir

    from adwin.trainer_adapters.verl.main import prepare

    assets = {"student": tmp_path / "student", "teacher": tmp_path / "teacher", "data": tmp_path / "data"}
    overrides = gc.verl_overrides(assets, 2, 3, tmp_path / "run.jsonl", 1, trainer)
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    prepare(config)  # adwin's refusals, then verl's validate_config
    assert config.trainer.use_v1 is (trainer == "v1")
