"""AdwinCallback on a real TRL ``DistillationTrainer``: tiny Llama student/teacher, code-built tokenizer, CPU."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from trl_fixtures import make_trainer as _trainer
from trl_fixtures import rows as _rows

from adwin.config import AuditConfig
from adwin.controller import Controller
from adwin.controller.schemas import PolicyIn, RunIn

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from adwin.trainer_adapters.trl import AdwinCallback  # noqa: E402

MAX_LEN = 16

class _GradSpy:
    """Runs after AdwinCallback (added later): records every parameter's .grad state at on_step_end."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.none_at_step_end: list[bool] = []

    def __getattr__(self, name: str):  # every other TrainerCallback event is a no-op
        return lambda *a, **k: None

    def on_step_end(self, *a, **k) -> None:
        self.none_at_step_end.append(all(p.grad is None for p in self.model.parameters()))


def test_linear_policy_sets_completion_lengths_and_logs_window_metrics(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, steps=4)
    ctrl = Controller()
    policy = PolicyIn(name="linear", start=2, step=3, max_len=MAX_LEN, candidates=[4, 8])
    cb = AdwinCallback(ctrl, RunIn(run_id="lin", policy=policy, probe_batch_size=4), probe_count=4).attach(trainer)
    trainer.train()
    rows = _rows(trainer)
    assert cb.windows == {0: 2, 1: 5, 2: 8, 3: 11}
    assert [r["window/size"] for r in rows] == [2.0, 5.0, 8.0, 11.0]
    # The cap really reached generate(): no completion is longer than the window, and the
    # longest one of each step (a random tiny model rarely emits EOS) is exactly the window.
    assert [r["completions/max_length"] for r in rows] == [2.0, 5.0, 8.0, 11.0]
    assert rows[0]["probe/accepted"] >= 1 and "probe/tokens" in rows[0]
    # Audits ran (schedule policy: cosines recorded, window unchanged) and were logged.
    tel = ctrl.telemetry("lin")
    audited = [d for d in tel.decisions if d["audit_id"] is not None]
    assert audited and all(d["reason"] == "schedule" for d in audited)
    assert any("window/cos@4" in r for r in rows)
    # on_log -> report_step, keyed by the step that used the window (cb.windows' keys), not global_step after it
    assert [s["step"] for s in tel.steps] == sorted(cb.windows) == [0, 1, 2, 3]


def test_fixed_policy_caps_every_rollout(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, steps=2)
    policy = PolicyIn(name="fixed", window=3, max_len=MAX_LEN)
    AdwinCallback(Controller(), RunIn(run_id="fix", policy=policy), probe_count=0).attach(trainer)
    trainer.train()
    for part in trainer._buffered_inputs:
        assert int(part["completion_mask"].sum(dim=1).max()) <= 3
    assert [r["completions/max_length"] for r in _rows(trainer)] == [3.0, 3.0]


def test_adwin_audit_decision_is_applied_to_the_next_rollouts(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, steps=3)
    ctrl = Controller()
    cb = AdwinCallback(ctrl, "ad", candidates=[4, 8], threshold=0.3, probe_count=4).attach(trainer)
    spy = _GradSpy(trainer.model)
    trainer.add_callback(spy)
    trainer.train()
    assert cb.windows[0] == 8  # adwin starts at its largest candidate
    first = cb.decisions[0]
    assert first.state == "decided" and first.decision is not None and first.decision.reason == "audit"
    cos = first.cosines or {}
    expected = min((c for c in (4, 8) if cos[c] >= 0.3), default=MAX_LEN)
    assert first.decision.window == expected
    rows = _rows(trainer)
    decided_at = next(i for i, r in enumerate(rows) if "window/next" in r)  # on_step_end of this step
    assert decided_at + 1 < len(rows), "the first audit came too late to be applied within the run"
    assert cb.windows[decided_at + 1] == expected and rows[decided_at + 1]["window/size"] == float(expected)
    assert rows[decided_at + 1]["completions/max_length"] <= expected
    assert expected != 8, "the test wants a decision that changes the window"
    # The audit ran after zero_grad and created no .grad.
    assert spy.none_at_step_end and all(spy.none_at_step_end)


def test_probe_cycle_leaves_grads_and_optimizer_state_untouched(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, steps=1)
    # every ready batch audited (no budget): the probe cycle below must reach an audit
    cb = AdwinCallback(Controller(), "grads", candidates=[4, 8], probe_count=4,
                       audit=AuditConfig(budget=None)).attach(trainer)
    trainer.train()
    model = trainer.model
    torch.manual_seed(0)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    grads = [p.grad.clone() for p in model.parameters()]
    params = [p.detach().clone() for p in model.parameters()]
    state = {k: v.clone() for st in trainer.optimizer.state.values() for k, v in st.items() if torch.is_tensor(v)}
    decision = cb.probe_cycle(trainer.state.global_step)  # re-offers the buffered rollouts as a new step
    assert decision is not None, "a probe batch was expected to be ready"
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
    assert all(torch.equal(p.detach(), q) for p, q in zip(model.parameters(), params, strict=True))
    after = {k: v for st in trainer.optimizer.state.values() for k, v in st.items() if torch.is_tensor(v)}
    assert all(torch.equal(after[k], v) for k, v in state.items())
    assert model.training  # the audit restores the mode


def test_window_attributes_are_the_ones_trl_reads_at_generation_time() -> None:
    """Drift guard: the attributes ``apply_window`` sets are the ones trl 1.16 reads when generating."""
    from trl.generation.vllm_generation import VLLMGeneration
    from trl.trainer.distillation_trainer import DistillationTrainer

    single = inspect.getsource(DistillationTrainer._generate_single_turn)
    assert "generation_config=self.generation_config" in single
    assert "generation_kwargs=self.generation_kwargs" in single
    assert "max_completion_length = self.max_completion_length" in inspect.getsource(VLLMGeneration.generate)
    assert "self.max_completion_length" in inspect.getsource(DistillationTrainer._tool_call_loop)


def test_apply_window_sets_the_vllm_cap_when_vllm_is_used() -> None:
    from types import SimpleNamespace

    from transformers import GenerationConfig

    fake = SimpleNamespace(
        max_completion_length=16, generation_config=GenerationConfig(max_new_tokens=16),
        generation_kwargs={"max_new_tokens": 16}, use_vllm=True,
        vllm_generation=SimpleNamespace(max_completion_length=16),
    )
    cb = AdwinCallback(Controller(), "v", candidates=[4])
    cb.trainer = fake
    cb.apply_window(5)
    assert (fake.max_completion_length, fake.generation_config.max_new_tokens) == (5, 5)
    assert fake.generation_kwargs["max_new_tokens"] == 5 and fake.vllm_generation.max_completion_length == 5


def test_the_callback_counts_and_gates_decisions_with_the_default_budget_and_audits_every_batch_without_one(
        tmp_path: Path) -> None:
    default = AdwinCallback(Controller(), "budgeted", candidates=[4, 8], probe_count=4).attach(
        _trainer(tmp_path / "a", steps=1))
    assert default.client.probe_client.budget.budget == AuditConfig().budget  # the documented default
    off = AdwinCallback(Controller(), "every", candidates=[4, 8], probe_count=4,
                        audit=AuditConfig(budget=None)).attach(_trainer(tmp_path / "b", steps=1))
    assert not off.client.probe_client.budget.enabled
