"""The provisioning loop: on the leader, one idempotent pass at a time (SPEC section 8).

Each pass reads the config in force (berth.toml with limits), then for each provisioned pool:

1. reconciles the provider's list of its workers (by the installation's label) with the rows in
   Postgres: a worker the provider confirms ended frees its leases at once; one that ended
   before it ever attached is a failed start (the pool backs off, saying why); one running with
   no row is an orphan and is stopped; a drained one holding nothing is stopped;
2. plans (core/provisioning.plan) and acts: drains what idles or exceeds `max`, and starts what
   the queue needs, each start recorded in Postgres (with its join token) before the provider
   is called.

A leader killed anywhere in a pass leaves rows and workers the next leader reconciles: nothing
is started twice (a row per name, counted under a lock) and nothing is left running unseen.
"""

from pathlib import Path

import structlog

from service.background.loop import Loop
from service.config import Config, Pool
from service.core import provisioning as plans
from service.core.errors import BerthError
from service.db.engine import Database
from service.domain import limits, provisioning, secrets
from service.provisioning.providers import open_provider
from service.provisioning.providers.base import (
    Instance,
    InstanceState,
    Provider,
    ProviderError,
    WorkerSpec,
)

log = structlog.get_logger(__name__)

LIST_GRACE = 15.0  # a row may precede its worker in the provider's list this long
ATTACH_TIMEOUT = 600.0  # a started worker that has not attached by then is a failed start
ENDED = (InstanceState.STOPPED, InstanceState.FAILED)


