"""Fire-and-forget tasks whose failures are seen.

`spawn()` keeps each task alive until it ends and logs its exception with the traceback.

A task nobody awaits drops its exception (asyncio prints "Task exception was never retrieved",
if ever, when it is collected). Every server task that is started and not awaited goes through
here; cancellation is not a failure.
"""

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

log = structlog.get_logger(__name__)

_running: set[asyncio.Task[Any]] = set()  # asyncio keeps only weak references to tasks


def spawn(work: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
    """Run `work` on its own task; an exception it ends with is logged (`task_failed`)."""
    task = asyncio.get_running_loop().create_task(work, name=name)
    _running.add(task)
    task.add_done_callback(_done)
    return task


def _done(task: asyncio.Task[Any]) -> None:
    _running.discard(task)
    if task.cancelled():
        return
    if (exc := task.exception()) is not None:
        log.error("task_failed", task=task.get_name(), exc_info=exc)
