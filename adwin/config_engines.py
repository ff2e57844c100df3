"""Rules for the inference engines a run starts (``rollout.backend``, ``model.teacher_backend``,
``model.vllm_gpu_memory``): combinations that cannot apply are refused at load time, naming the field and
the fix (docs/decisions.md, "Rollout engines").

Part of the config layer (``adwin.config`` calls ``check_engines``; it must not import ``adwin.config`` back).
"""

from __future__ import annotations

from typing import Any

from adwin.policies.registry import is_audited

DEFAULT_VLLM_GPU_MEMORY = 0.3  # ModelConfig.vllm_gpu_memory's default
MAX_VLLM_GPU_MEMORY = 0.95  # what all engines together may reserve: the learner needs the rest


def check_engines(cfg: Any) -> None:
    """Raise ``ValueError`` naming the field when ``cfg`` (a ``TrainConfig``) combines engines wrongly."""
    m, r = cfg.model, cfg.rollout
    if m.teacher_backend == "vllm":
        if cfg.scheduler != "sync":
            raise ValueError("model.teacher_backend: 'vllm' is wired into the synchronous trainer only (the "
                             "AsyncOPD teacher stage scores with full logits); set model.teacher_backend: hf or "
                             "scheduler: sync")
        if cfg.loss.name != "reverse_kl_pg":
            raise ValueError(f"model.teacher_backend: 'vllm' scores the realized tokens only (prompt logprobs); "
                             f"loss.name={cfg.loss.name!r} needs the teacher's full logits: set "
                             "model.teacher_backend: hf or loss.name: reverse_kl_pg")
    probing = is_audited(cfg.window.policy) and cfg.probes.offers_per_step > 0
    if r.backend == "vllm" and cfg.scheduler == "sync" and probing and cfg.probes.backend != "inline":
        raise ValueError(f"probes.backend: {cfg.probes.backend!r} extends probes on transformers replicas of the "
                         "student, not on the vLLM engine of rollout.backend: vllm; set probes.backend: inline "
                         "(probes extended by the rollout engine after each step) or rollout.backend: hf")
    engines = vllm_engine_count(cfg)
    if engines == 0 and m.vllm_gpu_memory != DEFAULT_VLLM_GPU_MEMORY:
        raise ValueError("model.vllm_gpu_memory: read only when rollout.backend or model.teacher_backend is "
                         "'vllm'; drop it")
    if engines * m.vllm_gpu_memory > MAX_VLLM_GPU_MEMORY:
        raise ValueError(f"model.vllm_gpu_memory: {engines} vLLM engines x {m.vllm_gpu_memory} = "
                         f"{engines * m.vllm_gpu_memory:.2f} of the GPU, above {MAX_VLLM_GPU_MEMORY}; lower it to "
                         f"at most {MAX_VLLM_GPU_MEMORY / engines:.2f}")


def vllm_engine_count(cfg: Any) -> int:
    """vLLM engines the run starts on one GPU: the rollout engine, and one per distinct teacher checkpoint."""
    n = int(cfg.rollout.backend == "vllm")
    if cfg.model.teacher_backend == "vllm":
        paths = set(cfg.model.teachers.values())
        if "builtin" in paths:  # "builtin" stands for every route's prepared teacher
            from adwin import tasks

            paths = (paths - {"builtin"}) | {f"builtin:{route}" for route in tasks.ROUTES}
        n += len(paths)
    return n
