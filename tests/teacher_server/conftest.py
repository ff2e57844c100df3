"""A teacher server of a tiny model, in process (uvicorn on a thread, 127.0.0.1, a free port) per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tiny_teacher import tiny_service

from adwin.controller.app import serve_app_in_thread
from adwin.teacher_server.app import create_app
from adwin.teacher_server.service import TeacherService


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
