"""The ADWIN controller: window policy, probe scheduler, audit aggregation and telemetry.

``Controller`` runs in-process (SQLite-backed); ``RemoteController`` talks to ``adwin controller
serve`` over HTTP. Both implement ``ControllerAPI``.
"""

from adwin.controller import api
from adwin.controller.api import *  # noqa: F403  (the protocol and every error class: api.__all__)
from adwin.controller.core import Controller

__all__ = ["Controller", "RemoteController", *api.__all__]  # noqa: F405  (RemoteController: lazy, below)


def __getattr__(name: str):  # lazy: the HTTP client and server pull in httpx / fastapi
    if name == "RemoteController":
        from adwin.controller.remote import RemoteController

        return RemoteController
    if name in ("create_app", "serve_in_thread"):
        from adwin.controller import app

        return getattr(app, name)
    raise AttributeError(name)
