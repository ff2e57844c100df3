"""Per-call time of GET /v1/runs/{id}/window through the ASGI app (no socket).

``fast``: as served; ``route``: the middleware's fast path patched out (meaningful only on code that
still had ``_ServiceMiddleware._fast_window`` and a FastAPI window route, i.e. before the change).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

sys.path.insert(0, "tests/controller")
from controller_harness import run_spec  # noqa: E402

from adwin.controller import Controller  # noqa: E402
from adwin.controller.app import _ServiceMiddleware, create_app  # noqa: E402


async def main(fast: bool, n: int = 20000) -> tuple[float, float]:
    ctrl = Controller()
    rid = ctrl.register_run(run_spec()).run_id
    if not fast:
        async def no(self: object, scope: dict, send: object) -> bool:
            return False

        _ServiceMiddleware._fast_window = no  # type: ignore[attr-defined]
    app = create_app(ctrl)
    app.middleware_stack = app.build_middleware_stack()
    path = f"/v1/runs/{rid}/window"
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"step=5",
             "headers": [], "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80),
             "client": ("127.0.0.1", 1), "root_path": "", "app": app}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    times = []
    for _ in range(n):
        t = time.perf_counter()
        await app(dict(scope), receive, send)
        times.append(time.perf_counter() - t)
    assert sent[0]["status"] == 200, sent[:2]
    kept = sorted(times[n // 10:])
    return statistics.median(kept) * 1e6, kept[int(len(kept) * 0.99)] * 1e6


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "fast"
    p50, p99 = asyncio.run(main(mode == "fast"))
    sys.stdout.write(f"{mode}: p50 {p50:.1f} us  p99 {p99:.1f} us\n")
