"""Provisioned workers as Modal Sandboxes, one per worker, with the `modal` client library.

Contract:
- The `modal` module is passed in (production: the real one; tests: a stand-in with the same
  surface, checked against the installed package's signatures). Credentials are modal's own
  (`MODAL_TOKEN_ID`/`MODAL_TOKEN_SECRET` or ~/.modal.toml).
- Every sandbox belongs to the app `compute.app` (default `berth-workers`, created when missing),
  runs `berth <argv...>` in `Image.from_registry(compute.image)` (an image with berth in it), and
  gets the credential as a Modal Secret (`Secret.from_dict(spec.secret_env)`), never as `env`.
- Tags (the three `base.LABEL_*`, exact values) are given to `Sandbox.create`, so no sandbox ever
  runs untagged; `list` finds workers with `Sandbox.list(app_id=..., tags=...)`, which is how a new
  leader adopts them. The sandbox's name (unique among an app's running sandboxes) is derived from
  installation and worker, so a repeated start finds the one that runs instead of doubling it.
- `Sandbox.list` returns running sandboxes only; sandboxes this object started that have ended are
  reported from `poll()` (STOPPED on exit code 0, else FAILED with the code) until `stop`.
- `stop` terminates every sandbox tagged with the worker's name.
"""

import hashlib
import re
from types import ModuleType
from typing import Any

from service.config import Compute
from service.provisioning.providers.base import (
    LABEL_INSTALLATION,
    LABEL_POOL,
    LABEL_WORKER,
    Instance,
    InstanceState,
    ProviderError,
    WorkerSpec,
)

DEFAULT_APP = "berth-workers"
# Modal ends a sandbox at its timeout; a worker lives as long as the provisioner keeps it, so it
# gets the longest lifetime Modal allows (24 h) and the loop replaces it when it ends.
SANDBOX_TIMEOUT_SECONDS = 24 * 3600
_NAME = re.compile(r"[A-Za-z0-9._-]{1,63}")
_UNITS = {
    "": 1.0,  # a bare number is MiB, as Modal takes it
    "k": 1e3 / 2**20,
    "m": 1e6 / 2**20,
    "g": 1e9 / 2**20,
    "t": 1e12 / 2**20,
    "ki": 1 / 1024,
    "mi": 1.0,
    "gi": 1024.0,
    "ti": 1024.0**2,
}
_MEMORY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", re.IGNORECASE)


def sandbox_name(installation: str, worker: str) -> str:
    """A Modal object name (63 of `[A-Za-z0-9._-]`) unique per installation and worker."""
    digest = hashlib.sha256(f"{installation}/{worker}".encode()).hexdigest()
    name = f"berth-{digest[:8]}-{worker}"
    if _NAME.fullmatch(name):
        return name
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", worker)[:36].strip("-")
    return f"berth-{digest[:20]}-{cleaned}".rstrip("-")


def mebibytes(memory: str) -> int:
    """`"16Gi"`, `"16G"`, `"512Mi"`, `"2048"` (MiB) -> MiB, as `Sandbox.create(memory=)` wants."""
    match = _MEMORY.fullmatch(memory)
    if match is None:
        raise ProviderError(f"modal: compute.memory {memory!r} is not a size like 16Gi or 512M")
    number, unit = match.groups()
    return max(1, round(float(number) * _UNITS[(unit or "").lower()]))


def _cores(cpu: str) -> float:
    try:
        return float(cpu)
    except ValueError:
        raise ProviderError(f"modal: compute.cpu {cpu!r} is not a number of cores") from None


