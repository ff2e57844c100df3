"""Fixtures of the adapter suites."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adwin.controller import Controller


@pytest.fixture
def remote_url() -> Iterator[str]:
    """A real uvicorn controller service on 127.0.0.1 (ephemeral port) for one test."""
    from adwin.controller.app import serve_in_thread

    ctrl = Controller()
    url, stop = serve_in_thread(ctrl, "127.0.0.1", 0)
    yield url
    stop()
    ctrl.close()


@pytest.fixture
def trl_vllm_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL's ``VLLMClient`` refuses to start where vllm is not installed, though scoring over HTTP does not use it."""
    vllm_client = pytest.importorskip("trl.generation.vllm_client")
    monkeypatch.setattr(vllm_client, "is_vllm_available", lambda *args, **kwargs: True)
