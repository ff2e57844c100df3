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
