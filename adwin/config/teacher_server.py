"""``model.teacher_server``: how a run talks to teachers behind servers (``model.teacher_backend: server``), and
the rules a served teacher puts on the rest of the run (docs/decisions.md, "A teacher behind a server")."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field

from adwin.config.base import _Strict
from adwin.objectives.loss_table import LOSSES, losses_where
from adwin.teacher.client import ClientSettings, split_url

# what a server gives: realized-token logprobs (prompt logprobs) and their top-k; OAPL's reward reads the former
SERVED_SIGNALS = ("realized", "topk", "sequence")


class TeacherServerConfig(_Strict):
    protocol: Literal["auto", "prompt_logprobs", "echo"] = Field(
        "auto", description="how prompt tokens are scored: vLLM's prompt_logprobs, the legacy echo + logprobs "
        "form, or auto (prompt_logprobs, then echo, tried once at start-up)")
    timeout_seconds: float = Field(60.0, gt=0.0, le=3600.0, description="seconds one request may take")
    retries: int = Field(3, ge=0, le=100, description="retries of a failed request (refused connection, timeout, "
                         "HTTP 408/429/5xx) before the step stops the run with a checkpoint")
    backoff_seconds: float = Field(0.5, ge=0.0, le=60.0, description="wait before the first retry; doubles "
                                   "each retry (at most 30 s)")
    concurrency: int = Field(4, ge=1, le=256, description="requests in flight per server")
    rows_per_request: int = Field(8, ge=1, le=4096, description="sequences per request (the prompt list)")
    max_tokens: Literal[0, 1] = Field(1, description="max_tokens of each request: 1 (vLLM needs at least 1) or 0 "
                                      "(servers that score an echo without generating)")
    token_env: str = Field("ADWIN_TEACHER_TOKEN", min_length=1, description="environment variable holding the "
                           "servers' bearer token (unset: no Authorization header)")
    check_tokenizer: bool = Field(True, description="compare the server's spelling of probe token ids with the "
                                  "student's tokenizer at start-up (ids and vocabulary size are always checked)")

    def client(self) -> ClientSettings:
        return ClientSettings(protocol=self.protocol, timeout_s=self.timeout_seconds, retries=self.retries,
                              backoff_s=self.backoff_seconds, concurrency=self.concurrency,
                              rows_per_request=self.rows_per_request, max_tokens=self.max_tokens,
                              token=os.environ.get(self.token_env) or None)


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def check_served_teacher(backend: str, teachers: dict[str, str], settings: TeacherServerConfig, loss: str) -> None:
    """``model.teacher_backend: server`` (``backend``) needs URLs in ``model.teachers`` and a loss (``loss.name``) a
    server can feed; URLs and ``model.teacher_server`` settings need that backend."""
    urls = {k: v for k, v in teachers.items() if is_url(v)}
    if backend != "server":
        if urls:
            key = next(iter(urls))
            raise ValueError(f"model.teachers.{key}: {urls[key]!r} is a server URL; set model.teacher_backend: server")
        default = TeacherServerConfig()
        changed = [k for k in TeacherServerConfig.model_fields if getattr(settings, k) != getattr(default, k)]
        if changed:
            raise ValueError(f"model.teacher_server.{changed[0]}: read only with model.teacher_backend: server; "
                             "drop it")
        return
    for key, spec in teachers.items():
        if not is_url(spec):
            raise ValueError(f"model.teachers.{key}: model.teacher_backend: server needs a server URL per routing "
                             f"key (e.g. http://127.0.0.1:8000/v1), got {spec!r}")
        try:
            split_url(spec)
        except ValueError as e:
            raise ValueError(f"model.teachers.{key}: {e}") from e
    if LOSSES[loss].teacher not in SERVED_SIGNALS:
        raise ValueError(f"loss.name: {loss!r} needs the teacher's "
                         f"{'full logits' if LOSSES[loss].teacher == 'logits' else 'logprobs of cached actions'}"
                         f", which a teacher server does not give (realized tokens and top-k only); use one of "
                         f"{[n for n in losses_where() if LOSSES[n].teacher in SERVED_SIGNALS]} or "
                         "model.teacher_backend: hf")
