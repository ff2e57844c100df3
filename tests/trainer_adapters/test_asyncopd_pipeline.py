"""AsyncOPD end to end on tiny HF models (CPU): permits, sync gate, keep-mode, probes and audits, metrics."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from asyncopd_stubs import Recorder
from softmax_widths import softmax_widths
from tiny_models import make_tiny_llama, padded_copy

from adwin.config import AsyncOPDSection, load_config
from adwin.controller import Controller
from adwin.loop.parts import Parts
from adwin.objectives.losses import opd_loss
from adwin.sampling.data import Prompt, PromptStream
from adwin.tasks.tokenizer import build_tokenizer
from adwin.teacher import scoring
from adwin.teacher.local import Teachers
from adwin.trainer_adapters.asyncopd.hf import HFLearner, HFRolloutEngine, HFTeacherScorer
from adwin.trainer_adapters.asyncopd.items import StreamItem, TokenOut
from adwin.trainer_adapters.asyncopd.run import build_asyncopd, run_asyncopd

pytestmark = pytest.mark.timeout(120)


def tiny_parts(seed: int = 0) -> Parts:
    student = make_tiny_llama(seed=seed)
    student.generation_config.eos_token_id = 2
    prompts = [Prompt(f"q{i}", f"{i % 7}+{(i * 3) % 5}=", str(i % 7 + (i * 3) % 5)) for i in range(24)]
    return Parts(student, build_tokenizer(), Teachers({"default": make_tiny_llama(seed=10)}),
                 PromptStream(prompts, seed), prompts[:2], lambda a, b: a == b)


def tiny_cfg(tmp: Path, **extra: object):
    ov: dict[str, object] = {
        "steps": 5, "out_dir": str(tmp / "runs"), "name": "aopd", "scheduler": "asyncopd",
        "rollout.prompts_per_step": 2, "rollout.samples_per_prompt": 2, "rollout.max_response_len": 12,
        "data.max_prompt_len": 8,
        "window.candidates": [4, 8], "probes.batch_size": 2, "probes.offers_per_step": 2,
        "probes.staleness_limit": 3, "loss.name": "reverse_kl_mc", "loss.mc_samples": 3,
        "controller.serve": False, "logging.progress": False, "optim.lr": 1e-3,
    }
    ov.update(extra)
    return load_config(overrides=ov)


class KeepModeProbe(HFRolloutEngine):
    """Holds request 2 (the first training request: 0 and 1 become probes) at 3 tokens until weights
    version 1 arrive; records every weights snapshot it receives."""

    snapshots: dict[int, dict[str, torch.Tensor]] = {}
    held: StreamItem | None = None

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        KeepModeProbe.snapshots[version] = weights
        super().load_weights(weights, version)

    def step(self, items: Sequence[StreamItem]) -> list[TokenOut | None]:
        outs = super().step(items)
        for it in items:
            if it.seq == 2:
                KeepModeProbe.held = it
        return [None if it.seq == 2 and len(it.tokens) == 3 and self.version < 1 else o
                for it, o in zip(items, outs, strict=True)]


def test_asyncopd_run_bounds_permits_keeps_prefixes_and_audits_probes(tmp_path: Path) -> None:
    cfg = tiny_cfg(tmp_path)
    parts = tiny_parts()
    KeepModeProbe.snapshots = {0: {k: v.detach().clone() for k, v in parts.student.state_dict().items()}}
    ctrl = Controller()
    opts = AsyncOPDSection(queue_depth=1, rollout_workers=2, worker_batch=8, teacher_batch=8, wait_timeout_s=60,
                           throughput_warmup=2)
    built = build_asyncopd(cfg, ctrl, parts=parts, options=opts, engine_cls=KeepModeProbe)
    rec = Recorder().attach(built.scheduler)
    out = run_asyncopd(cfg, ctrl, built=built)
    sched = built.scheduler

    # permit bound and sync gate, recomputed from the event log
    B = 4
    assert out["batch_size"] == B and out["permits"]["capacity"] == 2 * B
    assert out["permits"]["max_outstanding"] <= 2 * B
    assert out["checks"]["max_unconsumed"] <= 2 * B and out["checks"]["gate_violations"] == 0
    assert [w.engine.version for w in sched.workers] == [cfg.steps] * 2, "every worker holds the last weights"

    # keep-mode: the held request kept its 3-token prefix, the rest came from version >= 1 weights,
    # and each token's behavior logprob is the one of the snapshot that sampled it
    held = KeepModeProbe.held
    assert held is not None and not held.is_probe and held in rec.consumed
    assert held.token_versions[:3] == [0, 0, 0] and held.version_breakpoints[0][0] == 3
    assert held.version_breakpoints[0][1] >= 1
    model = make_tiny_llama(seed=0)
    for j, (tok, v) in enumerate(zip(held.tokens, held.token_versions, strict=True)):
        model.load_state_dict(KeepModeProbe.snapshots[v])
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([held.prompt_ids + held.tokens[:j]])).logits[0, -1]
        assert held.logprobs[j] == pytest.approx(float(torch.log_softmax(logits, -1)[tok]), abs=1e-4)

    # probes: full length, detached from training batches, reported to the controller and audited
    tel = ctrl.telemetry(out["run_id"])
    assert out["probes"]["accepted"] >= 2 and out["probes"]["reported"] >= 2
    assert out["probes"]["audits"] >= 1 and len(tel.audits) >= 1
    assert all(a["cosines"] for a in tel.audits)
    assert all(not it.is_probe for it in rec.consumed)
    assert all(it.max_tokens == 12 for it in rec.probes)
    assert all(it.max_tokens == it.window for it in rec.consumed)
    assert len(tel.steps) == cfg.steps
    # each row carries the probes' fate so far as the controller counts it; no training request is generated for
    # no update
    last = out["logged"][-1]
    assert last["probe/audited"] == tel.probes["audited"] >= 2 and last["probe/expired"] >= 0
    training = [e for e in rec.events if e.kind == "submit" and not e.detail["probe"]]
    assert len(training) == B * cfg.steps == len(rec.consumed)

    # metrics: padded learner shapes never change, staleness and overlap are recorded
    assert out["learner_shapes"] == [(B, 8 + 12)]
    assert sum(out["staleness"]["histogram"].values()) == B * cfg.steps
    assert min(out["staleness"]["histogram"]) >= 0 and out["staleness"]["max"] >= 1  # the held request
    assert out["breakpoint_samples"] >= 1
    assert out["throughput_tokens_per_s"] is not None and out["throughput_tokens_per_s"] > 0
    assert 0 < out["overlap"]["pipeline/overlap"] <= 3.0
    # the run shell's folder: the last checkpoint is the exported student (summary.json is the command's)
    assert out["student_dir"] == str(tmp_path / "runs" / "aopd" / f"checkpoint-{cfg.steps}")
    assert (tmp_path / "runs" / "aopd" / f"checkpoint-{cfg.steps}" / "config.json").is_file()


def test_learner_loss_is_reverse_kl_mc_with_unclipped_is_and_fixed_width(tmp_path: Path) -> None:
    """The learner's loss equals opd_loss('reverse_kl_mc') on the cached actions, padded to the horizon."""
    parts = tiny_parts()
    eng = HFRolloutEngine(make_tiny_llama(seed=3), eos={2}, pad_id=0, mc_samples=4, seed=0)
    items = [StreamItem(f"r{i}", i, "p", [1, 5 + i, 7], "default", 4, 4, False, 0) for i in range(2)]
    for _ in range(4):
        for it, o in zip(items, eng.step(items), strict=True):
            it.append(o, 0)
    HFTeacherScorer(parts.teachers, 0).score(items)
    assert all(len(it.mc_actions[0]) == 4 and len(it.teacher_mc_logprobs[0]) == 4 for it in items)
    student = parts.student
    opt = torch.optim.SGD(student.parameters(), lr=0.0)
    learner = HFLearner(student, opt, None, tiny_cfg(tmp_path), pad_id=0, width=16)
    m = learner.update(items, 0)
    assert learner.shapes == [(2, 16)]
    # reference: the behavior policy (seed 3) differs from the student, so rho != 1 matters
    ids = torch.zeros((2, 16), dtype=torch.long)
    resp = torch.zeros((2, 16), dtype=torch.long)
    acts = torch.full((2, 16, 4), -1, dtype=torch.long)
    beh, tea = torch.zeros((2, 16, 4)), torch.zeros((2, 16, 4))
    for b, it in enumerate(items):
        ids[b, :7] = torch.tensor(it.prompt_ids + it.tokens)
        resp[b, 3:7] = 1
        acts[b, 3:7] = torch.tensor(it.mc_actions)
        beh[b, 3:7] = torch.tensor(it.mc_logprobs)
        tea[b, 3:7] = torch.tensor(it.teacher_mc_logprobs)
    with torch.no_grad():
        logits = student(input_ids=ids, attention_mask=(torch.arange(16) < 7).long().expand(2, 16)).logits
        ref, _ = opd_loss("reverse_kl_mc", input_ids=ids, response_mask=resp, student_logits=logits,
                          teacher_logprobs=tea, behavior_logprobs=beh, action_ids=acts)
    assert m["loss/total"] == pytest.approx(float(ref), rel=1e-5)
    assert m["loss/is_ratio_p50"] != pytest.approx(1.0, abs=1e-3)


