"""What `berth serve` runs (cli/serve.py parses and starts it): the server, one asyncio program.

uvicorn, the hub, LISTEN, the leader's loops and the built-in worker, stopped together on
SIGTERM/SIGINT. A side task that fails with anything but an expected error (a leader loop after
`executor.loop_max_failures` passes in a row) stops them all: the tracebacks are in the log and
`berth serve` exits 200 (docs/architecture.md, Errors).
"""

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import structlog
import uvicorn
import uvloop
from litestar import Litestar

from service import __version__, log
from service.api.app import create_app
from service.api.assembly import assemble
from service.api.followers import JOB_EVENTS_CHANNEL
from service.api.runtime import Runtime
from service.background.approvals import SettleApprovals
from service.background.audit_seal import SealAudit
from service.background.cas_gc import CollectArtifacts
from service.background.loop import LoopFailed
from service.background.output_pack import PackOutput
from service.background.provision import Provision
from service.background.silence import ExpireSilent
from service.background.supervisor import run_when_leader
from service.cli.client import CliError, remove_server_url, write_server_url
from service.cli.ops_db import database_errors
from service.cli.processes import reuse_port_socket
from service.config import Config, home
from service.core.errors import BerthError, Unavailable
from service.core.exits import Exit
from service.db import migrate, notify
from service.db.embedded import Embedded, private_home, write_private
from service.db.engine import Database
from service.db.leader import Leader
from service.db.queries.jobs import JOBS_CHANNEL
from service.db.queries.limits import LIMITS_CHANNEL
from service.db.queries.workers import WORKERS_CHANNEL
from service.domain import secrets, tokens
from service.domain.artifacts import server_store
from service.worker import credential, hardening, jobusers
from service.worker import main as worker_main

logger = structlog.get_logger("berth.serve")


@dataclass(frozen=True)
class Listen:
    """Where this server listens; `--processes N` starts its servers with reuse_port."""

    host: str
    port: int
    reuse_port: bool = False  # bind with SO_REUSEPORT: other servers share the port
    primary: bool = True  # writes server.url, mints the first admin token


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
    reuse_port: bool = False,
    primary: bool = True,
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
        try:
            if embedded is not None:
                migrate.upgrade(url)
            # uvloop: the server is all socket I/O (workers, clients, Postgres); uvloop halves
            # its cost.
            listen = Listen(host, port, reuse_port=reuse_port, primary=primary)
            return uvloop.run(_serve(cfg, url, listen, berth_home, builtin_worker, embedded))
        finally:
            if embedded is not None:
                embedded.stop()


async def _serve(  # noqa: PLR0917  (called once, from main)
    cfg: Config,
    url: str,
    listen: "Listen",
    berth_home: Path,
    builtin_worker: bool,
    embedded: Embedded | None,
) -> int:
    await _check_migrated(url)
    secret_key = secrets.load_key(berth_home)
    # signs the audit entries this server writes. 20 kept: a server under 16 concurrent
    # clients plus its own loops no longer opens and closes overflow connections all along
    # (each a TLS handshake, authentication and the driver's type set-up).
    db = Database(url, pool_size=20, max_overflow=10, secret_key=secret_key)
    builtin_home = berth_home / "builtin" / _listen_key(listen.host, listen.port)
    builtin_token = await _builtin_credential(db, builtin_home) if builtin_worker else ""
    cas = server_store.open_server_store(cfg, home=berth_home, secret_key=secret_key)
    rt = assemble(
        cfg,
        db,
        server_id=uuid.uuid4().hex,
        version=__version__,
        secret_key=secret_key,
        builtin_token=builtin_token,
        cas=cas,
        # server_url "": a worker reaches a local store through the server it dialled, whichever.
        cas_access=await server_store.access(cfg, cas, server_url="", secret_key=secret_key),
        embedded=embedded,
    )
    app = create_app(rt)
    hub, limits = rt.hub, rt.limits_watch
    await _before_serving(rt, berth_home, primary=listen.primary)
    server, certfile = _http_server(app, cfg, listen.host, listen.port)
    sockets = [reuse_port_socket(listen.host, listen.port)] if listen.reuse_port else None
    stop = _stop_on_signals()
    logger.info(
        "serving", listen=f"{listen.host}:{listen.port}", server_id=rt.server_id, pid=os.getpid()
    )
    scheme = "https" if certfile else "http"
    rt.metrics.watch(leader=(leader := Leader(url)).holds)
    provision = Provision(
        db,
        cfg,
        home=berth_home,
        server_url=f"{scheme}://{_dial(listen.host)}:{listen.port}",
        secret_key=secret_key,
        interval=cfg.executor.loop_seconds,
    )
    try:
        async with asyncio.TaskGroup() as tg:
            web = tg.create_task(server.serve(sockets=sockets), name="http")
            if embedded is not None:  # Postgres is ours to keep up: it comes back when it dies
                tg.create_task(
                    embedded.supervise(
                        stop,
                        check_seconds=cfg.database.embedded_check_seconds,
                        max_backoff_seconds=cfg.database.embedded_restart_max_seconds,
                    ),
                    name="embedded-postgres",
                )
            tg.create_task(hub.run(stop), name="hub")
            tg.create_task(limits.run(stop), name="limits")

            def reconnected() -> None:  # notifications sent while LISTEN was down are lost
                hub.poke()
                limits.poke()
                rt.followers.wake_all()

            tg.create_task(
                notify.listen(
                    url,
                    {
                        JOBS_CHANNEL: lambda _p: hub.poke(),
                        WORKERS_CHANNEL: hub.on_worker_notice,
                        LIMITS_CHANNEL: lambda _p: limits.poke(),
                        JOB_EVENTS_CHANNEL: rt.followers.on_notice,
                    },
                    stop,
                    on_reconnect=reconnected,
                ),
                name="listen",
            )
            loops = [
                ExpireSilent(db, cfg.executor),
                SettleApprovals(db, interval=cfg.executor.loop_seconds),
                SealAudit(db, secret_key, home=berth_home, interval=cfg.executor.loop_seconds),
                CollectArtifacts(db, cas, interval=cfg.cas.gc_seconds),
                PackOutput(
                    db,
                    cas.store,
                    tail_kb=cfg.executor.output_tail_kb,
                    interval=cfg.executor.pack_seconds,
                ),
                provision,
            ]
            tg.create_task(
                run_when_leader(leader, loops, stop, max_failures=cfg.executor.loop_max_failures),
                name="leader",
            )
            listening = tg.create_task(
                _listening(server, scheme, listen.host, stop), name="listening"
            )
            if builtin_worker:
                tg.create_task(
                    _builtin_worker(
                        token=builtin_token,
                        listening=listening,
                        cafile=certfile or "",
                        home=builtin_home,
                        stop=stop,
                    ),
                    name="builtin-worker",
                )
            told = tg.create_task(
                _tell_cli(listening, berth_home, stop, listen=listen, scheme=scheme),
                name="server-url",
            )
            await stop.wait()
            logger.info("stopping")
            server.should_exit = True
            rt.followers.close()  # end the event streams, or uvicorn waits for their jobs to end
            await web
            await told
    except ExceptionGroup as group:
        raise _stopped(group) from None
    finally:
        await provision.close()  # provisioned workers run on: the next leader adopts them
        await cas.store.aclose()
        await db.dispose()
    return 0


