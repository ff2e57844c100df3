"""A real TRL ``DistillationTrainer`` on a tiny Llama student/teacher with a code-built tokenizer, on CPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiny_models import make_tiny_llama

MAX_LEN = 16


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(60)]  # ids match make_tiny_llama
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        padding_side="left",
    )


def prompts(n: int) -> Any:
    """A ``datasets.Dataset`` of ``n`` prompts of 3 to 5 words."""
    import datasets

    return datasets.Dataset.from_dict({"prompt": [" ".join(f"w{(i * 7 + j) % 60}" for j in range(3 + i % 3))
                                                  for i in range(n)]})


def _fields(tmp_path: Path, steps: int, batch: int, max_len: int) -> dict[str, Any]:
    return dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=batch, max_steps=steps,
                max_completion_length=max_len, logging_steps=1, report_to=[], save_strategy="no",
                gradient_checkpointing=False, bf16=False, use_cpu=True, learning_rate=1e-3, seed=0,
                disable_tqdm=True)


def make_trainer(tmp_path: Path, steps: int, *, batch: int = 4, max_len: int = MAX_LEN, peft_config: Any = None,
                 teacher: bool = True, **overrides: Any):
    """``batch`` rollouts per optimizer step (per device, one process); ``overrides`` go to ``DistillationConfig``;
    ``peft_config`` to the trainer, which wraps the student with it (TRL's PEFT recipe); ``teacher=False``: no
    ``teacher_model``."""
    from trl import DistillationConfig, DistillationTrainer

    accum = int(overrides.get("gradient_accumulation_steps", 1))
    args = DistillationConfig(**(_fields(tmp_path, steps, batch, max_len) | overrides))
    return DistillationTrainer(
        model=make_tiny_llama(seed=0), teacher_model=make_tiny_llama(seed=1) if teacher else None, args=args,
        train_dataset=prompts(batch * accum * steps), processing_class=tokenizer(), peft_config=peft_config,
    )


def make_server_trainer(tmp_path: Path, url: str, steps: int, *, batch: int = 4, max_len: int = MAX_LEN,
                        **overrides: Any):
    """TRL's ``ServerDistillationTrainer`` scoring with the teacher server at ``url`` (its root, as TRL takes it),
    TRL's default loss (top-1 reverse KL) unless ``overrides`` (to ``ServerDistillationConfig``) say otherwise."""
    from trl.experimental.server_distillation import ServerDistillationConfig, ServerDistillationTrainer

    args = ServerDistillationConfig(**(_fields(tmp_path, steps, batch, max_len) | {"teacher_model_server_url": url}
                                       | overrides))
    return ServerDistillationTrainer(model=make_tiny_llama(seed=0), args=args, train_dataset=prompts(batch * steps),
                                     processing_class=tokenizer())


def save_teacher(path: Path, rows: int | None = None) -> Path:
    """A tiny teacher checkpoint (``make_tiny_llama(seed=1)``, the local teacher of ``make_trainer``) with the
    student's tokenizer, for ``adwin teacher serve``; ``rows``: its output padded to that many rows
    (``tiny_models.padded_copy``: large logits past the student's vocabulary)."""
    from tiny_models import padded_copy
    from trainer_fixtures import save_tiny

    if rows is None:
        save_tiny(path, seed=1, with_tokenizer=False)
    else:
        padded_copy(make_tiny_llama(seed=1), rows).save_pretrained(path)
    tokenizer().save_pretrained(str(path))
    return path


def rows(trainer: Any) -> list[dict]:
    return [r for r in trainer.state.log_history if "loss" in r]


CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"  # the words, as the plain tokenizer reads them


def chat_tokenizer():
    """``tokenizer()`` with a chat template: TRL's async rollout loop encodes every prompt as a conversation."""
    tok = tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


def chat_prompts(n: int) -> Any:
    """``prompts(n)`` as one-turn conversations (TRL's async trainer's dataset form)."""
    import datasets

    return datasets.Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts(n)["prompt"]]})


@dataclass
class AsyncServers:
    """The student's stand-in vLLM server and a teacher server (``adwin teacher serve``), both on 127.0.0.1; URLs are
    roots, as TRL's config takes them."""

    student: Any  # vllm_standin.StandInServer
    student_url: str
    teacher_url: str


@contextlib.contextmanager
def async_servers(tmp_path: Path, *, max_model_len: int = 64, teacher_rows: int | None = None,
                  vocab: int | None = None) -> Iterator[AsyncServers]:
    """``teacher_rows``: the teacher padded to that many output rows; ``vocab``: the columns its server serves
    (``adwin teacher serve --vocab-size``; default all)."""
    import teacher_servers
    from vllm_standin import StandInServer, serving

    standin = StandInServer(make_tiny_llama(seed=0), [2], 0, max_model_len=max_model_len)
    teacher = save_teacher(tmp_path / "teacher", teacher_rows)
    with serving(standin) as url, teacher_servers.in_thread(teacher, vocab=vocab) as t:
        yield AsyncServers(standin, url, t.removesuffix("/v1"))


def make_async_trainer(tmp_path: Path, steps: int, servers: AsyncServers, worker: Any = None, *, batch: int = 4,
                       max_len: int = MAX_LEN, **overrides: Any):
    """TRL's ``AsyncDistillationTrainer`` on the tiny student (saved under ``tmp_path``: it loads from a path) with
    ``worker`` (default ``AdwinRolloutWorker()``) as its rollout worker, generating on ``servers``' stand-in and
    scoring on its teacher server, on CPU: one rollout per micro-batch (``batch`` micro-batches a step), so TRL's
    padding-free packing never puts two sequences in one SDPA row. Weights reach the stand-in through
    ``StandInWeights`` (TRL's NCCL transfer needs a GPU)."""
    from trainer_fixtures import save_tiny
    from trl.experimental.async_distillation import async_distillation_trainer as adt
    from vllm_standin import StandInWeights

    from adwin.trainer_adapters.trl_async import AdwinRolloutWorker

    adt.get_peak_flops_per_device = lambda *args: None  # CUDA-only query; the MFU metrics are skipped without it
    fields = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=1, gradient_accumulation_steps=batch,
                  max_steps=steps, max_completion_length=max_len, logging_steps=1, report_to=[], save_strategy="no",
                  gradient_checkpointing=False, bf16=False, use_cpu=True, learning_rate=1e-3, seed=0,
                  disable_tqdm=True, token_budget=0, model_init_kwargs={"attn_implementation": "sdpa"},
                  vllm_server_base_url=servers.student_url, teacher_server_urls={"default": servers.teacher_url},
                  request_timeout=30)
    args = adt.AsyncDistillationConfig(**(fields | overrides))
    student = tmp_path / "student"
    if not student.exists():
        save_tiny(student, seed=0, with_tokenizer=False)
    return adt.AsyncDistillationTrainer(model=str(student), args=args, train_dataset=chat_prompts(32),
                                        processing_class=chat_tokenizer(),
                                        rollout_worker=AdwinRolloutWorker() if worker is None else worker,
                                        weight_transfer=StandInWeights(servers.student, servers.student_url))
