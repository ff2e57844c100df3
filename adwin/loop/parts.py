"""Everything a run computes with, loaded and checked before the first step: prompts, models, optimizer and the
controller run spec (the loggers: ``adwin.runtime.metrics_log.open_loggers``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from adwin.config import TrainConfig
from adwin.controller.schemas import PolicyIn, RunIn
from adwin.loop.memory import enable_checkpointing
from adwin.sampling.data import (
    Prompt,
    PromptStream,
    TrainPrompts,
    check_context,
    check_routes,
    load_jsonl,
    match_answer,
)
from adwin.student.lora import apply_lora
from adwin.tasks.prompts import BuiltinPrompts, builtin_checker, builtin_prompts
from adwin.teacher.checkpoints import load_model, load_tokenizer
from adwin.teacher.load import AnyTeachers, load_teachers


@dataclass
class Parts:
    """Everything a run computes with, loaded and checked before the first step."""

    student: torch.nn.Module
    tokenizer: Any
    teachers: AnyTeachers  # model.teacher_backend
    train_prompts: TrainPrompts
    eval_prompts: list[Prompt]
    checker: Callable[[str, str], bool]
    # a list: every evaluation appends its per-row scores (adwin.loop.evaluate.EvalRows); None: not kept
    eval_log: list[Any] | None = None
    # which models these are, for reports: the built-in ones' source and weights, or the student's checkpoint
    models: str = ""



def load_parts(cfg: TrainConfig, profile: str = "default") -> Parts:
    """Load prompts, student and teachers; check tokenizers, context and routes before any compute.

    ``builtin`` model paths come from the built-in task's prepared assets of ``profile`` (``tiny`` for tests).
    """
    from transformers import AutoConfig  # heavy: imported when a run loads

    uses_builtin = cfg.model.student == "builtin" or "builtin" in cfg.model.teachers.values()
    assets = builtin_assets(cfg, profile) if uses_builtin else None
    student_path, tok_path = student_paths(cfg, assets)
    teacher_paths = resolve_teachers(cfg.model.teachers, assets)
    train, eval_p = load_prompts(cfg)  # their own RNG streams: nothing below draws from them
    check_routes(train.route_examples() + eval_p, list(teacher_paths))  # before any model loads
    # the student's positions from its config file (a composite model's: its text decoder's), so a run that cannot
    # fit stops before any weights load
    context = getattr(AutoConfig.from_pretrained(student_path).get_text_config(), "max_position_embeddings", None)
    check_context(cfg.data.max_prompt_len, cfg.rollout.max_response_len, context)
    tokenizer = load_tokenizer(tok_path)
    base = load_model(student_path, cfg.model.dtype, cfg.model.device)
    served = cfg.model.teacher_server
    teachers = load_teachers(cfg.model.teacher_backend, teacher_paths, tokenizer, int(base.config.vocab_size),
                             cfg.model.dtype, cfg.model.device, gpu_memory=cfg.model.vllm_gpu_memory,
                             max_model_len=cfg.data.max_prompt_len + cfg.rollout.max_response_len,
                             client=served.client(), check_tokenizer=served.check_tokenizer)
    # LoRA adapters on the student only (teachers stay the plain checkpoints); apply_lora seeds its own init
    student = base if cfg.model.lora is None else apply_lora(base, cfg.model.lora, seed=cfg.seed)
    if cfg.model.gradient_checkpointing:  # a student HF cannot checkpoint is refused here, not at the first update
        enable_checkpointing(student)
    checker = builtin_checker() if cfg.data.task == "builtin" else match_answer
    return Parts(student, tokenizer, teachers, train, eval_p, checker, models=models_label(assets, student_path))


def models_label(assets: Any, student_path: str) -> str:
    from adwin.tasks.shipped import describe

    return describe(assets) if assets is not None else f"student {student_path}"


def builtin_assets(cfg: TrainConfig, profile: str) -> Any:
    """The built-in task's models of ``profile``: shipped, or this machine's own build (``model.builtin_source``)."""
    from adwin.tasks.shipped import builtin_assets as resolve

    return resolve(profile, cfg.model.builtin_seed, cfg.data.builtin_task, cfg.model.builtin_source)


def student_paths(cfg: TrainConfig, assets: Any) -> tuple[str, str]:
    """The student's checkpoint and tokenizer folders (``builtin``: the prepared ones in ``assets``)."""
    if cfg.model.student == "builtin" and assets is not None:
        return str(assets.student_path), str(assets.tokenizer_path)
    return cfg.model.student, cfg.model.student


def resolve_teachers(spec: dict[str, str], assets: Any) -> dict[str, str]:
    """``{"default": "builtin"}`` means all of the built-in task's teachers, keyed by route."""
    if assets is not None and spec == {"default": "builtin"}:
        return {k: str(v) for k, v in assets.teacher_paths.items()}
    out = {}
    for key, path in spec.items():
        if path == "builtin":
            if assets is None or key not in assets.teacher_paths:
                raise ValueError(f"model.teachers.{key}: no built-in teacher for route {key!r}")
            path = str(assets.teacher_paths[key])
        out[key] = path
    return out


def load_prompts(cfg: TrainConfig) -> tuple[TrainPrompts, list[Prompt]]:
    """The training prompt stream and the evaluation problems. Nothing here depends on ``cfg.steps``, so
    ``--resume --steps`` extends a run with the prompts a straight run of the new length gets."""
    d = cfg.data
    if d.task == "builtin":
        task = d.builtin_task
        return BuiltinPrompts(cfg.seed, task), builtin_prompts(cfg.eval.n_problems, cfg.seed, "eval", task)
    assert d.path is not None  # the config validator guarantees it
    train_p = load_jsonl(d.path, d.route_key)
    if d.eval_path:
        return PromptStream(train_p, cfg.seed), load_jsonl(d.eval_path, d.route_key)[: cfg.eval.n_problems]
    # No eval file: hold out the tail (at most a fifth of the file) so eval prompts are never trained on.
    n_hold = max(1, min(d.n_eval or cfg.eval.n_problems, len(train_p) // 5))  # n_eval <= n_problems: config rule
    if len(train_p) <= n_hold:
        raise ValueError(f"data.path has {len(train_p)} prompts: too few to hold out evaluation problems")
    return PromptStream(train_p[:-n_hold], cfg.seed), train_p[-n_hold:]


def run_spec(cfg: TrainConfig) -> RunIn:
    w, p = cfg.window, cfg.probes
    policy = PolicyIn(name=w.policy, max_len=cfg.rollout.max_response_len, options=w.policy_options(), **w.knobs())
    return RunIn(name=cfg.name, policy=policy, probe_batch_size=p.batch_size, staleness_limit=p.staleness_limit,
                 offers_per_step=p.offers_per_step, max_active_probes=p.max_active, lookahead=p.lookahead,
                 selection=p.selection, seed=cfg.seed, config=cfg.model_dump(mode="json"))


SMALL_MODEL_PARAMS = 20_000_000


def limit_threads(model: Any, device: str) -> None:
    """One intra-op thread for small models on CPU: their ops are too small to split, and on a busy
    2-core machine extra threads oversubscribe (measured: 12 ms vs 110-230 ms per generated token)."""
    import torch

    n_params = sum(p.numel() for p in model.parameters())
    if device == "cpu" and n_params < SMALL_MODEL_PARAMS:
        torch.set_num_threads(1)
