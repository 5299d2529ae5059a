"""The interface every provider implements, and the values that cross it.

A provider knows how to start one `berth worker` somewhere, stop it, and list the ones it
runs for an installation. It knows nothing of jobs, leases or Postgres: the provisioning loop
decides, the provider acts. Every method is idempotent: starting a name that runs, or stopping
one that is gone, is not an error.
"""

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

# Defined with the other expected failures (core.errors.EXPECTED); providers import it from here.
from service.core.errors import ProviderError as ProviderError  # noqa: PLC0414  (re-export)

# Labels (Kubernetes labels, Modal tags, process markers) that name what a worker belongs to.
LABEL_INSTALLATION = "berth.dev/installation"
LABEL_POOL = "berth.dev/pool"
LABEL_WORKER = "berth.dev/worker"


class InstanceState(enum.StrEnum):
    STARTING = "starting"  # accepted by the provider, not yet running (pending pod, booting)
    RUNNING = "running"
    STOPPED = "stopped"  # ended (exited, deleted, succeeded): its leases are free
    FAILED = "failed"  # ended with an error (bad image, crash): detail says which


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One worker to start.

    `argv` are the arguments after `berth` (e.g. `worker --server URL --pool gpu ...`); the
    provider runs them with the berth it has (this interpreter, the image's `berth`).
    `secret_env` holds the credential (BERTH_JOIN_TOKEN, or BERTH_TOKEN behind a proxy): a
    provider must keep it out of anything shown in clear (a Kubernetes Secret, a Modal Secret,
    the child's environment only).
    """

    name: str
    pool: str
    installation: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, str] = field(default_factory=dict)

    def plain_env(self, pool_env: object) -> dict[str, str]:
        """The pool's compute env (when a table) under this worker's env, in clear.

        Without the names the credential uses: a credential is never shadowed by a literal.
        """
        merged = {**(pool_env if isinstance(pool_env, dict) else {}), **self.env}
        return {key: value for key, value in merged.items() if key not in self.secret_env}

    @property
    def labels(self) -> dict[str, str]:
        return {
            LABEL_INSTALLATION: self.installation,
            LABEL_POOL: self.pool,
            LABEL_WORKER: self.name,
        }


@dataclass(frozen=True, slots=True)
class Instance:
    """A worker as the provider sees it."""

    name: str  # the berth worker name (LABEL_WORKER)
    pool: str
    provider_id: str  # pid, pod name, sandbox id
    state: InstanceState
    detail: str = ""  # why it failed or is not running yet, in the provider's words


class Provider(Protocol):
    """Start, stop and list workers of one installation. Idempotent, safe to retry."""

    async def start(self, spec: WorkerSpec) -> Instance:
        """Start `spec`; raise ProviderError with the reason when the provider refuses."""
        ...

    async def stop(self, name: str) -> None:
        """Stop the worker called `name` (TERM, then kill); nothing when it is gone."""
        ...

    async def list(self, *, installation: str, pool: str | None = None) -> list[Instance]:
        """Every worker this provider runs (or ran and still knows of) for the installation."""
        ...

    async def close(self) -> None:
        """Release clients and connections."""
        ...
