"""Settling asyncio futures of the worker's event loop (called there, or via call_soon_threadsafe)."""

from __future__ import annotations

import asyncio
from typing import Any


def resolve(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(None)


def fail(fut: asyncio.Future[Any], error: BaseException) -> None:
    if not fut.done():
        fut.set_exception(error)
