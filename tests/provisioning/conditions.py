"""Waiting on a condition with a deadline, instead of sleeping for a guessed time."""

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    check: Callable[[], T | Awaitable[T]], *, what: str, timeout: float = 10.0
) -> T:
    """Return the first truthy result of `check()`; fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)
