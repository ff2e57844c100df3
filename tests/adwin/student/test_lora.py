"""LoRA students through peft: the wrapped student, its trainable set, target checks, adapter folders, the export."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import make_tiny_llama
from trainer_fixtures import save_tiny

from adwin.config import LoraSection
from adwin.runtime.checkpoint import CheckpointMismatch, load_weights
from adwin.student.lora import (
    LoraTargetError,
    LoraUnavailable,
    apply_lora,
    export_lora,
    load_trained_state,
    lora_dropout_modules,
    trainable_named_parameters,
    trained_state,
)
from adwin.student.structure import is_lora

peft = pytest.importorskip("peft")  # the lora extra

IDS = torch.tensor([[1, 5, 9, 17, 33, 8, 4], [1, 12, 3, 40, 41, 0, 0]])  # (2, 7)
MASK = (IDS != 0).long()


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS, attention_mask=MASK).logits


def _perturb_adapters(model: torch.nn.Module, seed: int = 3) -> None:
    """Adapters as training leaves them: B off zero (peft starts it at zero, so the student is the base)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in trainable_named_parameters(model):
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


def test_only_the_adapters_train_and_the_wrapped_student_starts_as_the_base() -> None:
    base = make_tiny_llama()
    before = _logits(base)
    student = apply_lora(base, LoraSection(r=4))
    assert is_lora(student) and not is_lora(make_tiny_llama())
    names = [n for n, _ in trainable_named_parameters(student)]
    # 2 layers x 7 projections x (A, B)
    assert len(names) == 28 and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert not any(p.requires_grad for n, p in student.named_parameters() if "lora_" not in n)
    assert all(float(p.detach().abs().max()) == 0.0 for n, p in student.named_parameters() if ".lora_B." in n)
    assert torch.equal(_logits(student), before)  # B = 0: the adapters add exactly nothing
    assert not student.training  # the base was in eval mode; the wrapper keeps it (the trainer computes in eval)


def test_adapters_are_drawn_from_the_seed_alone_and_leave_the_global_rng_as_it_was() -> None:
    bases = [make_tiny_llama() for _ in range(3)]
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a, b, c = (apply_lora(m, LoraSection(r=4), seed=s) for m, s in zip(bases, (7, 7, 8), strict=True))
    assert torch.equal(torch.get_rng_state(), state)  # a LoRA run samples what a full run samples

    def first_a(m: torch.nn.Module) -> torch.Tensor:
        return next(p for n, p in m.named_parameters() if ".lora_A." in n)

    assert torch.equal(first_a(a), first_a(b)) and not torch.equal(first_a(a), first_a(c))  # every rank: the same


def test_a_target_that_matches_nothing_fails_naming_the_field_and_the_layers() -> None:
    with pytest.raises(LoraTargetError, match=r"model\.lora\.target_modules: \['c_attn'\].*q_proj"):
        apply_lora(make_tiny_llama(), LoraSection(r=4, target_modules=["q_proj", "c_attn"]))


def test_suffix_targets_and_all_linear_follow_peft_rules() -> None:
    one = apply_lora(make_tiny_llama(), LoraSection(r=2, target_modules=["layers.1.self_attn.q_proj"]))
    assert [n for n, _ in trainable_named_parameters(one)] == [
        "base_model.model.model.layers.1.self_attn.q_proj.lora_A.default.weight",
        "base_model.model.model.layers.1.self_attn.q_proj.lora_B.default.weight"]
    every = apply_lora(make_tiny_llama(), LoraSection(r=2, target_modules="all-linear"))
    assert len(trainable_named_parameters(every)) == 28 and "lm_head" not in str(trainable_named_parameters(every))


