"""Optional inference engines behind extras (``adwin[vllm]``), imported lazily.

The CPU install never imports vLLM. ``check_backends(cfg)`` runs before any model loads and turns a
config asking for an engine this machine cannot run into one clear error naming the field.

- ``vllm_rollout``: student rollout with ``SamplingParams.max_tokens = W``, behavior logprobs, weight
  sync into the engine after each optimizer step, and the AsyncOPD ``RolloutEngine`` on top of it.
- ``vllm_teacher``: teacher scoring with ``prompt_logprobs`` (top-k) for ``forward_kl_topk``, or the
  realized tokens' logprobs for the sampled reverse-KL estimators.
- ``logprob_gap``: the train-rollout logprob gap diagnostic (pure torch).

Status: the vLLM code paths are untested on hardware (no GPU was available while writing them); the
parsing and tensor layout code is unit-tested on CPU with stand-in engine outputs.
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
    import vllm

    return vllm


def check_backends(cfg: Any) -> None:
    """Fail before compute when ``cfg`` asks for an engine that cannot run here."""
    if cfg.rollout.backend != "vllm":
        return
    if not vllm_available():
        raise BackendUnavailable(f"rollout.backend: 'vllm' needs vLLM, which is not installed: {INSTALL_HINT}, "
                                 "or set rollout.backend=hf")
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable("rollout.backend: 'vllm' needs a CUDA GPU and none is visible; "
                                 "set rollout.backend=hf to sample with transformers")
    if getattr(cfg, "scheduler", "sync") != "asyncopd":
        raise BackendUnavailable("rollout.backend: 'vllm' is wired into --scheduler asyncopd only; the sync "
                                 "trainer samples with transformers (rollout.backend=hf)")
