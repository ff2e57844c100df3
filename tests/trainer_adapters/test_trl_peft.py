"""AdwinCallback on TRL's ``DistillationTrainer`` with a PEFT student (``peft_config``, as TRL's docs train LoRA
adapters): it trains, the audits differentiate the adapters only, and the audit's decision moves the window."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trl_fixtures import make_trainer
from trl_fixtures import rows as _rows

from adwin.audit import alignment
from adwin.controller import Controller
from adwin.student.lora import trainable_named_parameters
from adwin.student.structure import is_lora

trl = pytest.importorskip("trl")
peft = pytest.importorskip("peft")

from adwin.trainer_adapters.trl import AdwinCallback  # noqa: E402


def test_a_peft_student_trains_its_adapters_is_audited_on_them_and_the_window_moves(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    audited: list[list[str]] = []
    real = alignment.audited_parameters

    def spy(model: torch.nn.Module, spec: str = "all"):
        named = real(model, spec)
        audited.append([n for n, _ in named])
        return named

    monkeypatch.setattr(alignment, "audited_parameters", spy)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM")
    trainer = make_trainer(tmp_path, steps=3, peft_config=lora, learning_rate=1e-2)
    student = trainer.accelerator.unwrap_model(trainer.model)
    assert is_lora(student)  # TRL wrapped it; the callback finds the PEFT model the same way
    base = {n.removeprefix("base_model.model.").replace(".base_layer.", "."): p.detach().clone()
            for n, p in student.named_parameters() if "lora_" not in n}
    adapters = {n: p.detach().clone() for n, p in trainable_named_parameters(student)}
    cb = AdwinCallback(Controller(), "peft", candidates=[4, 8], threshold=0.3, probe_count=4).attach(trainer)
    n_adapters = sum(p.numel() for p in adapters.values())
    assert cb.client.probe_client.budget.flops.n_trainable == n_adapters  # the budget counts the cheaper backward
    trainer.train()

    assert audited and all(names == list(adapters) for names in audited)  # 2 layers x 3 targets x (A, B)
    assert len(adapters) == 12
    first = cb.decisions[0]
    assert first.decision is not None and first.decision.reason == "audit"
    cos = first.cosines or {}
    assert first.decision.window == min((c for c in (4, 8) if cos[c] >= 0.3), default=16) != 8
    rows = _rows(trainer)
    decided_at = next(i for i, r in enumerate(rows) if "window/next" in r)
    assert cb.windows[decided_at + 1] == first.decision.window
    after = dict(student.named_parameters())
    for name, p in after.items():
        if "lora_" not in name:
            key = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            assert torch.equal(p.detach(), base[key]), name
    assert any(not torch.equal(after[n].detach(), v) for n, v in adapters.items() if ".lora_B." in n)
    assert not is_lora(trainer.accelerator.unwrap_model(trainer.teacher_model))
