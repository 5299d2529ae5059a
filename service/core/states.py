"""States of jobs, leases and workers, and the words shown for them."""

import enum


class JobState(enum.StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT})
LIVE_JOB_STATES = (JobState.LEASED, JobState.RUNNING)


class LeaseState(enum.StrEnum):
    LIVE = "live"
    DONE = "done"  # the worker reported a result under it
    EXPIRED = "expired"  # the worker went silent or restarted; the job moved on
    CANCELLED = "cancelled"  # the job was cancelled while leased


class WorkerState(enum.StrEnum):
    """What an operator set. Liveness (unreachable, lost) is tracked beside it."""

    ACTIVE = "active"
    DRAINING = "draining"
    DISABLED = "disabled"


class Liveness(enum.StrEnum):
    OK = "ok"
    UNREACHABLE = "unreachable"  # stage 1 of silence: no new lease
    LOST = "lost"  # stage 2: its leases expired
    GONE = "gone"  # detached cleanly (exited, refused, or its token was revoked)


class DevicePolicy(enum.StrEnum):
    REQUIRE = "require"
    PREFER = "prefer"


class TokenKind(enum.StrEnum):
    ADMIN = "admin"
    OPERATOR = "operator"
    SERVICE = "service"
    WORKER = "worker"
    METRICS = "metrics"


def shown_worker_state(
    state: WorkerState, liveness: Liveness, *, attached: bool = True, credential: str = ""
) -> str:
    """The one word `worker list` shows.

    A credential that no longer works (`revoked`, `expired`) wins: such a worker runs nothing
    again, whatever its socket does meanwhile. Then silence wins over what an operator set, and
    a worker no server holds is `offline` until it attaches again.
    """
    if credential:
        return credential
    if liveness in (Liveness.UNREACHABLE, Liveness.LOST):
        return str(liveness)
    if liveness is Liveness.GONE or not attached:
        return "offline"
    return str(state)


def exit_status(state: JobState, exit_code: int | None) -> int:
    """The exit status `berth job submit --wait` ends with, so a remote job feels local."""
    if state is JobState.SUCCEEDED:
        return 0
    if state is JobState.FAILED:
        return exit_code if exit_code not in (None, 0) else 1
    if state is JobState.TIMED_OUT:
        return 124  # what coreutils' timeout(1) exits with
    if state is JobState.CANCELLED:
        return 130  # as if interrupted
    return 1
