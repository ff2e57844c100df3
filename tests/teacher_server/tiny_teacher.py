"""The tiny model the teacher server tests serve (built in code: nothing from a hub)."""

from __future__ import annotations

from tiny_models import make_tiny_llama

from adwin.tasks.tokenizer import build_tokenizer
from adwin.teacher_server.service import TeacherService

VOCAB = 64
MAX_LEN = 48


def tiny_service(max_logprobs: int = 8, **batching: object) -> TeacherService:
    return TeacherService.of(make_tiny_llama(vocab_size=VOCAB, seed=10), build_tokenizer(), "tiny-teacher",
                             max_len=MAX_LEN, max_logprobs=max_logprobs, **batching)
