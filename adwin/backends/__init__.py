"""Optional inference engines behind extras (``adwin[vllm]``), imported lazily.

The CPU install never imports vLLM. ``check_backends(cfg)`` runs before any model loads and turns a
config asking for a device or an engine this machine cannot run into one clear error naming the field.

- the student's rollout on vLLM is the decode engine's other implementation (``adwin.decode.vllm``: per-request
  ``SamplingParams.max_tokens``, behavior logprobs, weight sync after each optimizer step); the synchronous
  trainer's engine (``adwin.decode.engine``) and the AsyncOPD ``StreamingEngine``
  (``adwin.trainer_adapters.asyncopd.vllm``) sit on top of it, and the teacher's vLLM scorer (``adwin.teacher.vllm``)
  shares its engine arguments; each asks here for vLLM.
- ``logprob_gap``: the train-rollout logprob gap diagnostic (pure torch).

Status: the vLLM code paths are untested on hardware (no GPU was available while writing them); the
parsing and tensor layout code is unit-tested on CPU with stand-in engine outputs, and the synchronous
trainer runs end to end on CPU with a stand-in ``vllm.LLM`` that samples with a transformers model
(tests/adwin/decode/test_vllm_sync_trainer.py).
"""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

INSTALL_HINT = "pip install 'adwin[vllm]' (needs a CUDA GPU)"


class BackendUnavailable(RuntimeError):
    """The config asks for an engine this install or machine cannot run."""


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def require_vllm(field: str = "rollout.backend") -> ModuleType:
    """Import vLLM or raise ``BackendUnavailable`` naming the config field that asked for it."""
    if not vllm_available():
        raise BackendUnavailable(f"{field}: 'vllm' needs vLLM, which is not installed: {INSTALL_HINT}, "
                                 f"or set {field}=hf")
    require_cuda(field)
    import vllm

    return vllm


def require_cuda(field: str) -> None:
    """vLLM runs on a CUDA GPU only: raise ``BackendUnavailable`` naming ``field`` when none is visible."""
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable(f"{field}: 'vllm' needs a CUDA GPU and none is visible; set {field}=hf to run "
                                 "with transformers")


def require_device(device: str, field: str = "model.device") -> None:
    """Raise ``BackendUnavailable`` naming ``field`` when ``device`` is not one torch can use here (a CUDA device
    without a visible GPU, or past the last one). Creates no CUDA context."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise BackendUnavailable(f"{field}: {device!r} is not a torch device ({e})") from e
    if dev.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise BackendUnavailable(f"{field}: {device!r} needs a CUDA GPU and none is visible; set {field}=cpu "
                                 "(with model.dtype=float32 on a CPU)")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise BackendUnavailable(f"{field}: {device!r}, but {torch.cuda.device_count()} CUDA device(s) are visible")


def check_backends(cfg: Any) -> None:
    """Fail before compute when ``cfg`` asks for a device or an engine that cannot run here: ``model.device``,
    ``rollout.backend`` (the student's sampler, both schedulers) and ``model.teacher_backend`` (teacher scoring)."""
    require_device(cfg.model.device)
    for field, value in (("rollout.backend", cfg.rollout.backend),
                         ("model.teacher_backend", getattr(cfg.model, "teacher_backend", "hf"))):
        if value == "vllm":
            require_vllm(field)
