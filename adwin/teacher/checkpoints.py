"""Teacher checkpoints: how one is loaded, and what it must share with the student.

``load_model`` and ``load_tokenizer`` load a transformers folder or hub name (the student's too: ``adwin.loop.parts``).
OPD compares student and teacher logprobs token by token, so every teacher must share the student's tokenizer;
``check_tokenizers`` refuses a mismatch at start-up instead of producing silently wrong losses (a served teacher is
checked through its server instead: ``adwin.teacher.served``). Routes that name one checkpoint share one model
(``one_per_checkpoint``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TokenizerMismatch(ValueError):
    """A teacher's tokenizer differs from the student's."""


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu") -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype])
    return model.to(device)


def load_tokenizer(path: str | Path) -> object:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # generation pads with EOS; masks keep pads out of every loss
    return tok


def _vocab(tokenizer: object) -> dict[str, int]:
    return dict(tokenizer.get_vocab())  # type: ignore[attr-defined]


def check_tokenizers(student_tok: object, teacher_toks: Mapping[str, object | None], student_vocab_size: int,
                     teacher_vocab_sizes: Mapping[str, int]) -> None:
    """Raise ``TokenizerMismatch`` naming the teacher whose vocabulary differs from the student's.

    Tokenizers must map the same strings to the same ids; model vocab sizes may differ only by padding
    rows beyond the tokenizer (common for hub checkpoints), never below the tokenizer's size, and a teacher is
    at least as wide as the student (the student samples from every one of its rows).
    """
    s_vocab = _vocab(student_tok)
    for key, tok in teacher_toks.items():
        if tok is not None:
            t_vocab = _vocab(tok)
            if t_vocab != s_vocab:
                differ = sum(1 for k, v in s_vocab.items() if t_vocab.get(k) != v) + len(set(t_vocab) - set(s_vocab))
                raise TokenizerMismatch(
                    f"teacher {key!r} has a different tokenizer than the student ({len(t_vocab)} vs "
                    f"{len(s_vocab)} tokens, {differ} entries differ); on-policy distillation needs a shared tokenizer"
                )
        needed = max(s_vocab.values()) + 1
        t_size = teacher_vocab_sizes[key]
        if t_size < needed or (tok is None and t_size != student_vocab_size):
            raise TokenizerMismatch(
                f"teacher {key!r} has vocab size {t_size} but the student's tokenizer needs {needed} "
                f"(student model: {student_vocab_size}); on-policy distillation needs a shared tokenizer"
            )
        if t_size < student_vocab_size:  # a sampled padding row at or past t_size would be an id the teacher cannot read
            raise TokenizerMismatch(
                f"teacher {key!r} scores {t_size} token ids but the student's output layer has {student_vocab_size} "
                f"rows: the student could sample a padding id (past the tokenizer's {needed}) the teacher cannot "
                f"read; use a teacher at least as wide, or resize the student's embeddings to {t_size} "
                "(model.resize_token_embeddings) before the run"
            )


def one_per_checkpoint(paths: Mapping[str, str | Path], load: Callable[[str | Path], Any]) -> dict[str, Any]:
    """Route -> ``load(path)``, loading each distinct checkpoint once: routes that share one share the model."""
    by_path: dict[str, Any] = {}
    for p in paths.values():
        if str(p) not in by_path:
            by_path[str(p)] = load(p)
    return {k: by_path[str(p)] for k, p in paths.items()}


def teacher_tokenizers(paths: Mapping[str, str | Path]) -> dict[str, object | None]:
    """Route -> its checkpoint's tokenizer; None for a checkpoint without tokenizer files (the vocab size
    check of ``check_tokenizers`` remains)."""
    toks: dict[str, object | None] = {}
    for k, p in paths.items():
        if Path(p).is_dir() and not (Path(p) / "tokenizer_config.json").exists():
            # every saved HF tokenizer writes this file; without it transformers 4.57 fails inside its converter
            toks[k] = None
            continue
        try:
            toks[k] = load_tokenizer(p)
        except (OSError, ValueError):
            toks[k] = None
    return toks
