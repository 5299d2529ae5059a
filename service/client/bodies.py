"""What a job submit sends: only the fields the caller set, so the server's defaults apply.

The server checks every bound and names the field at fault (`ApiError.field`); these Structs
only say the names and types.
"""

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType


class InputRequest(msgspec.Struct, kw_only=True):
    """A file or directory already in the artifact store, fetched into the job's folder."""

    name: str
    sha256: str
    kind: Literal["file", "dir"] = "file"


class JobRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One job: `command` (argv) or `python` (source); everything else as the server defaults."""

    command: list[str] | UnsetType = UNSET
    python: str | UnsetType = UNSET
    env: dict[str, str] | UnsetType = UNSET
    kind: str | UnsetType = UNSET
    pool: str | UnsetType = UNSET
    labels: list[str] | UnsetType = UNSET
    device_policy: Literal["require", "prefer"] | UnsetType = UNSET
    timeout_seconds: float | UnsetType = UNSET
    max_attempts: int | UnsetType = UNSET
    priority: int | UnsetType = UNSET
    tenant: str | UnsetType = UNSET
    secrets: dict[str, str] | UnsetType = UNSET  # variable -> secret name
    inputs: list[InputRequest] | UnsetType = UNSET
    repo: str | UnsetType = UNSET  # URL[@REV]
    # Resources; unset: the pool's default (nothing without a pool)
    cpus: float | UnsetType = UNSET
    memory_mb: int | UnsetType = UNSET
    gpus: int | UnsetType = UNSET
