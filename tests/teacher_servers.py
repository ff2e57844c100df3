"""``adwin teacher serve`` child processes for the tests: started on 127.0.0.1 (a free port) and stopped by them."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

from adwin.controller.serve import spawn_service


def start(model: str | Path, *extra: str, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """A server of ``model`` on one intra-op thread; returns (process, base URL without /v1)."""
    return spawn_service(["teacher", "serve", "--model", str(model), "--threads", "1", *extra], port=port,
                         timeout_s=120, token_env="ADWIN_TEACHER_TOKEN")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


@contextlib.contextmanager
def served(model: str | Path, *extra: str) -> Iterator[str]:
    """The OpenAI base URL (``http://127.0.0.1:PORT/v1``) of a server that lives for the ``with`` block."""
    proc, url = start(model, *extra)
    try:
        yield f"{url}/v1"
    finally:
        stop(proc)


@contextlib.contextmanager
def in_thread(model: str | Path, name: str = "teacher", port: int = 0, **batching: object) -> Iterator[str]:
    """The same server in this process (uvicorn on a thread): cheaper to start than a child process."""
    from adwin.controller.app import serve_app_in_thread
    from adwin.teacher.checkpoints import load_model, load_tokenizer
    from adwin.teacher_server.app import create_app
    from adwin.teacher_server.service import TeacherService

    service = TeacherService.of(load_model(model), load_tokenizer(model), name, path=str(model), **batching)
    url, stop_server = serve_app_in_thread(create_app(service), port=port, name=f"teacher-{name}")
    try:
        yield f"{url}/v1"
    finally:
        stop_server()
        service.batcher.close()
