"""Checkpoint + resume: N steps straight equal N/2, a crash, a resume and N/2 more (CPU, tiny models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from reliability_record import record
from trainer_fixtures import tiny_overrides

from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop.trainer import train
from adwin.runtime import checkpoint as ckpt_mod
from adwin.runtime.checkpoint import latest_checkpoint
from adwin.runtime.resume import open_resumed_controller
from adwin.student.structure import is_lora

N = 6


class Crash(RuntimeError):
    pass


def _cfg(tmp: Path, out: str, **extra: object):
    # inline probe rounds: exactness needs a run that is a pure function of its seed (a thread's rounds land
    # in whichever step the scheduler lets them)
    ov = tiny_overrides(tmp, steps=N, name="run", checkpoint_every=N // 2,
                        **{"eval.every": 0, "out_dir": str(tmp / out), "probes.backend": "inline"})
    ov.update(extra)
    return load_config(None, ov)


def _crash_after(step: int, seen: list[dict]):
    def on_step(t: int, m: dict) -> None:
        seen.append(m)
        if t == step:
            raise Crash(f"simulated crash after step {t}")
    return on_step


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_resumed_run_matches_straight_run_parameters_and_windows(tmp_path: Path) -> None:
    straight_cfg = _cfg(tmp_path, "straight")
    straight = train(straight_cfg, Controller())
    from adwin.loop.parts import load_parts

    cfg = _cfg(tmp_path, "split")
    first: list[dict] = []
    with pytest.raises(Crash):  # crashes after step N/2 (+1: past the checkpoint, as a real crash would be)
        train(cfg, Controller(), on_step=_crash_after(N // 2, first))
    run_dir = tmp_path / "split" / "run"
    ck = latest_checkpoint(run_dir)
    assert ck is not None and ck.name == f"checkpoint-{N // 2}"
    parts = load_parts(cfg)
    res = train(cfg, open_resumed_controller(ck), parts, resume=ck)

    windows = [int(h["window/current"]) for h in straight.history]
    resumed = [int(m["window/current"]) for m in first[: N // 2]] + [int(h["window/current"]) for h in res.history]
    assert resumed == windows
    assert any("audit/id" in h for h in straight.history), "the run must audit for the window check to mean much"
    straight_ck = json.loads((tmp_path / "straight" / "run" / f"checkpoint-{N}" / "state.json").read_text())
    split_ck = json.loads((run_dir / f"checkpoint-{N}" / "state.json").read_text())
    assert split_ck["policy_state"] == straight_ck["policy_state"]
    # the decision budget's state came back: its cumulative shares continue, not restart at the checkpoint
    for key in ("decision/flops_share", "decision/decisions", "decision/in_flight"):
        assert res.history[-1][key] == pytest.approx(straight.history[-1][key]), key
    budgets = [torch.load(d / f"checkpoint-{N}" / "trainer_state.pt", weights_only=False)["extra"]["decision_budget"]
               for d in (tmp_path / "straight" / "run", run_dir)]
    for state in budgets:
        state.pop("train_seconds"), state.pop("seconds"), state.pop("learner_seconds")  # measured: differ between any two runs
    assert budgets[0] == budgets[1]
    s_model = load_parts(straight_cfg).student
    ckpt_mod.load_weights(tmp_path / "straight" / "run" / f"checkpoint-{N}", s_model, lora=is_lora(s_model))
    diffs = [float((a - b).abs().max()) for a, b in zip(_params(s_model), _params(parts.student), strict=True)]
    assert max(diffs) <= 1e-6, max(diffs)
    # the step after the checkpoint was logged by the crashed run and again after resume: once in the file
    rows = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows == list(range(N))
    tel = Controller(str(run_dir / "controller.db")).telemetry(res.run_id)
    assert [s["step"] for s in tel.steps] == list(range(N))
    record("resume", {"steps": N, "crashes_injected": 1, "runs_finished": 1, "max_param_diff": max(diffs),
                      "window_sequence_equal": resumed == windows, "telemetry_rows_lost": N - len(tel.steps)})


def test_crash_mid_checkpoint_write_keeps_previous_checkpoint_and_resume_uses_it(tmp_path: Path, monkeypatch) -> None:
    cfg = _cfg(tmp_path, "crashy", steps=4, checkpoint_every=2)
    real_save = torch.save
    calls = {"n": 0}

    def flaky_save(obj, f, *a, **k):  # the second checkpoint dies half-written
        calls["n"] += 1
        if calls["n"] == 2:
            Path(f).write_bytes(b"torn")
            raise OSError("disk gone mid-write")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(ckpt_mod.torch, "save", flaky_save)
    with pytest.raises(OSError, match="mid-write"):
        train(cfg, Controller())
    monkeypatch.setattr(ckpt_mod.torch, "save", real_save)
    run_dir = tmp_path / "crashy" / "run"
    # a hard kill would leave the temp folder behind: simulate that too, next to the good checkpoint
    (run_dir / ".checkpoint-4.abc.tmp").mkdir()
    (run_dir / ".checkpoint-4.abc.tmp" / "config.json").write_text("{")
    assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == ["checkpoint-2"]
    ck = latest_checkpoint(run_dir)
    assert ck == run_dir / "checkpoint-2"
    res = train(cfg, open_resumed_controller(ck), resume=ck)
    assert [h["step"] for h in res.history] == [2, 3]
    assert latest_checkpoint(run_dir) == run_dir / "checkpoint-4"
    assert not list(run_dir.glob(".checkpoint-*"))  # the next save swept the partial folder
    record("checkpoint_crash", {"crashes_injected": 1, "runs_finished": 1, "checkpoints_lost": 0})


def test_resume_cli_continues_the_latest_checkpoint(tmp_path: Path, capsys) -> None:
    from adwin.cli import main

    cfg = _cfg(tmp_path, "cli", steps=4, checkpoint_every=2)
    with pytest.raises(Crash):
        train(cfg, Controller(), on_step=_crash_after(2, []))
    run_dir = tmp_path / "cli" / "run"
    assert main(["train", "--resume", str(run_dir), "--no-progress", "--no-serve"]) == 0
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2  # the two resumed steps
    assert latest_checkpoint(run_dir) == run_dir / "checkpoint-4"
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nowhere" in err[0]


def test_the_audit_schedule_survives_a_checkpoint() -> None:
    # audit.every / skip_margin: a resumed run skips the same batches the straight run would
    from adwin.audit.schedule import AuditSchedule
    from adwin.loop.accounting import TokenLedger
    from adwin.loop.learner import FaultCounter
    from adwin.probes.pool import ProbePool
    from adwin.runtime.resume import restore_run_state, run_state
    from adwin.tasks.prompts import BuiltinPrompts

    before = AuditSchedule(threshold=0.7, every=3, skip_margin=0.2)
    for cos in ({4: 0.1}, {4: 0.95}):
        before.should_audit()
        before.record(cos)
    extra = run_state(ProbePool(8), TokenLedger(8), BuiltinPrompts(0), FaultCounter(3), before)
    after = AuditSchedule(threshold=0.7, every=3, skip_margin=0.2)
    restore_run_state(extra, ProbePool(8), TokenLedger(8), BuiltinPrompts(0), FaultCounter(3), after)
    assert after.state_dict() == before.state_dict()
    assert [after.should_audit() for _ in range(5)] == [before.should_audit() for _ in range(5)]