class Provision(Loop):
    name = "provision"

    def __init__(
        self,
        db: Database,
        config: Config,
        *,
        home: Path,
        server_url: str,
        secret_key: bytes,
        interval: float,
    ) -> None:
        super().__init__(interval=interval)
        self._db = db
        self._config = config
        self._home = home
        self._server_url = server_url
        self._secret_key = secret_key
        self._providers: dict[str, tuple[object, Provider]] = {}  # pool -> (its compute, it)

    async def run_once(self) -> None:
        cfg = await limits.effective_config(self._db, self._config)
        pools = provisioning.provisioned_pools(cfg)
        if not pools:
            return
        picture = await provisioning.picture(self._db, cfg)
        for name, pool in pools.items():
            try:
                provider = self._provider(name, pool)
                await self._pool_pass(cfg, name, pool, provider, picture)
            except ProviderError as exc:  # the provider is unreachable or refuses: say so
                log.warning("provision_pass_failed", pool=name, error=str(exc))

    def _provider(self, name: str, pool: Pool) -> Provider:
        assert pool.provisioner is not None
        compute = pool.provisioner.compute
        cached = self._providers.get(name)
        if cached is None or cached[0] != compute:
            provider = open_provider(compute, home=self._home, secret_key=self._secret_key)
            cached = (compute, provider)
            self._providers[name] = cached
        return cached[1]

    async def _pool_pass(
        self, cfg: Config, name: str, pool: Pool, provider: Provider, picture: provisioning.Picture
    ) -> None:
        rows = [r for r in picture.alive if r["pool"] == name]
        listed = await provider.list(installation=picture.installation, pool=name)
        instances = {i.name: i for i in listed}
        for row in rows:
            await self._reconcile(name, row, instances.get(row["name"]), provider)
        for instance in listed:
            if instance.state not in ENDED and instance.name not in {r["name"] for r in rows}:
                await self._orphan(instance, provider)
        plan = plans.plan(picture.pools[name])
        if plan.drain:
            log.info("provision_draining", pool=name, workers=list(plan.drain))
            await provisioning.drain(self._db, list(plan.drain))
        if plan.waiting_on_backoff:
            log.info("provision_backing_off", pool=name)
        for _ in range(plan.start):
            if not await self._start(cfg, name, pool, provider, picture.installation):
                break

    async def _reconcile(
        self, pool: str, row: dict[str, object], instance: Instance | None, provider: Provider
    ) -> None:
        name = str(row["name"])
        age = float(row["age"])  # type: ignore[arg-type]
        if instance is None or instance.state in ENDED:
            if instance is None and row["state"] == "starting" and age < LIST_GRACE:
                return  # just recorded; the provider may not list it yet
            detail = instance.detail if instance is not None else "no longer running"
            if row["state"] == "starting" and row["worker_id"] is None:
                await provisioning.start_failed(
                    self._db,
                    name=name,
                    pool=pool,
                    reason=f"{name} ended before attaching: {detail}",
                )
                return
            state = (
                "failed"
                if instance is not None and instance.state is InstanceState.FAILED
                else "stopped"
            )
            await provisioning.gone(self._db, name=name, state=state, detail=detail)
            return
        if row["state"] == "starting" and row["attached"]:
            await provisioning.running(self._db, name=name, pool=pool)
        elif row["state"] == "starting" and age > ATTACH_TIMEOUT:
            await provider.stop(name)
            await provisioning.start_failed(
                self._db,
                name=name,
                pool=pool,
                reason=f"{name} did not attach within {ATTACH_TIMEOUT:g}s: {instance.detail}",
            )
        elif row["state"] == "draining" and not row["live"]:
            await provider.stop(name)  # drained and holding nothing (it may have exited already)

    async def _orphan(self, instance: Instance, provider: Provider) -> None:
        """A worker of ours with no row alive: stop it (re-checked: a start may be underway)."""
        if await provisioning.is_alive(self._db, instance.name):
            return
        log.warning("provision_orphan_stopped", worker=instance.name, pool=instance.pool)
        await provider.stop(instance.name)

    async def _start(
        self, cfg: Config, name: str, pool: Pool, provider: Provider, installation: str
    ) -> bool:
        """Record, then start, one worker; False when no more should start this pass."""
        prov = pool.provisioner
        assert prov is not None
        token_mode = cfg.network.auth == "token"
        recorded = await provisioning.record_start(
            self._db,
            pool=name,
            provider=prov.compute.provider,
            most=prov.max,
            labels=prov.labels,
            join=token_mode,
        )
        if recorded is None:
            return False
        worker, join_token = recorded
        try:
            spec = await self._spec(cfg, name, pool, worker, join_token, installation)
            started = await provider.start(spec)
        except (ProviderError, BerthError) as exc:
            reason = exc.message if isinstance(exc, BerthError) else str(exc)
            await provisioning.start_failed(self._db, name=worker, pool=name, reason=reason)
            return False
        await provisioning.started(self._db, worker, started.provider_id)
        log.info("provision_started", pool=name, worker=worker, provider_id=started.provider_id)
        return True

    async def _spec(  # noqa: PLR0917  (the parts of one worker's spec)
        self, cfg: Config, name: str, pool: Pool, worker: str, join_token: str, installation: str
    ) -> WorkerSpec:
        prov = pool.provisioner
        assert prov is not None
        url = cfg.network.url or self._server_url
        argv = ["worker", "--server", url, "--orphan-exit-seconds", f"{prov.orphan_exit_seconds:g}"]
        env: dict[str, str] = {}
        if prov.compute.provider == "process":
            env["BERTH_HOME"] = str(self._home / "provisioned" / worker)  # state of its own
        if join_token:
            secret_env = {"BERTH_JOIN_TOKEN": join_token}  # binds pool, labels and name
        else:
            # Behind a proxy: the shared credential the worker rule matches, and its name.
            shared = await secrets.system_value(self._db, self._secret_key, prov.credential_secret)
            secret_env = {"BERTH_TOKEN": shared}
            argv += ["--pool", name, "--name", worker]
            if prov.labels:
                argv += ["--labels", ",".join(prov.labels)]
        return WorkerSpec(
            name=worker,
            pool=name,
            installation=installation,
            argv=tuple(argv),
            env=env,
            secret_env=secret_env,
        )

    async def close(self) -> None:
        for _, provider in self._providers.values():
            await provider.close()
