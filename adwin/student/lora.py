"""LoRA students through peft (``model.lora``), and the one definition of which parameters train.

``apply_lora`` wraps a loaded student with ``peft.get_peft_model``: the base weights are frozen and only the
adapters' ``lora_A`` / ``lora_B`` matrices require gradients. Everything that walks "the student's parameters"
for training (the optimizer, gradient clipping, the data-parallel gradient sum, the audit's parameter set, the
probe workers' weight sync, the FLOPs accounting) asks ``trainable_parameters`` / ``trained_state`` instead,
so a full fine-tuning student and a LoRA student go through the same code (docs/decisions.md, "LoRA students").

peft is an optional extra (``adwin[lora]``), imported only when a LoRA student is built or loaded: a missing
install is a ``LoraUnavailable`` naming ``model.lora``. Checkpoints of a LoRA student hold the adapter only
(``PeftModel.save_pretrained``: ``adapter_model.safetensors`` + ``adapter_config.json``); the checkpoint code
reads one back in place and refuses a folder of the other kind (``adwin.runtime.checkpoint.load_weights``);
``export_lora`` writes the adapter and the merged student (peft's ``merge_and_unload``, a plain transformers
folder) at the end of a run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from adwin.backends import BackendUnavailable

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"  # what PeftModel.save_pretrained writes next to the adapter weights
ADAPTER_WEIGHTS = "adapter_model.safetensors"
INSTALL_HINT = "pip install 'adwin[lora]'"
LORA_EXPORT = "export"  # the run folder's export of a LoRA student: adapter/ and merged/
MERGED_DIR = "merged"


class LoraUnavailable(BackendUnavailable):
    """``model.lora`` is set but peft is not installed."""


class LoraTargetError(ValueError):
    """A ``model.lora.target_modules`` entry matches no module of the student."""


class LoraSpec(Protocol):
    """What ``apply_lora`` reads (``adwin.config.sections.LoraSection`` has these fields)."""

    r: int
    alpha: float
    dropout: float
    target_modules: list[str] | str


def require_peft() -> Any:
    """Import peft or raise ``LoraUnavailable`` naming ``model.lora``."""
    try:
        import peft
    except ImportError as e:
        raise LoraUnavailable(f"model.lora: LoRA students need peft, which is not installed ({e}): {INSTALL_HINT}, "
                              "or drop model.lora to fine-tune every parameter") from e
    return peft


def trainable_named_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """``(name, parameter)`` of every parameter the optimizer updates, in model order: all of a fully
    fine-tuned student, the adapters of a LoRA one (peft freezes the base by ``requires_grad``)."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for _, p in trainable_named_parameters(model)]


def trained_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The part of ``model.state_dict()`` that training changes (keys as in the state dict, tensors not copied).

    Every entry when all parameters train (buffers included: a replica must equal the trainer's module);
    only the trainable parameters when some are frozen, since the frozen base never changes after a replica
    was copied from the trainer's module (a LoRA student: a few MB of adapters instead of the whole model)."""
    named = trainable_named_parameters(model)
    if len(named) == sum(1 for _ in model.parameters()):
        return dict(model.state_dict())
    ids = {id(p) for _, p in named}
    return {k: v for k, v in model.state_dict(keep_vars=True).items() if id(v) in ids}


def load_trained_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load what ``trained_state`` took from a module of the same layout (a replica of it) into ``model``."""
    missing, unexpected = model.load_state_dict(dict(state), strict=False)
    lost = set(missing) & {n for n, _ in trainable_named_parameters(model)}
    if unexpected or lost:
        raise ValueError(f"weights do not match the replica (trainable tensors missing {sorted(lost)[:3]}, "
                         f"unexpected {sorted(unexpected)[:3]})")


def unmatched_targets(model: torch.nn.Module, targets: Sequence[str]) -> list[str]:
    """The entries of ``targets`` that match no module name of ``model`` by peft's rule (the name itself or a
    ``.``-separated suffix of it)."""
    peft = require_peft()
    from peft.tuners.tuners_utils import check_target_module_exists

    names = [n for n, _ in model.named_modules() if n]
    return [t for t in targets
            if not any(check_target_module_exists(peft.LoraConfig(target_modules=[t]), n) for n in names)]


def apply_lora(model: torch.nn.Module, spec: LoraSpec, seed: int = 0) -> torch.nn.Module:
    """``model`` wrapped with LoRA adapters of ``spec`` (``peft.get_peft_model``, ``task_type`` causal LM).

    ``lora_A`` is drawn from its own RNG seeded by ``seed`` (the run seed): every data-parallel rank builds the
    same adapters, and the run's own random streams are those of a full fine-tuning run.

    Targets are checked first (``get_peft_model`` rewrites ``model`` in place): an entry that matches no
    module raises ``LoraTargetError`` naming ``model.lora.target_modules`` and the student's linear layers.
    The wrapper keeps the base model's train/eval mode (the trainer computes in eval mode; LoRA dropout is
    switched on in the training forward only, ``lora_dropout_modules``). peft initialises ``lora_B`` to zero,
    so the wrapped student computes exactly what ``model`` computed.
    """
    peft = require_peft()
    targets = spec.target_modules
    if not isinstance(targets, str):
        missing = unmatched_targets(model, targets)
        if missing:
            linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                             if type(m).__name__ in ("Linear", "Conv1D")})  # Conv1D: GPT-2's projections
            raise LoraTargetError(f"model.lora.target_modules: {missing} match no module of the student "
                                  f"({type(model).__name__}); its linear layers are named {linear} "
                                  "(model.lora.target_modules: all-linear takes every one but the output head)")
    config = peft.LoraConfig(task_type="CAUSAL_LM", r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                             target_modules=targets if isinstance(targets, str) else list(targets))
    training = model.training
    device = next(model.parameters()).device
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            wrapped = peft.get_peft_model(model, config)
    except ValueError as e:  # e.g. a target of a layer type LoRA does not support
        raise LoraTargetError(f"model.lora.target_modules: {e}") from e
    wrapped.train(training)
    n_train = sum(p.numel() for p in trainable_parameters(wrapped))
    log.info("model.lora: r=%d alpha=%g on %s: %d trainable parameters of %d", spec.r, spec.alpha, targets, n_train,
             sum(p.numel() for p in wrapped.parameters()))
    return wrapped


def lora_dropout_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The dropout layers peft puts on the adapters' input (``lora_dropout``; identities when dropout is 0)."""
    return [m for n, m in model.named_modules() if ".lora_dropout." in f".{n}." and isinstance(m, torch.nn.Dropout)]


