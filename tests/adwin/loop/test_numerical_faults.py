"""NaN/Inf faults: a poisoned step is skipped, a NaN audit is refused (the window stays), repeated faults stop
the run with a checkpoint of the last good state."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from reliability_record import record
from trainer_fixtures import tiny_overrides, write_config

from adwin.audit import job as audit_job
from adwin.cli import main
from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop.parts import load_parts
from adwin.loop.trainer import train
from adwin.runtime.checkpoint import latest_checkpoint, load_weights
from adwin.student.structure import is_lora
from adwin.teacher.checkpoints import load_model
from adwin.teacher.local import Teachers


def _snapshot(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_nan_teacher_step_is_skipped_and_the_weights_stay_finite(tmp_path: Path) -> None:
    cfg = load_config(None, tiny_overrides(tmp_path, steps=4, name="nan", **{"eval.every": 0}))
    parts = load_parts(cfg)
    real_score, poison = parts.teachers.score, {"on": False}

    def score(ids, attn, routes):  # (B, L) teacher logprobs, NaN while poisoned
        out = real_score(ids, attn, routes)
        return out * float("nan") if poison["on"] else out

    parts.teachers.score = score  # type: ignore[method-assign]
    snaps: list[list[torch.Tensor]] = []

    def on_step(t: int, m: dict) -> None:
        snaps.append(_snapshot(parts.student))
        poison["on"] = t == 0  # poisons step 1 only

    res = train(cfg, Controller(), parts, on_step=on_step)
    skipped = [h["optim/skipped"] for h in res.history]
    assert skipped == [0.0, 1.0, 0.0, 0.0]
    assert not math.isfinite(res.history[1]["loss/total"])
    assert _same(snaps[0], snaps[1]), "the NaN step must not touch the weights"
    assert not _same(snaps[1], snaps[2]), "training resumes after the fault"
    assert all(torch.isfinite(p).all() for p in parts.student.parameters())
    assert res.history[-1]["optim/skipped_steps"] == 1.0 and res.history[-1]["optim/consecutive_skipped"] == 0.0
    record("nan_step", {"faults_injected": 1, "steps_skipped": int(sum(skipped)), "runs_finished": 1,
                        "non_finite_weights": 0})


def test_audit_with_nan_cosines_is_rejected_and_the_window_stays(tmp_path: Path, monkeypatch) -> None:
    real_audit = audit_job.audit  # what inline and worker audits call

    def nan_audit(*a, **k):
        res = real_audit(*a, **k)
        res.cosines = {c: float("nan") for c in res.cosines}
        return res

    monkeypatch.setattr(audit_job, "audit", nan_audit)
    cfg = load_config(None, tiny_overrides(tmp_path, steps=4, name="nan-audit", **{"eval.every": 0}))
    controller = Controller()
    res = train(cfg, controller)
    rejected = sum(h.get("audit/rejected", 0.0) for h in res.history)  # several may come back in one step
    assert rejected >= 1, "a 4-step run with P=2 audits at least once"
    assert {h["window/current"] for h in res.history} == {float(max(cfg.window.candidates))}
    tel = controller.telemetry(res.run_id)
    reasons = [d["reason"] for d in tel.decisions]
    assert reasons.count("fallback") == rejected and "audit" not in reasons
    record("nan_audit", {"faults_injected": int(rejected), "audits_rejected": reasons.count("fallback"),
                         "window_changes": len({h["window/current"] for h in res.history}) - 1, "runs_finished": 1})


def test_repeated_faults_stop_the_run_with_a_checkpoint_of_the_last_good_state(tmp_path: Path, monkeypatch,
                                                                                capsys) -> None:
    real_score = Teachers.score
    monkeypatch.setattr(Teachers, "score", lambda self, *a: real_score(self, *a) * float("inf"))
    ov = tiny_overrides(tmp_path, steps=6, name="doomed", **{"optim.max_bad_steps": 2, "eval.every": 0})
    path = write_config(tmp_path / "doomed.yaml", ov)
    capsys.readouterr()
    assert main(["train", "--config", str(path), "--no-progress"]) == 3
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("adwin")]
    assert len(err) == 1 and "optim.max_bad_steps=2" in err[0] and "checkpoint-2" in err[0], err
    run_dir = tmp_path / "runs" / "doomed"
    ck = latest_checkpoint(run_dir)
    assert ck == run_dir / "checkpoint-2"
    initial = load_model(ov["model.student"], "float32", "cpu")
    saved = load_model(ov["model.student"], "float32", "cpu")
    load_weights(ck, saved, lora=is_lora(saved))
    assert _same(_snapshot(initial), _snapshot(saved)), "both steps were skipped: the checkpoint is the start"
    record("repeated_faults", {"faults_injected": 2, "runs_stopped_cleanly": 1, "exit_code": 3,
                               "checkpoint_equals_last_good_state": True})
