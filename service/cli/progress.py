"""What a person at a terminal sees while berth works: a job's moves and transfer progress.

Both go to stderr and only when it is a terminal: piped or redirected, berth stays quiet, so
scripts read the job's own output and nothing else.
"""

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from service.core.states import JobState
from service.events import StateEvent


def on_terminal() -> bool:
    return sys.stderr.isatty()


def state_line(job_id: int, event: StateEvent) -> str:
    """One line for a move: queued → what it waits for → leased on worker X → running → end."""
    state = JobState(event.state)
    if state is JobState.QUEUED:
        why = f": waiting for {event.waiting_for}" if event.waiting_for else ""
        again = f" (attempt {event.attempt + 1})" if event.attempt else ""
        return f"berth: job {job_id} queued{again}{why}"
    if state is JobState.LEASED:
        return f"berth: job {job_id} leased on worker {event.worker} (attempt {event.attempt})"
    if state is JobState.RUNNING:
        waiting = f"; waiting for {event.waiting_for}" if event.waiting_for else ""
        return f"berth: job {job_id} running on worker {event.worker}{waiting}"
    code = f" (exit {event.exit_code})" if event.exit_code is not None else ""
    error = f": {event.error}" if event.error and state is not JobState.SUCCEEDED else ""
    return f"berth: job {job_id} {state}{code}{error}"


class Moves:
    """Prints a job's state changes to stderr, on a terminal only."""

    def __init__(self, job_id: int, *, enabled: bool | None = None) -> None:
        self.job_id = job_id
        self.enabled = on_terminal() if enabled is None else enabled
        self.ended = False  # the last line said how it ended

    def show(self, event: StateEvent) -> None:
        if not self.enabled:
            return
        sys.stdout.flush()
        sys.stderr.write(state_line(self.job_id, event) + "\n")
        sys.stderr.flush()
        self.ended = JobState(event.state).terminal


@contextlib.contextmanager
def bar(what: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A bytes-and-rate bar on a terminal, for `what`: yields `advance(n)`. Elsewhere, nothing."""
    if not on_terminal():
        yield lambda _n: None
        return
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=False,
    )
    with progress:
        task = progress.add_task(what, total=total)
        yield lambda n: progress.advance(task, n)


def counted(chunks: Iterator[bytes], advance: Callable[[int], None]) -> Iterator[bytes]:
    """`chunks` unchanged, each counted by `advance` as it passes."""
    for chunk in chunks:
        advance(len(chunk))
        yield chunk
