"""Frozen records that queries return. Never ORM instances: nothing lazy-loads after a query."""

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Self

from sqlalchemy import Row

_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:  # dataclasses.fields() is slow: once per record type
        names = _NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


@dataclass(frozen=True, slots=True)
class Record:
    @classmethod
    def of(cls, row: Row[Any] | Any) -> Self:  # noqa: ANN401  (any Row shape)
        m = row._mapping
        return cls(**{name: m[name] for name in _names(cls)})


@dataclass(frozen=True, slots=True)
class TokenRecord(Record):
    id: int
    name: str
    kind: str
    tenants: list[str]
    created_by: str
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None
    pool: str | None  # bound by a join token; None: the worker names its pool
    labels: list[str] | None
    rotated_at: datetime | None


@dataclass(frozen=True, slots=True)
class JobRecord(Record):
    id: int
    tenant: str
    state: str
    kind: str
    pool: str | None
    labels: list[str]
    device_policy: str
    command: list[str]
    python: str
    python_sha256: str
    env: dict[str, str]
    inputs: list[dict[str, str]]
    repo: str
    outputs: list[dict[str, Any]]
    metrics: dict[str, float]
    secrets: dict[str, str]
    timeout_seconds: float
    max_attempts: int
    attempt: int
    priority: int
    cpus: float  # what it asked for (SPEC section 4, "Resources"); 0: nothing
    memory_mb: int
    gpus: int
    worker: str | None
    exit_code: int | None
    error: str
    created_by: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class WorkerRecord(Record):
    id: str
    name: str
    identity: str  # the credential that attached it (token:<id> or proxy:<rule digest>)
    pool: str
    state: str
    liveness: str
    instance: str
    server_id: str | None
    labels: list[str]
    tenants: list[str]  # [] serves every tenant
    parallel: int
    host: dict[str, Any]
    capacity: dict[str, Any]  # what it declared: cpus, memory_mb, gpus ({}: nothing)
    python: str
    env_digest: str
    version: str
    attached_at: datetime
    last_seen_at: datetime
    seen_seconds_ago: float


@dataclass(frozen=True, slots=True)
class OutputChunk(Record):
    id: int
    stream: str
    data: bytes


@dataclass(frozen=True, slots=True)
class ApprovalRecord(Record):
    id: int
    job_id: int
    epoch: int
    tenant: str
    pool: str
    title: str
    details: str
    state: str  # pending | approved | denied | timed_out | closed
    policy: str  # four-eyes | any-member
    job_creator: str
    created_at: datetime
    deadline: datetime
    answered_by: str | None
    answered_at: datetime | None
    reason: str
