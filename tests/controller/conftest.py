"""Fixtures of the controller suites: the same contract in-process and over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adwin.controller import Controller


@pytest.fixture(scope="module")
def http_server() -> Iterator[tuple[str, Controller]]:
    """One real uvicorn server on 127.0.0.1 (ephemeral port) per test module."""
    from adwin.controller.app import serve_in_thread

    ctrl = Controller()
    url, stop = serve_in_thread(ctrl, "127.0.0.1", 0)
    yield url, ctrl
    stop()
    ctrl.close()


@pytest.fixture(params=["local", "remote"])
def api(request: pytest.FixtureRequest) -> Iterator[object]:
    """The same contract, in-process and over HTTP."""
    if request.param == "local":
        ctrl = Controller()
        yield ctrl
        ctrl.close()
    else:
        from adwin.controller.remote import RemoteController

        url, _ = request.getfixturevalue("http_server")
        client = RemoteController(url, retries=1, backoff=0.01, timeout=10.0)
        yield client
        client.close()