def test_missing_peft_is_a_typed_error_naming_model_lora(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft now raises ImportError
    with pytest.raises(LoraUnavailable, match=r"model\.lora: .*adwin\[lora\]"):
        apply_lora(make_tiny_llama(), LoraSection(r=4))


def test_trained_state_is_the_whole_state_or_the_adapters_and_loads_into_a_replica() -> None:
    full = make_tiny_llama()
    assert trained_state(full).keys() == full.state_dict().keys()
    student = apply_lora(make_tiny_llama(), LoraSection(r=4))
    replica = copy.deepcopy(student)
    _perturb_adapters(student)
    state = trained_state(student)
    assert sorted(state) == sorted(n for n, _ in trainable_named_parameters(student))
    assert not torch.equal(_logits(replica), _logits(student))
    load_trained_state(replica, {k: v.clone() for k, v in state.items()})
    assert torch.equal(_logits(replica), _logits(student))
    with pytest.raises(ValueError, match="unexpected"):
        load_trained_state(replica, state | {"not.a.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="trainable tensors missing"):
        load_trained_state(replica, dict(list(state.items())[1:]))


def test_lora_dropout_layers_are_found_only_when_asked_for() -> None:
    assert lora_dropout_modules(apply_lora(make_tiny_llama(), LoraSection(r=2))) == []  # peft: identities
    assert len(lora_dropout_modules(apply_lora(make_tiny_llama(), LoraSection(r=2, dropout=0.1)))) == 14


def _student_from_disk(tmp: Path) -> torch.nn.Module:
    from adwin.teacher.checkpoints import load_model

    return apply_lora(load_model(save_tiny(tmp / "base", seed=0)), LoraSection(r=4, alpha=8))


def test_adapter_checkpoints_hold_the_adapter_only_and_load_back_in_place(tmp_path: Path) -> None:
    student = _student_from_disk(tmp_path)
    _perturb_adapters(student)
    student.save_pretrained(tmp_path / "ck")
    assert (tmp_path / "ck" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "ck" / "model.safetensors").exists()
    fresh = _student_from_disk(tmp_path)
    assert not torch.equal(_logits(fresh), _logits(student))
    load_weights(tmp_path / "ck", fresh, lora=is_lora(fresh))
    assert torch.equal(_logits(fresh), _logits(student))
    with pytest.raises(CheckpointMismatch, match="holds LoRA adapters .* no model.lora"):
        load_weights(tmp_path / "ck", make_tiny_llama(), lora=False)
    with pytest.raises(CheckpointMismatch, match="holds full weights .* sets model.lora"):
        load_weights(tmp_path / "base", fresh, lora=is_lora(fresh))
    other = apply_lora(make_tiny_llama(), LoraSection(r=8))  # another rank: the adapter does not fit
    with pytest.raises(CheckpointMismatch, match="does not match the student's model.lora"):
        load_weights(tmp_path / "ck", other, lora=is_lora(other))


def test_export_writes_the_adapter_and_a_merged_plain_student_equal_to_merge_and_unload(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    student = _student_from_disk(tmp_path)
    _perturb_adapters(student)
    adapter, merged = export_lora(student, None, tmp_path / "export")
    plain = AutoModelForCausalLM.from_pretrained(merged)
    assert not is_lora(plain) and (adapter / "adapter_config.json").is_file()
    reference = copy.deepcopy(student).merge_and_unload()  # what peft's own merge of the trainer's module gives
    for k, v in reference.state_dict().items():
        assert torch.equal(plain.state_dict()[k], v), k
    torch.testing.assert_close(_logits(plain), _logits(student), atol=1e-5, rtol=1e-5)
    # a student built in memory (no base checkpoint to reload) is merged from a copy
    in_memory = apply_lora(make_tiny_llama(), LoraSection(r=4))
    _perturb_adapters(in_memory)
    _, merged2 = export_lora(in_memory, None, tmp_path / "export2")
    torch.testing.assert_close(_logits(AutoModelForCausalLM.from_pretrained(merged2)), _logits(in_memory),
                               atol=1e-5, rtol=1e-5)
    # a sharded student's module holds shards: it is rebuilt from its config and its gathered state instead,
    # without moving the run's RNG
    rng = torch.get_rng_state()
    _, merged3 = export_lora(in_memory, None, tmp_path / "export3", state=in_memory.state_dict())
    assert torch.equal(torch.get_rng_state(), rng)
    torch.testing.assert_close(_logits(AutoModelForCausalLM.from_pretrained(merged3)), _logits(in_memory),
                               atol=1e-5, rtol=1e-5)
