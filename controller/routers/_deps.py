"""Shared route dependencies: the app's controller and the ``Idempotency-Key`` header."""

from __future__ import annotations

from fastapi import Header, Request

from adwin.controller.core import Controller


# async on purpose: FastAPI runs sync dependencies on the thread pool, one hop each.
async def controller(request: Request) -> Controller:
    return request.app.state.controller


async def idempotency_key(
    key: str | None = Header(
        None,
        alias="Idempotency-Key",
        min_length=1,
        max_length=256,
        description="a write repeated with the same key returns the original answer and is applied once",
    ),
) -> str | None:
    return key