def base_checkpoint(model: torch.nn.Module) -> str | None:
    """The folder the LoRA ``model``'s base weights were loaded from (None: a student built in memory)."""
    return model.peft_config["default"].base_model_name_or_path or None  # type: ignore[index]


def export_lora(model: torch.nn.Module, tokenizer: Any, dest: str | Path,
                state: Mapping[str, torch.Tensor] | None = None) -> tuple[Path, Path]:
    """Write ``dest/adapter`` (the adapter folder) and ``dest/merged`` (the merged student: a plain transformers
    folder that loads with ``AutoModelForCausalLM.from_pretrained``), each with the tokenizer.

    ``state``: the student's state dict gathered whole, for a sharded student whose module holds shards
    (``adwin.runtime.sharded_checkpoint.export_student``): its adapters, plus the base weights when there is no
    base checkpoint. The merge (peft's ``merge_and_unload``) runs on a CPU copy rebuilt from the base checkpoint
    and the saved adapter (``AutoPeftModelForCausalLM``), so the trainer's module and its device memory stay as
    they are; a student built in memory (no base checkpoint to reload) is copied instead, or rebuilt from its
    config and ``state``."""
    peft = require_peft()
    dest = Path(dest)
    adapter, merged = dest / "adapter", dest / MERGED_DIR
    model.save_pretrained(adapter, state_dict=None if state is None else dict(state))  # type: ignore[operator]
    if base_checkpoint(model):
        dtype = next(model.get_base_model().parameters()).dtype  # type: ignore[operator]
        rebuilt = peft.AutoPeftModelForCausalLM.from_pretrained(str(adapter), dtype=dtype, device_map="cpu")
    else:
        rebuilt = _in_memory_copy(model, state)
    rebuilt.merge_and_unload().save_pretrained(merged)
    for folder in (adapter, merged):
        if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(folder)
    log.info("exported the LoRA adapter to %s and the merged student to %s", adapter, merged)
    return adapter, merged


def _in_memory_copy(model: torch.nn.Module, state: Mapping[str, torch.Tensor] | None) -> torch.nn.Module:
    """A CPU copy of the LoRA ``model``: the module copied, or (``state`` given: its module holds shards) a new
    one built from its config and peft config, loaded with ``state``."""
    import copy

    if state is None:
        return copy.deepcopy(model).to("cpu")
    from transformers import AutoModelForCausalLM

    peft = require_peft()
    base = model.get_base_model()  # type: ignore[operator]
    with torch.random.fork_rng(devices=[]):  # the fresh weights are overwritten: they must not move the run's RNG
        rebuilt = peft.get_peft_model(AutoModelForCausalLM.from_config(base.config, dtype=base.dtype),
                                      copy.deepcopy(model.peft_config["default"]))  # type: ignore[index]
    rebuilt.load_state_dict(dict(state))
    return rebuilt
