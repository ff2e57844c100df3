"""Request bodies read as strict JSON: what Python's ``json`` lets through and the teacher server must not.

``json.loads`` takes ``NaN`` / ``Infinity``, turns ``1e400`` into ``inf``, decodes ``"\\ud800"`` into a lone
surrogate, raises ``RecursionError`` on a deeply nested body and ``ValueError`` on an integer of thousands of
digits; FastAPI answers the last three with an anonymous 400. ``StrictJSONRoute`` (the routers' route class)
parses the body itself and refuses each of these with a ``BodyError``: a 400 in OpenAI's shape whose ``param``
names the place (``prompt[0][3]``, or ``body`` when no place parses).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute

from adwin.controller.json_guard import MAX_DEPTH, json_problem, safe_text


class BodyError(HTTPException):
    """A body that is not strict JSON (HTTP 400); ``param`` names where. An ``HTTPException`` so that FastAPI's
    body reader passes it through instead of answering its own anonymous 400."""

    def __init__(self, message: str, param: str = "body") -> None:
        super().__init__(400, safe_text(message))
        self.param = param


def parse_body(raw: bytes) -> Any:
    """``raw`` as a JSON value of finite numbers and UTF-8 strings nested at most ``MAX_DEPTH`` deep, or a
    ``BodyError``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BodyError(f"body is not UTF-8 (byte {e.start})") from e
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise BodyError(f"body is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from e
    except RecursionError as e:
        raise BodyError(f"body: nested deeper than {MAX_DEPTH} levels") from e
    except ValueError as e:  # an integer literal longer than Python converts (4300 digits)
        raise BodyError("body holds an integer literal of thousands of digits") from e
    fields = value.items() if isinstance(value, dict) else [("body", value)]
    deep = next((str(k) for k, v in fields if _deeper(v, MAX_DEPTH - 1)), None)
    if deep is not None:
        raise BodyError(f"{deep}: nested deeper than {MAX_DEPTH} levels", safe_text(deep[:64]))
    problem = json_problem(value)
    if problem is not None:
        where, _, why = problem.partition(": ")
        raise BodyError(f"{where.removeprefix('body').lstrip('.') or 'body'}: {why}",
                        where.removeprefix("body").lstrip(".") or "body")
    return value


def _deeper(value: Any, levels: int) -> bool:
    """Whether ``value`` nests lists or objects more than ``levels`` deep."""
    if not isinstance(value, (list, dict)):
        return False
    if levels <= 0:
        return True
    return any(_deeper(v, levels - 1) for v in (value.values() if isinstance(value, dict) else value))


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_body(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """An ``APIRoute`` whose handler reads the body with ``parse_body`` (FastAPI's custom request class pattern)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict
