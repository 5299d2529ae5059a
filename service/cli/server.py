"""The running server, one asyncio program.

uvicorn, the hub, LISTEN, the leader's loops and the built-in worker, stopped together on
SIGTERM/SIGINT.
"""

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import structlog
import uvicorn
import uvloop

from service import __version__, log
from service.api import limits_watch
from service.api.app import create_app
from service.api.runtime import Runtime
from service.background.audit_seal import SealAudit
from service.background.cas_gc import CollectArtifacts
from service.background.output_pack import PackOutput
from service.background.provision import Provision
from service.background.silence import ExpireSilent
from service.background.supervisor import run_when_leader
from service.cli.client import CliError, remove_server_url, write_server_url
from service.cli.database import database_errors
from service.config import Config, home
from service.core.errors import Unavailable
from service.core.exits import Exit
from service.db import migrate, notify
from service.db.embedded import Embedded, private_home, write_private
from service.db.engine import Database
from service.db.leader import Leader
from service.db.queries.jobs import JOBS_CHANNEL
from service.db.queries.limits import LIMITS_CHANNEL
from service.db.queries.workers import WORKERS_CHANNEL
from service.domain import artifacts, secrets, tokens
from service.worker import hardening, jobusers
from service.worker import main as worker_main

logger = structlog.get_logger("berth.serve")


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # berth handles SIGTERM/SIGINT itself, to stop every part in order


def main(
    cfg: Config,
    *,
    host: str,
    port: int,
    builtin_worker: bool,
    log_level: str = "info",
    log_json: bool | None = None,
) -> int:
    log.configure(log_level, json=log_json)
    # Jobs of the built-in worker may run as this user (a server that is not root): they must
    # not read this process's environment (BERTH_DATABASE_URL, BERTH_SECRET_KEY) or memory.
    hardening.undumpable()
    berth_home = home()
    private_home(berth_home)
    embedded: Embedded | None = None
    url = cfg.database.url
    with database_errors():
        if not url:
            embedded = Embedded(berth_home)
            url = embedded.url
            migrate.upgrade(url)
        try:
            # uvloop: the server is all socket I/O (workers, clients, Postgres); uvloop halves
            # its cost.
            return uvloop.run(_serve(cfg, url, host, port, berth_home, builtin_worker))
        finally:
            if embedded is not None:
                embedded.stop()


async def _serve(  # noqa: PLR0917  (called once, from main)
    cfg: Config, url: str, host: str, port: int, berth_home: Path, builtin_worker: bool
) -> int:
    if not await migrate.is_current(url):
        raise CliError(
            "the database is not migrated to this berth's schema: run `berth db upgrade` first"
        )
    db = Database(url)
    rt = Runtime(
        config=cfg,
        db=db,
        server_id=uuid.uuid4().hex,
        version=__version__,
        pools=cfg.pool_specs(),
        secret_key=secrets.load_key(berth_home),
    )
    cas = rt.cas = artifacts.open_server_store(cfg, home=berth_home, secret_key=rt.secret_key)
    # server_url "": a worker reaches a local store through the server it dialled, whichever.
    rt.cas_access = await artifacts.access(cfg, cas, server_url="", secret_key=rt.secret_key)
    app = create_app(rt)
    hub = rt.the_hub()
    try:  # the limits in force before the first dispatch pass
        await limits_watch.refresh(rt)
    except Unavailable as exc:
        raise CliError(f"cannot read the limits: {exc.message}", Exit.UNREACHABLE) from None
    limits = limits_watch.Watch(rt)
    admin = await tokens.ensure_admin(db)
    if admin is not None:
        path = write_private(berth_home / "admin.token", admin + "\n")
        print(f"admin token (shown once, also in {path}):\n{admin}", flush=True)
    tls = cfg.network.tls
    certfile, keyfile = (None, None) if isinstance(tls, str) else (tls.cert, tls.key)
    server = _Uvicorn(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            lifespan="off",
            ws_max_size=64 << 20,
            ws_per_message_deflate=False,  # small JSON frames: deflate costs more than it saves
            http="httptools",
            ssl_certfile=certfile,
            ssl_keyfile=keyfile,
        )
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    logger.info("serving", listen=f"{host}:{port}", server_id=rt.server_id, pid=os.getpid())
    scheme = "https" if certfile else "http"
    provision = Provision(
        db,
        cfg,
        home=berth_home,
        server_url=f"{scheme}://{_dial(host)}:{port}",
        secret_key=rt.secret_key,
        interval=cfg.executor.loop_seconds,
    )
    async with asyncio.TaskGroup() as tg:
        web = tg.create_task(server.serve(), name="http")
        tg.create_task(hub.run(stop), name="hub")
        tg.create_task(limits.run(stop), name="limits")

        def reconnected() -> None:  # notifications sent while LISTEN was down are lost
            hub.poke()
            limits.poke()

        tg.create_task(
            notify.listen(
                url,
                {
                    JOBS_CHANNEL: lambda _p: hub.poke(),
                    WORKERS_CHANNEL: hub.on_worker_notice,
                    LIMITS_CHANNEL: lambda _p: limits.poke(),
                },
                stop,
                on_reconnect=reconnected,
            ),
            name="listen",
        )
        tg.create_task(
            run_when_leader(
                Leader(url),
                [
                    ExpireSilent(db, cfg.executor),
                    SealAudit(db, rt.secret_key, interval=cfg.executor.loop_seconds),
                    CollectArtifacts(db, cas, interval=cfg.cas.gc_seconds),
                    PackOutput(
                        db,
                        cas.store,
                        tail_kb=cfg.executor.output_tail_kb,
                        interval=cfg.executor.pack_seconds,
                    ),
                    provision,
                ],
                stop,
            ),
            name="leader",
        )
        listening = tg.create_task(_listening(server, scheme, host, stop), name="listening")
        if builtin_worker:
            tg.create_task(
                _builtin_worker(
                    rt,
                    listening=listening,
                    cafile=certfile or "",
                    berth_home=berth_home,
                    stop=stop,
                ),
                name="builtin-worker",
            )
        told = tg.create_task(
            _tell_cli(
                listening, berth_home, stop, known=_written_now(berth_home, scheme, host, port)
            ),
            name="server-url",
        )
        await stop.wait()
        logger.info("stopping")
        server.should_exit = True
        await web
        await told
    await provision.close()  # provisioned workers run on: the next leader adopts them
    await cas.store.aclose()
    await db.dispose()
    return 0


