"""``rollout.backend: vllm`` in the synchronous trainer, on CPU, with a stand-in ``vllm.LLM`` (fake_vllm.py)
behind the real ``VLLMRollout`` / ``VLLMEngine`` code: what stands in for the GPU runs that were not made.

Checked: every request's ``max_tokens`` is the step's window (rollouts), the probe's remaining budget
(inline probe extension) or the horizon (evaluation); the engine receives the weights after every
optimizer step (versions 1..T in order, after one sync before first use) and holds exactly the trainer's
weights at every call; probes and evaluations go through the engine; the refusals name their fields.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fake_vllm import HFBackedLLM, PromptLogprobLLM, params
from trainer_fixtures import tiny_overrides

from adwin.backends import BackendUnavailable
from adwin.config import load_config
from adwin.controller import Controller
from adwin.decode.engine import VLLMEngine
from adwin.decode.vllm import VLLMRollout
from adwin.loop.parts import load_parts
from adwin.loop.probe_rounds import RoundExtender
from adwin.loop.sampler import Sampler
from adwin.loop.trainer import train
from adwin.teacher.checkpoints import load_model
from adwin.teacher.local import Teachers
from adwin.teacher.vllm import EngineTeachers, VLLMTeacher


def _vllm_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **extra: object):
    ov = tiny_overrides(tmp_path, **{"rollout.backend": "vllm", "probes.backend": "inline", "steps": 3,
                                     "name": "vl", **extra})
    cfg = load_config(None, ov)
    parts = load_parts(cfg)
    fake = HFBackedLLM(parts.student)
    engines: list[VLLMEngine] = []
    loaded: dict[str, object] = {}

    def load(path: str, **kw: object) -> VLLMRollout:
        loaded.update(kw, path=path)
        return VLLMRollout(fake, sampling_params=params)

    monkeypatch.setattr(VLLMRollout, "load", staticmethod(load))
    real_open = VLLMEngine.load.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(VLLMEngine, "load", classmethod(lambda cls, *a, **k: engines.append(real_open(cls, *a, **k))
                                                        or engines[-1]))
    step_rollouts, evaluation_rows = Sampler.step_rollouts, Sampler.evaluation_rows
    extend = RoundExtender.__call__
    calls: list[tuple[str, object]] = []  # (kind, window or the positive budgets), one per Sampler call

    def spy_rollouts(self, prompts, rows, window, step):  # type: ignore[no-untyped-def]
        calls.append(("rollout", window))
        fake.phase = len(calls) - 1
        return step_rollouts(self, prompts, rows, window, step)

    def spy_evaluation(self, problems, first):  # type: ignore[no-untyped-def]
        calls.append(("eval", cfg.rollout.max_response_len))
        fake.phase = len(calls) - 1
        return evaluation_rows(self, problems, first)

    def spy_extend(self, contexts, budgets):  # type: ignore[no-untyped-def]
        calls.append(("probe", [b for b in budgets if b > 0]))
        fake.phase = len(calls) - 1
        return extend(self, contexts, budgets)

    monkeypatch.setattr(Sampler, "step_rollouts", spy_rollouts)
    monkeypatch.setattr(Sampler, "evaluation_rows", spy_evaluation)
    monkeypatch.setattr(RoundExtender, "__call__", spy_extend)
    res = train(cfg, Controller(), parts)
    return cfg, res, fake, engines, loaded, calls


def test_sync_trainer_samples_everything_through_the_engine_with_per_request_budgets_and_fresh_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, res, fake, engines, loaded, calls = _vllm_run(tmp_path, monkeypatch)
    (engine,) = engines
    assert loaded["path"] == cfg.model.student and loaded["max_model_len"] == cfg.data.max_prompt_len + 16
    assert loaded["gpu_memory_utilization"] == cfg.model.vllm_gpu_memory and loaded["dtype"] == cfg.model.dtype
    assert loaded["logprobs_mode"] == "raw_logprobs"  # temperature-1 behavior logprobs, as transformers records
    # one sync before first use (the engine loaded a checkpoint, the trainer may hold other weights), then
    # one after every optimizer step, in order
    assert engine.syncs == [0, 1, 2, 3]
    n_tensors = len(fake.student.state_dict())
    assert fake.resets == 4 and fake.loads == 4 * n_tensors
    assert all(r.weights_match for r in fake.requests), "every request sampled from the trainer's current weights"
    by_call = [[r for r in fake.requests if r.phase == i] for i in range(len(calls))]
    windows = [int(h["window/current"]) for h in res.history]
    rollouts = [(w, reqs) for (kind, w), reqs in zip(calls, by_call, strict=True) if kind == "rollout"]
    per_step = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    assert [w for w, _ in rollouts] == windows
    assert all(len(reqs) == per_step and {r.max_tokens for r in reqs} == {w} for w, reqs in rollouts)
    evals = [reqs for (kind, _), reqs in zip(calls, by_call, strict=True) if kind == "eval"]
    assert len(evals) == 3  # start, eval.every=2, end
    assert all(r.max_tokens == cfg.rollout.max_response_len for reqs in evals for r in reqs)
    # evaluation draws its per-request seeds from its own re-seeded RNG: every evaluation samples with the
    # same seeds (paired noise, as with the transformers engine)
    assert len({tuple(r.seed for r in reqs) for reqs in evals}) == 1
    probes = [(budgets, reqs) for (kind, budgets), reqs in zip(calls, by_call, strict=True) if kind == "probe"]
    assert probes and any(reqs for _, reqs in probes), "the inline probe backend extends probes on the engine"
    for budgets, reqs in probes:  # each request's max_tokens is its probe's remaining budget
        assert [r.max_tokens for r in reqs] == budgets
        assert all(r.context_len + r.max_tokens <= cfg.data.max_prompt_len + cfg.rollout.max_response_len
                   for r in reqs)
    assert sum(h.get("probe/completed", 0) for h in res.history) > 0
    assert "eval/accuracy" in res.final_eval and (tmp_path / "runs" / "vl" / "checkpoint-3").is_dir()


def test_teacher_scores_from_prompt_logprobs_match_the_transformers_teacher(tmp_path: Path) -> None:
    cfg = load_config(None, tiny_overrides(tmp_path))
    teacher = load_model(cfg.model.teachers["default"])
    hf = Teachers({"default": teacher})
    engine = EngineTeachers({"default": VLLMTeacher(PromptLogprobLLM(teacher), topk=1, sampling_params=params)})
    ids = torch.tensor([[1, 5, 6, 7, 9, 0], [1, 8, 0, 0, 0, 0], [3, 0, 0, 0, 0, 0]])
    attn = (torch.arange(6)[None] < torch.tensor([[5], [2], [1]])).long()
    want = hf.score(ids, attn, ["default"] * 3) * attn
    got = engine.score(ids, attn, ["default"] * 3)
    assert torch.allclose(got, want, atol=1e-5)
    assert not engine.dense
    with pytest.raises(ValueError, match="model.teacher_backend"):
        engine.logits(ids, attn, ["default"] * 3)


def test_sync_run_with_vllm_teacher_scoring_trains_and_leaves_the_drift_diagnostics_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fakes: list[PromptLogprobLLM] = []

    def load(path: str, topk: int = 20, **kw: object) -> VLLMTeacher:
        fakes.append(PromptLogprobLLM(load_model(path)))
        return VLLMTeacher(fakes[-1], topk, sampling_params=params)

    monkeypatch.setattr(VLLMTeacher, "load", staticmethod(load))
    cfg = load_config(None, tiny_overrides(tmp_path, **{"model.teacher_backend": "vllm", "steps": 2,
                                                          "probes.backend": "inline", "name": "vt"}))
    res = train(cfg, Controller())
    assert len(fakes) == 1 and fakes[0].calls > 0
    assert all(torch.isfinite(torch.tensor(h["loss/teacher_kl"])) for h in res.history)
    assert not any(k.startswith("drift/") for h in res.history for k in h)


@pytest.mark.parametrize(("overrides", "field"), [
    ({"rollout.backend": "vllm", "probes.backend": "thread"}, "probes.backend"),
    ({"rollout.backend": "vllm", "probes.backend": "ray"}, "probes.backend"),
    ({"model.teacher_backend": "vllm", "loss.name": "forward_kl_topk"}, "model.teacher_backend"),
    ({"model.teacher_backend": "vllm", "loss.name": "k3"}, "model.teacher_backend"),
    ({"model.teacher_backend": "vllm", "scheduler": "asyncopd"}, "model.teacher_backend"),
    ({"model.vllm_gpu_memory": 0.5}, "model.vllm_gpu_memory"),
    ({"rollout.backend": "vllm", "probes.backend": "inline", "model.teacher_backend": "vllm",
      "model.teachers": {"a": "/t1", "b": "/t2"}, "model.vllm_gpu_memory": 0.32}, "model.vllm_gpu_memory"),  # 3 engines
])
def test_engine_combinations_that_cannot_apply_are_refused_at_load(overrides: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        load_config(None, overrides)


def test_vllm_rollouts_without_probing_keep_any_probe_backend_and_asyncopd_keeps_its_own() -> None:
    load_config(None, {"rollout.backend": "vllm", "window.policy": "full"})  # no probes: probes.backend unread
    load_config(None, {"rollout.backend": "vllm", "scheduler": "asyncopd"})


def test_the_real_engine_without_vllm_or_cuda_fails_naming_the_field(tmp_path: Path, monkeypatch) -> None:
    import adwin.backends as backends

    cfg = load_config(None, tiny_overrides(tmp_path, **{"rollout.backend": "vllm", "probes.backend": "inline"}))
    parts = load_parts(cfg)
    monkeypatch.setattr(backends, "vllm_available", lambda: False)
    with pytest.raises(BackendUnavailable, match=r"rollout\.backend.*adwin\[vllm\]"):
        Sampler(parts, cfg)
    monkeypatch.setattr(backends, "vllm_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendUnavailable, match=r"rollout\.backend.*CUDA"):
        Sampler(parts, cfg)
