"""A teacher server of a tiny model, in process (uvicorn on a thread, 127.0.0.1, a free port) per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tiny_models import make_tiny_llama

from adwin.controller.app import serve_app_in_thread
from adwin.tasks.tokenizer import build_tokenizer
from adwin.teacher_server.app import create_app
from adwin.teacher_server.service import TeacherService

VOCAB = 64
MAX_LEN = 48


def tiny_service(**batching: object) -> TeacherService:
    return TeacherService.of(make_tiny_llama(vocab_size=VOCAB, seed=10), build_tokenizer(), "tiny-teacher",
                             max_len=MAX_LEN, max_logprobs=8, **batching)


@pytest.fixture(scope="module")
def service() -> Iterator[TeacherService]:
    svc = tiny_service(max_wait_s=0.002)
    yield svc
    svc.batcher.close()


@pytest.fixture(scope="module")
def server(service: TeacherService) -> Iterator[str]:
    """Base URL (no /v1) of an open server."""
    url, stop = serve_app_in_thread(create_app(service, max_body_bytes=64_000), name="teacher-test")
    yield url
    stop()


@pytest.fixture(scope="module")
def locked_server(service: TeacherService) -> Iterator[str]:
    """The same service behind a bearer token."""
    url, stop = serve_app_in_thread(create_app(service, token="s3cret"), name="teacher-test-token")
    yield url
    stop()