def test_a_padded_teacher_scores_and_trains_the_learner_as_the_unpadded_one(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen2.5-7B teaching 1.5B through the teacher stage: a teacher with 32 large padding rows past the student's
    64 columns gives the unpadded teacher's realized and MC-action logprobs, and the same update; the stage never
    normalises more than one chunk of positions at once (here one position of the two rows)."""
    monkeypatch.setattr(scoring, "CHUNK_ELEMENTS", 2 * 64)
    teacher = make_tiny_llama(seed=10)
    eng = HFRolloutEngine(make_tiny_llama(seed=3), eos={2}, pad_id=0, mc_samples=4, seed=0)
    items = [StreamItem(f"r{i}", i, "p", [1, 5 + i, 7], "default", 4, 4, False, 0) for i in range(2)]
    for _ in range(4):
        for it, o in zip(items, eng.step(items), strict=True):
            it.append(o, 0)
    runs = []
    for teachers in (Teachers({"default": teacher}), Teachers({"default": padded_copy(teacher, 96)}, vocab=64)):
        scored = copy.deepcopy(items)
        with softmax_widths() as seen:
            HFTeacherScorer(teachers, 0).score(scored)
        assert max(seen.sizes) == 2 * 64
        student = make_tiny_llama(seed=0)
        learner = HFLearner(student, torch.optim.SGD(student.parameters(), lr=0.1), None, tiny_cfg(tmp_path),
                            pad_id=0, width=16)
        runs.append((scored, learner.update(scored, 0)["loss/total"], student.lm_head.weight.detach().clone()))
    (narrow, loss, weight), (wide, wide_loss, wide_weight) = runs
    for a, b in zip(narrow, wide, strict=True):
        assert b.teacher_logprobs == pytest.approx(a.teacher_logprobs, abs=1e-5)
        assert torch.allclose(torch.tensor(b.teacher_mc_logprobs), torch.tensor(a.teacher_mc_logprobs), atol=1e-5)
    assert wide_loss == pytest.approx(loss, rel=1e-5)
    assert torch.allclose(wide_weight, weight, atol=1e-5)  # one SGD step: the update is linear in the gradient


def test_learner_pg_variant_uses_realized_tokens_without_mc_cache(tmp_path: Path) -> None:
    parts = tiny_parts()
    eng = HFRolloutEngine(make_tiny_llama(seed=3), eos={2}, pad_id=0, mc_samples=0, seed=1)
    items = [StreamItem(f"r{i}", i, "p", [1, 9 + i], "default", 3, 3, False, 0) for i in range(2)]
    for _ in range(3):
        for it, o in zip(items, eng.step(items), strict=True):
            it.append(o, 0)
    assert all(not it.mc_actions for it in items)
    HFTeacherScorer(parts.teachers, 0).score(items)
    learner = HFLearner(parts.student, torch.optim.SGD(parts.student.parameters(), lr=0.0), None,
                        tiny_cfg(tmp_path, **{"loss.name": "reverse_kl_pg"}), pad_id=0, width=None)
    m = learner.update(items, 0)
    ids = torch.tensor([it.prompt_ids + it.tokens for it in items])  # (2, 5)
    resp = torch.tensor([[0, 0, 1, 1, 1]] * 2)
    pad = torch.nn.functional.pad
    beh = pad(torch.tensor([it.logprobs for it in items]), (2, 0))
    tea = pad(torch.tensor([it.teacher_logprobs for it in items]), (2, 0))
    with torch.no_grad():
        ref, _ = opd_loss("reverse_kl_pg", input_ids=ids, response_mask=resp,
                          student_logits=parts.student(input_ids=ids).logits, teacher_logprobs=tea,
                          behavior_logprobs=beh)
    assert m["loss/total"] == pytest.approx(float(ref), rel=1e-5)


def test_run_refuses_losses_without_an_importance_corrected_estimator(tmp_path: Path) -> None:
    cfg = tiny_cfg(tmp_path, **{"loss.name": "forward_kl", "scheduler": "sync"})  # the config alone would refuse it
    with pytest.raises(ValueError, match="asyncopd"):
        build_asyncopd(cfg, Controller(), parts=tiny_parts())


def test_a_non_finite_update_is_skipped_and_training_continues(tmp_path: Path) -> None:
    """The learner shares the synchronous trainer's guard: an update whose loss is NaN leaves the weights alone."""
    cfg = tiny_cfg(tmp_path, steps=4, **{"optim.max_bad_steps": 2})
    parts = tiny_parts()
    opts = AsyncOPDSection(queue_depth=1, worker_batch=8, teacher_batch=8, wait_timeout_s=60, throughput_warmup=1)
    built = build_asyncopd(cfg, Controller(), parts=parts, options=opts)
    real_update, calls = built.learner.update, []

    def update(items: list[StreamItem], version: int) -> dict[str, float]:
        calls.append(version)
        if len(calls) == 2:  # poisons the second update's teacher signal only
            for it in items:
                it.teacher_mc_logprobs = [[float("nan")] * len(a) for a in it.teacher_mc_logprobs]
        return real_update(items, version)

    built.learner.update = update  # type: ignore[method-assign]
    snaps: list[list[torch.Tensor]] = []
    out = run_asyncopd(cfg, Controller(), built=built,
                       on_step=lambda t, m: snaps.append([p.detach().clone() for p in parts.student.parameters()]))
    rows = out["logged"]
    assert [r["optim/skipped"] for r in rows] == [0.0, 1.0, 0.0, 0.0]
    assert not math.isfinite(rows[1]["loss/total"])
    assert all(torch.equal(a, b) for a, b in zip(snaps[0], snaps[1], strict=True)), "the NaN update left the weights"
    assert not all(torch.equal(a, b) for a, b in zip(snaps[1], snaps[2], strict=True)), "training resumes after it"
    assert all(torch.isfinite(p).all() for p in parts.student.parameters())
    assert rows[-1]["optim/skipped_steps"] == 1.0 and rows[-1]["optim/consecutive_skipped"] == 0.0
