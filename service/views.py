"""What the HTTP API answers: one msgspec Struct per response shape, and the one error shape.

The server's handlers return these; the CLI and a Python client decode them by type. So this
module depends on msgspec and the standard library only (an import contract in pyproject says
so): a client installs it without the server extra. Field names are the JSON names; a field
added here is added to every answer that carries it, and to the OpenAPI document.

Times are RFC 3339 strings in UTC (`2026-12-01T14:25:00.123456Z`); sizes are bytes; `*_gb` are
GiB as floats.
"""

from datetime import datetime
from typing import Any, Literal

import msgspec


class View(msgspec.Struct, kw_only=True):
    """Base of every answer; its fields are keyword-only, so adding one breaks no caller."""


# -- errors ----------------------------------------------------------------------------------


class ErrorView(View, omit_defaults=True):
    """Every 4xx and 5xx answer: what went wrong, the status again, and the field at fault."""

    error: str
    status: int
    # The request field at fault (`command`, `max_attempts`, `inputs[0].sha256`, a query
    # parameter's name), when there is one; absent otherwise.
    field: str | None = None


# -- health ----------------------------------------------------------------------------------


class HealthView(View):
    status: Literal["ok", "ready"]


# -- jobs ------------------------------------------------------------------------------------


class InputView(View):
    name: str
    sha256: str
    kind: Literal["file", "dir"]


class ArtifactView(View):
    """A file a job left (under $BERTH_OUTPUT), kept in the artifact store."""

    path: str
    sha256: str
    size: int


class JobView(View):
    id: int
    state: str
    attempt: int
    max_attempts: int
    exit_code: int | None
    error: str
    worker: str | None
    tenant: str
    kind: str
    pool: str | None
    labels: list[str]
    device_policy: str
    priority: int
    timeout_seconds: float
    command: list[str]
    python: bool  # whether the job runs Python source (the source itself is not returned)
    python_sha256: str | None
    inputs: list[InputView]
    repo: str | None
    outputs: list[ArtifactView]
    metrics: dict[str, float]
    env: list[str]  # names only: values may be sensitive
    secrets: list[str]  # variable names bound to secrets
    created_by: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    waiting_for: str  # why a queued job has no lease yet ("" when shown in a listing)


class JobIdsView(View):
    """The answer to a batch submit (a list of jobs): their ids, in the order given."""

    ids: list[int]


class ChunkView(View, omit_defaults=True):
    """A piece of a job's output: `data` as text, or `b64` with `encoding=base64`."""

    id: int
    stream: Literal["stdout", "stderr"]
    data: str | None = None
    b64: str | None = None


class LogsView(View):
    """Output so far, and the job's state."""

    state: str
    exit_code: int | None
    chunks: list[ChunkView]


class LogEndView(View):
    """The last line of a followed output: how the job ended."""

    state: str
    exit_code: int | None
    error: str


# -- fleet -----------------------------------------------------------------------------------


class SlotsView(View):
    used: int
    total: int


class WorkerView(View):
    name: str
    pool: str
    state: str
    labels: list[str]
    tenants: list[str]  # those the caller may see named; [] serves every tenant
    seen_seconds_ago: float
    no_lease: str  # why it gets no lease now ("" when it could take one)
    load: float | None
    cpus: int | None
    free_memory_gb: float | None
    free_disk_gb: float | None
    gpus: list[str]
    slots: dict[str, SlotsView]
    parallel: int
    attached: bool
    python: str
    env_digest: str
    version: str


class WorkerStateView(View):
    """`state`: the word `worker list` shows now; `set`: the order given."""

    name: str
    state: str
    set: str


class RemovedView(View):
    """A worker or secret removed."""

    name: str
    removed: bool


class JoinTokenView(View):
    token: str  # shown once
    name: str
    pool: str
    labels: list[str]
    tenants: list[str]
    expires_at: datetime
    command: str  # paste-ready: runs the node


class LimitView(View, omit_defaults=True):
    key: str
    value: Any
    default: Any  # berth.toml's value; null when berth.toml has none
    reason: str
    set_by: str
    set_at: datetime
    in_force: bool
    not_in_force_because: str | None = None  # present when in_force is false


class LimitUnsetView(View):
    key: str
    unset: bool
    was: Any
    default: Any


class ProvisionerView(View):
    max: int
    idle_seconds: float
    provider: str
    workers: dict[str, int]  # by state
    failures: int
    last_error: str
    retry_in: float


class PoolStatusView(View):
    slots: dict[str, int]
    max_load: float
    min_memory_gb: float
    min_disk_gb: float
    provisioner: ProvisionerView | None
    workers: int
    limits: list[LimitView]


class PoolView(PoolStatusView):
    name: str


class QueuedView(View):
    pool: str | None
    kind: str
    jobs: int


class ServerView(View):
    id: str
    version: str


class StatusView(View):
    pools: dict[str, PoolStatusView]
    queued: list[QueuedView]
    running: int
    running_by_tenant: dict[str, int]
    limits: list[LimitView]
    server: ServerView


# -- tokens, secrets, audit ------------------------------------------------------------------


class TokenView(View):
    name: str
    kind: str
    tenants: list[str]
    created_by: str
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None


class CreatedTokenView(TokenView):
    token: str  # shown once


class RevokedTokenView(TokenView):
    yours: bool  # the caller revoked its own credential


class SecretSetView(View):
    name: str
    owners: list[str]


class SecretView(View):
    name: str
    tenant: str  # "*": every tenant's; "": the system's
    owner: str  # the tenant, "all tenants" or "system"
    created_by: str
    updated_at: datetime


class AuditEntryView(View):
    id: int
    at: datetime
    caller: str
    action: str
    target: str
    tenant: str | None
    request_id: str
    detail: dict[str, Any]
    seq: int | None  # its place in the sealed chain; null until sealed


# -- approvals -------------------------------------------------------------------------------


class ApprovalView(View):
    """One approval request; `approved` is what the asking job's call returns."""

    id: int
    job: int
    tenant: str
    pool: str
    title: str
    details: str
    state: str  # pending, approved, denied, timed_out (a denial) or closed (the lease ended)
    approved: bool
    policy: str  # four-eyes or any-member
    job_creator: str
    created_at: datetime
    deadline: datetime
    answered_by: str | None
    answered_at: datetime | None
    reason: str


# -- artifacts -------------------------------------------------------------------------------


class StoredView(View):
    """A blob kept in the artifact store."""

    sha256: str
    size: int
