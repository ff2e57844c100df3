"""Serve the controller HTTP API and dashboard (``adwin controller serve``).

Binds 127.0.0.1 by default. Binding any other address needs a bearer token (``--token`` or
``ADWIN_CONTROLLER_TOKEN``): writes then require ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time

logger = logging.getLogger(__name__)

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# Persistence is the service's promise: by default it keeps its state in the working folder, so a restart
# in the same place serves the same runs. ':memory:' is an explicit choice.
DEFAULT_DB = "adwin-controller.db"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8470, help="port (default 8470; 0 picks a free one)")
    parser.add_argument("--db", default=DEFAULT_DB,
                        help=f"SQLite file (default ./{DEFAULT_DB} in the working folder, printed at start-up; "
                             "a restart on the same file serves the same runs); ':memory:' keeps nothing after exit")
    parser.add_argument("--token", default=None, help="bearer token required for writes (default: $ADWIN_CONTROLLER_TOKEN)")
    parser.add_argument("--max-body-bytes", type=int, default=None, help="request body limit (default fits an 8-rank sketch audit)")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"], help="uvicorn log level")


def resolve_token(host: str, token: str | None, env: str = "ADWIN_CONTROLLER_TOKEN") -> str | None:
    """The token to enforce (``token``, else ``$env``); refuses a non-local bind without one (ValueError: one
    line, exit 2)."""
    token = token or os.environ.get(env) or None
    if host not in LOCAL_HOSTS and token is None:
        raise ValueError(
            f"refusing to bind {host} without a token: pass --token or set {env} "
            "(only 127.0.0.1, localhost and ::1 may run open)"
        )
    return token


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from adwin.controller.app import DEFAULT_MAX_BODY_BYTES, create_app
    from adwin.controller.core import Controller

    token = resolve_token(args.host, args.token)
    # Import the audit math (it pulls in torch, seconds) in the background: the service is up at once,
    # and the first audit does not pay for the import unless it arrives within those seconds.
    threading.Thread(target=importlib.import_module, args=("adwin.audit.alignment",), daemon=True).start()
    if args.db == ":memory:":
        logger.warning("controller: --db :memory:, state lives in memory and is lost on exit")
    else:
        logger.info("controller: database %s", os.path.abspath(args.db))
    controller = Controller(args.db)
    app = create_app(controller, token=token, max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES)
    logger.info("controller: serving on http://%s:%d (db %s)", args.host, args.port, args.db)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def spawn_server(
    db: str | None, port: int | None = None, timeout_s: float = 60.0, *, extra_args: list[str] | None = None,
    cwd: str | None = None,
) -> tuple[subprocess.Popen, str]:
    """Start ``adwin controller serve`` on 127.0.0.1 as a child process; wait for ``/healthz``.

    Returns ``(process, base_url)``. ``db=None`` passes no ``--db`` (the default file in ``cwd``). The
    child runs open (no token, whatever the environment says); its stderr is kept for the error message
    if it exits early. The caller stops it.
    """
    return spawn_service(["controller", "serve", *([] if db is None else ["--db", db]), *(extra_args or [])],
                         port=port, timeout_s=timeout_s, cwd=cwd, token_env="ADWIN_CONTROLLER_TOKEN")


def spawn_service(command: list[str], *, port: int | None = None, timeout_s: float = 60.0, cwd: str | None = None,
                  token_env: str | None = None, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``adwin <command> --host 127.0.0.1 --port P`` as a child process and wait for its ``/healthz``.

    Returns ``(process, base_url)``; ``token_env`` is removed from the child's environment (it runs open
    unless ``command`` passes ``--token``). The caller stops the process."""
    import httpx

    port = free_port() if port is None else port
    cmd = [sys.executable, "-m", "adwin.cli", *command, "--host", "127.0.0.1", "--port", str(port)]
    child_env = {k: v for k, v in (env or os.environ).items() if k != token_env}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env, cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise RuntimeError(f"adwin {' '.join(command[:2])} exited {proc.returncode}: {err}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    proc.wait(timeout=10)
    raise RuntimeError(f"adwin {' '.join(command[:2])} did not become healthy within {timeout_s:.0f} s")
