"""End-to-end runs of the synchronous trainer on tiny on-disk checkpoints with the real controller."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import trainer_fixtures
from trainer_fixtures import tiny_overrides

from adwin.config import apply_policy_spec, load_config
from adwin.controller import Controller
from adwin.loop.accounting import TokenLedger
from adwin.loop.parts import load_parts
from adwin.loop.trainer import train
from adwin.sampling.batch import Batch
from adwin.sampling.rollout import Rows
from adwin.student.optimizer import build_optimizer

NAMESPACES = ("window/", "rollout/", "probe/", "audit/", "optim/", "loss/", "eval/", "time/", "drift/")


def test_adwin_run_audits_applies_decisions_next_step_and_bounds_staleness(tmp_path: Path) -> None:
    cfg = load_config(None, tiny_overrides(tmp_path, steps=4, name="adw"))
    controller = Controller()
    res = train(cfg, controller)
    hist = res.history
    assert len(hist) == 4
    seen = {k.split("/")[0] + "/" for h in hist for k in h if "/" in k}
    assert set(NAMESPACES) <= seen
    audits = [h for h in hist if "audit/id" in h]
    assert audits, "a 4-step run with P=2 and 2 offers per step must audit"
    assert all(h["probe/staleness_max"] <= cfg.probes.staleness_limit for h in hist if "probe/staleness_max" in h)
    windows = [int(h["window/current"]) for h in hist]
    assert windows[0] == max(cfg.window.candidates)  # ADWIN starts at the largest candidate
    for h in audits[:1]:  # the first audit's decision applies from the next step (thread: whenever it lands)
        if h["step"] + 1 < len(windows):
            assert windows[h["step"] + 1] == int(h["audit/next_window"])
    assert all(w in (*cfg.window.candidates, cfg.rollout.max_response_len) for w in windows)
    for h in hist:  # no rollout longer than its window
        assert h["rollout/mean_len"] <= h["window/current"]
        assert h["rollout/full_equiv_tokens"] >= h["rollout/sync_tokens"]
        assert h["rollout/mean_len"] <= h["rollout/decode_steps"] <= h["window/current"]
    assert sum(h["probe/decode_steps"] for h in hist) > 0  # the thread worker's rounds, counted when applied
    # run folder: resolved config, one JSONL row per step, a checkpoint with the policy state
    run_dir = tmp_path / "runs" / "adw"
    assert json.loads((run_dir / "config.json").read_text())["window"]["policy"] == "adwin"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    ckpt = run_dir / "checkpoint-4"
    state = json.loads((ckpt / "state.json").read_text())
    assert state["step"] == 4 and state["policy_state"]["name"] == "adwin"
    assert (ckpt / "config.json").exists() and (ckpt / "trainer_state.pt").exists()
    # the controller saw every step's numeric metrics and the audits
    tel = controller.telemetry(res.run_id)
    assert len(tel.steps) == 4 and len(tel.audits) == sum(h.get("audit/submitted", 0) for h in hist)
    assert "eval/accuracy" in res.initial_eval and "eval/teacher_kl" in res.final_eval


@pytest.mark.parametrize(("spec", "expected"), [
    ("full", [16, 16, 16]),
    ("fixed:4", [4, 4, 4]),
    ("linear:4:4", [4, 8, 12]),
])
def test_schedule_policies_follow_their_schedule_without_probes(tmp_path: Path, spec: str, expected: list[int]) -> None:
    ov = apply_policy_spec(tiny_overrides(tmp_path, name=spec.replace(":", "-"), **{"eval.every": 0}), spec)
    res = train(load_config(None, ov), Controller())
    assert [int(h["window/current"]) for h in res.history] == expected
    assert all(h["window/reason"] == "schedule" for h in res.history)
    assert not any(k.startswith(("probe/active", "audit/")) for h in res.history for k in h)
    assert res.totals["probe_tokens"] == 0
    for h, w in zip(res.history, expected, strict=True):
        assert h["rollout/mean_len"] <= h["rollout/decode_steps"] <= w


def test_training_moves_the_student_only(tmp_path: Path) -> None:
    cfg = load_config(None, tiny_overrides(tmp_path, steps=2, **{"eval.every": 0}))
    parts = load_parts(cfg)
    before_s = [p.detach().clone() for p in parts.student.parameters()]
    teacher = next(iter(parts.teachers.models.values()))
    before_t = [p.detach().clone() for p in teacher.parameters()]
    train(cfg, Controller(), parts)
    assert any(not torch.equal(a, b) for a, b in zip(before_s, parts.student.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(before_t, teacher.parameters(), strict=True))


@pytest.mark.parametrize("schedule", ["constant", "cosine", "linear"])
def test_lr_schedule_warms_up_then_follows_its_shape(tmp_path: Path, schedule: str) -> None:
    cfg = load_config(None, {"steps": 10, "optim.lr": 0.1, "optim.warmup_steps": 2, "optim.schedule": schedule})
    opt, sched = build_optimizer(cfg, torch.nn.Linear(2, 2))
    lrs = []
    for _ in range(10):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[0] < lrs[1] < lrs[2] == pytest.approx(0.1)
    if schedule == "constant":
        assert lrs[-1] == pytest.approx(0.1)
    else:
        assert all(a >= b for a, b in zip(lrs[2:], lrs[3:], strict=False)) and lrs[-1] < 0.05


def _batch(lengths: list[int], finished: list[bool]) -> Batch:
    rows = Rows(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1))
    return Batch([], [[1]] * len(lengths), [[5] * n for n in lengths], finished, rows)


def test_full_rollout_estimate_uses_probe_lengths_clamped_to_window_and_horizon() -> None:
    ledger = TokenLedger(max_len=100)
    m = ledger.record(_batch([3, 10, 10], [True, False, False]), window=10, probe_tokens_total=0)
    assert m["rollout/sync_tokens"] == 23
    assert m["rollout/full_equiv_tokens"] == 3 + 2 * 100  # no probe yet: the horizon bounds it
    ledger.completed_lengths += [40, 60]
    m = ledger.record(_batch([3, 10, 10], [True, False, False]), window=10, probe_tokens_total=0)
    assert m["rollout/full_equiv_tokens"] == 3 + 2 * 50
    ledger.completed_lengths[:] = [4]
    m = ledger.record(_batch([3, 10], [True, False]), window=10, probe_tokens_total=0)
    assert m["rollout/full_equiv_tokens"] == 3 + 100  # no probe longer than the window: the horizon bounds it
    assert ledger.totals(7) == {"sync_tokens": 23.0 + 23 + 13, "probe_tokens": 7.0, "full_equiv_tokens": 203.0 + 103 + 103}


def test_multi_teacher_run_routes_by_key(tmp_path: Path) -> None:
    from trainer_fixtures import make_assets

    ov = tiny_overrides(tmp_path, steps=1, **{"eval.every": 0})
    ov.update(make_assets(tmp_path, routes=("math", "code")))
    res = train(load_config(None, ov), Controller())
    assert len(res.history) == 1
    ov["model.teachers"] = {"math": ov["model.teachers"]["math"]}
    ov["model.teachers"]["physics"] = ov["model.teachers"]["math"]
    with pytest.raises(ValueError, match="'code'"):
        load_parts(load_config(None, ov))


def test_a_run_beyond_the_students_context_stops_before_any_weights_load(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer_fixtures import make_assets

    from adwin.loop import parts as parts_module
    from adwin.sampling.data import DataError

    ov = tiny_overrides(tmp_path, steps=1, **{"eval.every": 0})
    ov.update(make_assets(tmp_path, routes=("math", "code")))
    loaded: list[str] = []
    monkeypatch.setattr(parts_module, "load_model", lambda path, *a, **k: loaded.append(str(path)))
    ov["rollout.max_response_len"] = 100_000
    with pytest.raises(DataError, match=r"rollout\.max_response_len \(100000\).*student's context"):
        load_parts(load_config(None, ov))
    assert loaded == []


def test_gradient_checkpointing_on_a_student_hf_cannot_checkpoint_is_refused_at_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer_fixtures import make_assets

    from adwin.loop import parts as parts_module

    real = parts_module.load_model

    def no_checkpointing(*a: object, **k: object) -> torch.nn.Module:
        model = real(*a, **k)
        model.supports_gradient_checkpointing = False  # as a model class without HF checkpointing layers
        return model

    ov = tiny_overrides(tmp_path, steps=1, **{"eval.every": 0})
    ov.update(make_assets(tmp_path, routes=("math", "code")))
    ov["model.gradient_checkpointing"] = True
    monkeypatch.setattr(parts_module, "load_model", no_checkpointing)
    with pytest.raises(ValueError, match="model.gradient_checkpointing: .* has no HF checkpointing layers"):
        load_parts(load_config(None, ov))
    monkeypatch.setattr(parts_module, "load_model", real)
    parts = load_parts(load_config(None, ov))
    layers = [m for m in parts.student.modules() if getattr(m, "gradient_checkpointing", False)]
    assert layers and not any(m.training for m in layers)  # enabled, off until the training forward


def test_summary_counts_audits_that_changed_the_window() -> None:
    from adwin.runtime.summary import summarize

    hist = [
        {"window/current": 256.0, "audit/submitted": 1.0, "audit/id": 1.0, "audit/next_window": 256.0,
         "probe/staleness_max": 1.0},
        # two audits came back in one step: the step reports both in the count, the last one's id and decision
        {"window/current": 256.0, "audit/submitted": 2.0, "audit/id": 3.0, "audit/next_window": 64.0,
         "probe/staleness_max": 3.0},
        {"window/current": 64.0, "time/rollout": 2.0, "time/probe": 0.25, "time/audit": 0.25, "time/eval": 4.0,
         "time/wall": 9.0, "decision/flops_share": 0.08},
    ]
    s = summarize(hist, {"eval/accuracy": 0.1}, {"eval/accuracy": 0.3}, {"sync_tokens": 5.0})
    assert (s["audits"], s["audits_changing_window"], s["window_changes"]) == (3, 1, 1)
    assert s["staleness_max"] == 3.0 and s["time"]["rollout"] == 2.0 and s["wall_s"] == 9.0
    assert s["accuracy_final"] > s["accuracy_initial"]
    # the learner's decision seconds over the wall without evaluation (the same for every policy)
    assert s["decision_share"] == 0.5 / (9.0 - 4.0) and s["decision_flops_share"] == 0.08


def test_tiny_assets_load_as_hf_checkpoints(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ov = trainer_fixtures.make_assets(tmp_path, routes=("a", "b"))
    tok = AutoTokenizer.from_pretrained(ov["model.student"])
    model = AutoModelForCausalLM.from_pretrained(ov["model.teachers"]["b"])
    assert tok.eos_token_id == 2 == model.generation_config.eos_token_id
    assert len(tok) <= model.config.vocab_size
    lines = Path(ov["data.path"]).read_text().splitlines()
    assert {json.loads(x)["teacher"] for x in lines} == {"a", "b"}