async def _before_serving(rt: Runtime, berth_home: Path, *, primary: bool) -> None:
    """The limits in force before the first dispatch pass; the first admin token, once.

    Of the servers of `--processes N`, only the first mints it.
    """
    try:
        await rt.limits_watch.refresh()
    except Unavailable as exc:
        raise CliError(f"cannot read the limits: {exc.message}", Exit.UNREACHABLE) from None
    admin = await tokens.ensure_admin(rt.db) if primary else None
    if admin is not None:
        path = write_private(berth_home / "admin.token", admin + "\n")
        print(f"admin token (shown once, also in {path}):\n{admin}", flush=True)


def _stop_on_signals() -> asyncio.Event:
    """An event that SIGTERM and SIGINT set: every part stops on it, in order."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _stopped(group: ExceptionGroup) -> CliError:
    """The one line `berth serve` ends with when a side task failed; the log has the rest."""
    failed = list(_leaves(group))
    for exc in failed:
        if not isinstance(exc, LoopFailed):  # a loop logged each of its failures already
            logger.error("server_task_failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
    first = failed[0]
    what = str(first) if isinstance(first, LoopFailed) else f"{type(first).__name__}: {first}"
    return CliError(f"the server stopped: {what} (the traceback is in the log)", Exit.BUG)


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


async def _check_migrated(url: str) -> None:
    if not await migrate.is_current(url):
        raise CliError(
            "the database is not migrated to this berth's schema: run `berth db upgrade` first"
        )


def _http_server(app: Litestar, cfg: Config, host: str, port: int) -> tuple[_Uvicorn, str | None]:
    """Uvicorn for the app, and the certificate it serves (None: plain HTTP)."""
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
    return server, certfile


def _dial(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):  # noqa: S104  (what to dial when listening everywhere)
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


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
    listening: "asyncio.Task[str]",
    berth_home: Path,
    stop: asyncio.Event,
    *,
    listen: Listen,
    scheme: str,
) -> None:
    """$BERTH_HOME/server.url says where this server listens while it runs (SPEC section 2).

    Of the servers of `--processes N`, the first alone writes it (they share the address).
    """
    if not listen.primary:
        return
    known = _written_now(berth_home, scheme, listen.host, listen.port)
    url = known or await listening
    if not url:
        return
    if not known:
        path = await asyncio.to_thread(write_server_url, berth_home, url)
        logger.info("server_url_written", path=str(path), url=url)
    try:
        await stop.wait()
    finally:  # also when the server stops on a failure
        # Only if still ours: a second server on this home may have written its own since.
        await asyncio.to_thread(remove_server_url, berth_home, url)


def _listen_key(host: str, port: int) -> str:
    """A folder name for one listen address: each server on a home keeps its own worker."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in f"{host}_{port}")


async def _builtin_credential(db: Database, home: Path) -> str:
    """This server's built-in worker's credential, kept (0600) in its folder across restarts."""
    name_file = home / "name"
    name = name_file.read_text().strip() if name_file.exists() else ""
    try:
        stored = credential.load(home)
        token, name = await tokens.builtin_worker(
            db, stored=stored.token if stored else "", name=name
        )
    except BerthError as exc:
        raise CliError(
            f"cannot make the built-in worker's credential: {exc.message}", Exit.SERVER_ERROR
        ) from None
    credential.store(home, token, name=name, origin=credential.digest(token))
    write_private(name_file, name + "\n")
    return token


async def _builtin_worker(
    *,
    token: str,
    listening: "asyncio.Task[str]",
    cafile: str,
    home: Path,
    stop: asyncio.Event,
) -> None:
    """The `serve` pool's worker, with this server's own identity (its folder under `home`)."""
    url = await listening
    if not url:
        return
    worker = worker_main.Worker(
        worker_main.Options(
            server=url,
            token=token,
            pool="serve",
            home=home,
            python=jobusers.job_python(sys.executable),
            cafile=cafile,
        )
    )
    task = asyncio.create_task(worker.run())
    try:
        await stop.wait()
    finally:  # also when the server stops on a failure: its jobs must not outlive it
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await worker._stop_all("server stopping")