class ModalProvider:
    """A Sandbox per worker in one Modal app."""

    def __init__(self, compute: Compute, *, modal: ModuleType) -> None:
        if not isinstance(compute.image, str) or not compute.image:
            raise ProviderError("modal: compute.image is required (an image with berth in it)")
        self._compute = compute
        self._modal = modal
        self._app_name = compute.app if isinstance(compute.app, str) else DEFAULT_APP
        self._app: Any = None
        self._started: dict[str, tuple[WorkerSpec, Any]] = {}  # name -> (spec, sandbox)

    async def _app_handle(self) -> Any:  # noqa: ANN401  (modal's App)
        if self._app is None:
            self._app = await self._modal.App.lookup.aio(self._app_name, create_if_missing=True)
        return self._app

    async def _sandboxes(self, tags: dict[str, str]) -> list[Any]:
        app = await self._app_handle()
        return [
            sandbox async for sandbox in self._modal.Sandbox.list.aio(app_id=app.app_id, tags=tags)
        ]

    async def start(self, spec: WorkerSpec) -> Instance:
        try:
            running = await self._sandboxes(
                {LABEL_INSTALLATION: spec.installation, LABEL_WORKER: spec.name}
            )
            if running:
                return Instance(spec.name, spec.pool, running[0].object_id, InstanceState.RUNNING)
            sandbox = await self._create(spec)
        except self._modal.exception.AlreadyExistsError:
            # Started meanwhile under the same name (a retried start): adopt that one.
            return await self._adopt(spec)
        except self._modal.exception.Error as exc:
            raise ProviderError(f"modal: start {spec.name}: {exc}") from None
        self._started[spec.name] = (spec, sandbox)
        return Instance(spec.name, spec.pool, sandbox.object_id, InstanceState.RUNNING)

    async def _create(self, spec: WorkerSpec) -> Any:  # noqa: ANN401  (modal's Sandbox)
        modal, compute = self._modal, self._compute
        return await modal.Sandbox.create.aio(
            "berth",
            *spec.argv,
            app=await self._app_handle(),
            name=sandbox_name(spec.installation, spec.name),
            tags=dict(spec.labels),
            image=modal.Image.from_registry(compute.image),
            env=spec.plain_env(compute.env),
            secrets=[modal.Secret.from_dict(dict(spec.secret_env))],
            timeout=SANDBOX_TIMEOUT_SECONDS,
            gpu=compute.gpu if isinstance(compute.gpu, str) else None,
            region=compute.region if isinstance(compute.region, str) else None,
            cpu=_cores(compute.cpu) if isinstance(compute.cpu, str) else None,
            memory=mebibytes(compute.memory) if isinstance(compute.memory, str) else None,
        )

    async def _adopt(self, spec: WorkerSpec) -> Instance:
        try:
            running = await self._sandboxes(
                {LABEL_INSTALLATION: spec.installation, LABEL_WORKER: spec.name}
            )
        except self._modal.exception.Error as exc:
            raise ProviderError(f"modal: start {spec.name}: {exc}") from None
        if not running:
            raise ProviderError(f"modal: a sandbox named for {spec.name} exists but is not listed")
        return Instance(spec.name, spec.pool, running[0].object_id, InstanceState.RUNNING)

    async def stop(self, name: str) -> None:
        try:
            targets = await self._sandboxes({LABEL_WORKER: name})
            _, mine = self._started.pop(name, (None, None))
            if mine is not None:
                targets.append(mine)
            for sandbox in targets:
                await sandbox.terminate.aio()  # a no-op for one that has ended
        except self._modal.exception.Error as exc:
            raise ProviderError(f"modal: stop {name}: {exc}") from None

    async def close(self) -> None:
        """Nothing to release: modal's client is shared by the process and closes with it."""

    # Last in the class: below it, `list` would name this method, not the builtin.
    async def list(self, *, installation: str, pool: str | None = None) -> list[Instance]:
        tags = {LABEL_INSTALLATION: installation}
        if pool is not None:
            tags[LABEL_POOL] = pool
        instances: list[Instance] = []
        try:
            for sandbox in await self._sandboxes(tags):
                labels = await sandbox.get_tags.aio()
                code = await sandbox.poll.aio()
                instances.append(_instance(labels, sandbox.object_id, code))
            listed = {instance.name for instance in instances}
            for name, (spec, sandbox) in self._started.items():
                if name in listed or spec.installation != installation:
                    continue
                if pool is None or spec.pool == pool:
                    code = await sandbox.poll.aio()
                    instances.append(_instance(spec.labels, sandbox.object_id, code))
        except self._modal.exception.Error as exc:
            raise ProviderError(f"modal: list: {exc}") from None
        return instances


def _instance(labels: dict[str, str], sandbox_id: str, code: int | None) -> Instance:
    name, pool = labels.get(LABEL_WORKER, ""), labels.get(LABEL_POOL, "")
    if code is None:
        return Instance(name, pool, sandbox_id, InstanceState.RUNNING)
    if code == 0:
        return Instance(name, pool, sandbox_id, InstanceState.STOPPED, "exited with code 0")
    return Instance(name, pool, sandbox_id, InstanceState.FAILED, f"exited with code {code}")
