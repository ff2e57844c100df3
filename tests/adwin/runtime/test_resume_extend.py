"""Extending a run: ``adwin train --resume RUN --steps N`` after a shorter run equals a straight N-step run
(issue 20). Built-in task prompts (whose stream used to be sized by the run's steps), tiny models, CPU."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trainer_fixtures import tiny_overrides

from adwin.cli import main
from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop.trainer import train

SHORT, LONG = 2, 4


def _cfg(tmp: Path, out: str, steps: int, **extra: object):
    # inline probe rounds: exactness needs a run that is a pure function of its seed
    ov = tiny_overrides(tmp, steps=steps, name="run", checkpoint_every=SHORT,
                        **{"data.task": "builtin", "data.path": None, "out_dir": str(tmp / out),
                           "probes.backend": "inline", "eval.every": 0})
    ov.update(extra)
    return load_config(None, ov)


def _max_diff(a: Path, b: Path) -> float:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    return max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)


def test_extended_run_equals_a_straight_run_at_the_shared_step_and_at_the_end(tmp_path: Path) -> None:
    straight = train(_cfg(tmp_path, "straight", LONG), Controller())
    train(_cfg(tmp_path, "split", SHORT), Controller())  # a finished short run, evaluated at its last step
    run_dir = tmp_path / "split" / "run"
    assert main(["train", "--resume", str(run_dir), "--steps", str(LONG), "--no-progress", "--no-serve"]) == 0
    s_dir = tmp_path / "straight" / "run"
    assert _max_diff(run_dir / f"checkpoint-{SHORT}", s_dir / f"checkpoint-{SHORT}") == 0.0
    assert _max_diff(run_dir / f"checkpoint-{LONG}", s_dir / f"checkpoint-{LONG}") == 0.0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(LONG))
    windows = [int(h["window/current"]) for h in straight.history]
    assert [int(r["window/current"]) for r in rows] == windows
    assert rows[-1]["eval/accuracy"] == straight.history[-1]["eval/accuracy"]  # evaluation draws its own noise
    assert json.loads((run_dir / "config.json").read_text())["steps"] == LONG


def test_resume_with_steps_at_or_below_the_checkpoint_is_refused(tmp_path: Path, capsys) -> None:
    train(_cfg(tmp_path, "done", SHORT), Controller())
    run_dir = tmp_path / "done" / "run"
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--no-progress", "--no-serve"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint-{SHORT} is at step {SHORT}" in err and f"--steps above {SHORT}" in err


@pytest.mark.parametrize("schedule,warns", [("cosine", True), ("constant", False)])
def test_extending_a_decaying_schedule_warns(tmp_path: Path, caplog, schedule: str, warns: bool) -> None:
    from adwin.runtime.resume import check_extension

    run_dir = tmp_path / "run"
    (run_dir / "checkpoint-2").mkdir(parents=True)
    (run_dir / "checkpoint-2" / "state.json").write_text(json.dumps({"run_id": "r", "step": 2}))
    (run_dir / "config.json").write_text(json.dumps({"steps": 2}))
    with caplog.at_level(logging.WARNING, logger="adwin.runtime.resume"):
        check_extension(run_dir / "checkpoint-2", 4, schedule)
    assert ("stretches the decay" in caplog.text) is warns


def test_evaluation_leaves_the_training_rng_where_it_was(tmp_path: Path) -> None:
    from adwin.loop.evaluate import evaluate
    from adwin.loop.parts import load_parts
    from adwin.loop.sampler import Sampler

    cfg = _cfg(tmp_path, "rng", SHORT)
    parts = load_parts(cfg)
    torch.manual_seed(1)
    before = torch.get_rng_state()
    first = evaluate(parts, cfg, Sampler(parts, cfg))
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(2)  # a different training RNG position: the evaluation draws the same noise anyway
    assert evaluate(parts, cfg, Sampler(parts, cfg)) == first