async def _listening(server: uvicorn.Server, scheme: str, host: str, stop: asyncio.Event) -> str:
    """The URL this server answers at on this machine, once it listens ("" if it never did)."""
    while not server.started and not stop.is_set():  # noqa: ASYNC110  (uvicorn offers no event)
        await asyncio.sleep(0.05)
    if not server.started:
        return ""
    # The bound port, not the asked one: `--listen 127.0.0.1:0` picks a free port.
    port = server.servers[0].sockets[0].getsockname()[1]
    return f"{scheme}://{_dial(host)}:{port}"


def _written_now(berth_home: Path, scheme: str, host: str, port: int) -> str:
    """Write $BERTH_HOME/server.url before the server answers, when its port is known already.

    So a CLI started once `/readyz` answers (`serve --detach`, a script) finds it. "" when the
    port is picked at bind time (`--listen HOST:0`): written once it listens.
    """
    if not port:
        return ""
    url = f"{scheme}://{_dial(host)}:{port}"
    path = write_server_url(berth_home, url)
    logger.info("server_url_written", path=str(path), url=url)
    return url


async def _tell_cli(
    listening: "asyncio.Task[str]", berth_home: Path, stop: asyncio.Event, *, known: str
) -> None:
    """$BERTH_HOME/server.url says where this server listens while it runs (SPEC section 2)."""
    url = known or await listening
    if not url:
        return
    if not known:
        path = await asyncio.to_thread(write_server_url, berth_home, url)
        logger.info("server_url_written", path=str(path), url=url)
    await stop.wait()
    # Only if still ours: a second server on this home may have written its own since.
    await asyncio.to_thread(remove_server_url, berth_home, url)


def _dial(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):  # noqa: S104  (what to dial when listening everywhere)
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


async def _builtin_worker(
    rt: Runtime,
    *,
    listening: "asyncio.Task[str]",
    cafile: str,
    berth_home: Path,
    stop: asyncio.Event,
) -> None:
    """The `serve` pool's worker: a fresh token each start (the old one is revoked)."""
    url = await listening
    if not url:
        return
    with contextlib.suppress(Exception):
        await tokens.revoke(rt.db, tokens.SYSTEM, name="serve")
    token, _ = await tokens.create(
        rt.db, tokens.SYSTEM, name="serve", kind="worker", tenants=[], expires_days=3650
    )
    rt.builtin_token = token
    worker_home = berth_home / "serve-worker"
    worker_home.mkdir(mode=0o700, exist_ok=True)
    worker = worker_main.Worker(
        worker_main.Options(
            server=url,
            token=token,
            pool="serve",
            home=worker_home,
            python=jobusers.job_python(sys.executable),
            cafile=cafile,
        )
    )
    task = asyncio.create_task(worker.run())
    await stop.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    await worker._stop_all("server stopping")
