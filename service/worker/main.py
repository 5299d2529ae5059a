"""`berth worker`: dial the server, say hello, run leases, beat, reconnect with backoff.

A session is one websocket: hello -> welcome (or refused: stop every job, exit non-zero with
the reason). Reports go through the outbox (worker/outbox.py): kept until the server says it
received them, resent after a reconnect. The watchdog stops every job once no ack came for
unreachable + evict - 2 * heartbeat seconds, so the copy is dead before the lease can move, and
reports each stopped copy as given back: the server re-queues it as soon as it hears again.
"""

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import ssl
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from service import __version__, protocol
from service.cas.base import Store
from service.cas.factory import open_store
from service.config import Cas
from service.core.bounds import RELAY_MAX_SAVE_GB, gb_bytes
from service.core.exits import Exit
from service.core.resources import shown_memory
from service.worker import accounts, artifacts, confine, credential, gpus, host, isolation, workdirs
from service.worker.execs import Execs
from service.worker.gpus import Gpus, NoFreeGpu
from service.worker.isolation import Namespaces
from service.worker.jobusers import DEFAULT_RANGE, NoFreeUid, Users
from service.worker.outbox import DEFAULT_LIMIT, Outbox
from service.worker.relay import RELAY_TIMEOUT, Calls, Relay
from service.worker.runner import Outcome, Run

log = logging.getLogger("berth.worker")

WORKER_HEADER = "x-berth-worker"
BACKOFF_START = 0.2
BACKOFF_MAX = 10.0
NO_REPORT = frozenset({"fenced", "released"})  # the lease is not ours: say nothing of the copy


class Refused(Exception):
    """The server refused this worker for good; the message is its reason."""


@dataclass(frozen=True)
class Options:
    server: str
    # The credential to attach with: what the CLI chose (worker/credential.py `choose`) from
    # BERTH_TOKEN, a one-time join token (brj_...) or the one stored under `home`.
    token: str
    pool: str | None  # None: its credential binds it (a joined worker)
    home: Path
    labels: tuple[str, ...] = ()
    parallel: int = 0
    python: str = sys.executable
    name: str = ""
    cafile: str = ""  # trust this certificate too (the built-in worker, its own server's)
    pass_env: tuple[str, ...] = ()
    uid_range: tuple[int, int] = DEFAULT_RANGE
    run_as: str = ""
    work_dir: Path | None = None  # parent of the work root; default /var/lib/berth/work as root
    outbox_bytes: int = DEFAULT_LIMIT
    # A provisioned worker that cannot reach the server this long, holding no job, exits.
    orphan_exit_seconds: float = 0.0  # 0: never
    cas: Cas | None = None  # a [cas] of its own (its id must be the server's); None: the server's
    allow_local_repos: bool = False  # --repo may name a path on this machine (trusted tenants)
    # Where --pass-env and the base (PATH, LANG, TZ, LC_*) are read from: the worker's own.
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    # sha256 of the credential this worker was first given, kept with each one the server
    # sends, so that giving it again after a restart is known as the same worker's.
    origin: str = ""
    # What it offers jobs (--cpus --memory --gpus); None: the host's (worker/host.capacity).
    cpus: float | None = None
    memory_mb: int | None = None
    gpus: int | None = None


@dataclass
class Worker:
    opts: Options
    instance: str = field(default_factory=lambda: uuid.uuid4().hex)
    runs: dict[tuple[int, int], Run] = field(default_factory=dict)
    outbox: Outbox = field(init=False)
    users: Users = field(init=False)
    welcome: protocol.Welcome | None = None
    last_ack: float = field(default_factory=time.monotonic)
    exit_code: int | None = None
    exit_reason: str = ""
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _devices: tuple[protocol.Gpu, ...] = ()  # the GPUs NVML saw last (worker/gpus.py)
    capacity: protocol.Capacity = field(default_factory=protocol.Capacity)
    gpu_slots: Gpus = field(default_factory=lambda: Gpus(()))
    # Each job's CPU and memory limits: cgroups, or rlimits and affinity (worker/confine.py).
    confinement: confine.Cgroups | confine.Rlimits = field(
        default_factory=lambda: confine.Rlimits(())
    )
    _dials: int = 0  # connection attempts: picks the next of several --server URLs
    _digest: str = ""
    _work_root: Path | None = None
    namespaces: Namespaces | None = None  # each job's private /tmp & co; None: none to be had
    _token: str = ""
    _reached: float = field(default_factory=time.monotonic)  # last time a session was up
    store: Store | None = None  # the installation's artifact store, as this worker reaches it
    calls: Calls = field(default_factory=Calls)  # jobs' calls relayed to the server
    execs: Execs = field(default_factory=Execs)  # `berth job exec` sessions (worker/execs.py)
    _own_store: Store | None = None
    _opened_from: tuple[protocol.CasAccess, str] | None = None  # `store`'s access and bearer
    _own_id: str = ""
    stopping: asyncio.Event = field(default_factory=asyncio.Event)  # SIGTERM/SIGINT

    def __post_init__(self) -> None:
        self.outbox = Outbox(self.opts.outbox_bytes)
        self._token = self.opts.token  # the CLI chose it (cli/worker.py: stored vs BERTH_TOKEN)

    # -- the outer loop ----------------------------------------------------------------------
    async def _get_ready(self) -> None:
        """What a worker needs before it dials: its host, its work root, its own store."""
        self._devices = await asyncio.to_thread(gpus.discover)
        self.capacity = host.capacity(
            cpus=self.opts.cpus,
            memory_mb=self.opts.memory_mb,
            gpus=self.opts.gpus,
            devices=self._devices,
        )
        # Declared GPUs beyond those NVML sees (or without a driver) are numbered after them.
        indices = [d.index for d in self._devices][: self.capacity.gpus]
        indices += [i for i in range(self.capacity.gpus * 2) if i not in indices]
        self.gpu_slots = Gpus(indices[: self.capacity.gpus])
        found_cgroups = await asyncio.to_thread(confine.detect, self.instance)
        if isinstance(found_cgroups, confine.Cgroups):
            self.confinement = found_cgroups
        else:
            self.confinement = confine.Rlimits(tuple(sorted(os.sched_getaffinity(0))))
        self._digest = await asyncio.to_thread(host.env_digest)
        self._work_root = await asyncio.to_thread(
            workdirs.prepare, self.opts.home, self.opts.work_dir
        )
        found = await asyncio.to_thread(isolation.detect)
        if isinstance(found, Namespaces):
            self.namespaces = found
            if hidden := found.hides(self._work_root):
                raise workdirs.UnsafeWorkDir(
                    f"the work root {self._work_root} is under {hidden}, which each job gets a "
                    "private one of: give the worker a --work-dir elsewhere "
                    f"(default {workdirs.ROOT_PARENT})"
                )
        self.users = Users(
            uid_range=self.opts.uid_range,
            run_as=self.opts.run_as,
            cleanup=not isinstance(found, Namespaces),
        )
        if self.opts.cas is not None:
            self._own_store = open_store(self.opts.cas, home=self.opts.home)
            self.store = self._own_store
            self._own_id = await self._own_store.id()
        if self.users.cleanup:
            await self._name_uids_on_host()
        killed, removed = await self.users.sweep()
        log.info("jobs run as %s, in %s", self.users.mode, self._work_root)
        log.info(
            "isolation between jobs of one uid: %s",
            isolation.describe(found, cleanup=self.users.cleanup),
        )
        log.info(
            "offers jobs %g CPUs, %s of memory, %d GPUs (%s); limits each job by %s",
            self.capacity.cpus,
            shown_memory(self.capacity.memory_mb),
            self.capacity.gpus,
            ", ".join(f"{d.index}: {d.name}" for d in self._devices) or "none found by NVML",
            confine.describe(
                self.confinement, found_cgroups if isinstance(found_cgroups, str) else ""
            ),
        )
        if killed:
            log.warning("killed the processes of %d job uid(s) left by a dead worker", killed)
        if removed:
            log.warning("removed %d file(s) or IPC object(s) left by earlier jobs", removed)

    async def _name_uids_on_host(self) -> None:
        """Without namespaces, job uids get their names in the host's /etc/passwd and group."""
        try:
            added = await asyncio.to_thread(accounts.add_to_host, self.users.uids)
        except OSError as exc:  # a read-only /etc, say: jobs then run with no name for their uid
            log.warning("cannot add job users to /etc/passwd (%s): `id -un` fails in jobs", exc)
            return
        if added:
            log.info("added %d job user(s) (berth-job-N) to /etc/passwd and /etc/group", added)

    async def run(self) -> int:
        try:
            return await self._run_until_done()
        finally:
            if isinstance(self.confinement, confine.Cgroups):
                self.confinement.close()  # its jobs' cgroups' parents

    async def _run_until_done(self) -> int:
        try:
            await self._get_ready()
        except workdirs.UnsafeWorkDir as exc:
            print(f"berth worker: {exc}", file=sys.stderr)
            return 2
        watchdog = asyncio.create_task(self._watchdog())
        backoff = BACKOFF_START
        try:
            while self.exit_code is None:
                if self.stopping.is_set():  # asked to stop while not connected
                    await self._stop_all("released")
                    self.exit_code, self.exit_reason = 0, "stopped"
                    break
                try:
                    await self._session()
                    backoff = BACKOFF_START
                except Refused as exc:
                    print(f"berth: error: refused by the server: {exc}", file=sys.stderr)
                    await self._stop_all("refused")
                    return Exit.REFUSED
                except (OSError, ConnectionClosed, InvalidStatus, TimeoutError) as exc:
                    if isinstance(exc, InvalidStatus) and exc.response.status_code in (401, 403):
                        print(f"berth: error: refused by the server: {_body(exc)}", file=sys.stderr)
                        await self._stop_all("refused")
                        return Exit.REFUSED
                    log.warning("connection lost (%s); retrying in %.1fs", exc, backoff)
                    self._dials += 1  # several servers: try the next one
                except Exception:  # a bad frame or a bug: keep the jobs, log it, dial again
                    log.exception("session failed; retrying in %.1fs", backoff)
                    self._dials += 1
                if self._told_to_exit():
                    break
                if self._orphaned():
                    self.exit_code, self.exit_reason = 0, "orphaned: no server for too long"
                    break
                await asyncio.sleep(backoff * (0.5 + random.random()))  # noqa: S311  (jitter)
                backoff = min(backoff * 2, BACKOFF_MAX)
        finally:
            watchdog.cancel()
        if self.exit_code:
            # Told to leave for a reason (its token was revoked): refused, as berth says it.
            await self._stop_all("exit")
            print(
                f"berth: error: the server ended this worker: {self.exit_reason}", file=sys.stderr
            )
            return Exit.REFUSED
        await self._wait_all()
        log.info("worker exiting: %s", self.exit_reason)
        return 0

    def _told_to_exit(self) -> bool:
        return self.exit_code is not None  # a method: set by the session, unseen by mypy here

    def _orphaned(self) -> bool:
        """A provisioned worker that reached no server for a while and holds no job ends.

        Its leader may be gone for good, and nobody else would stop it.
        """
        limit = self.opts.orphan_exit_seconds
        return limit > 0 and not self.runs and time.monotonic() - self._reached > limit

    def _server(self) -> str:
        """The server to dial now (http[s]://...); `--server a,b` rotates on failure."""
        servers = [s.strip() for s in self.opts.server.split(",") if s.strip()]
        base = servers[self._dials % len(servers)].rstrip("/")
        return "http" + base[2:] if base.startswith("ws") else base

    def _url(self) -> str:
        """The websocket URL of the server to dial now."""
        return "ws" + self._server()[4:] + protocol.WORKER_PATH

    async def _session(self) -> None:
        headers = {"Authorization": f"Bearer {self._token}"}
        if self.opts.name:  # behind a proxy, a worker sharing one credential names itself
            headers[WORKER_HEADER] = self.opts.name
        url = self._url()
        extra: dict[str, Any] = {}  # ssl=None is refused for wss://, so pass it only when set
        if url.startswith("wss:") and self.opts.cafile:
            extra["ssl"] = ssl.create_default_context(cafile=self.opts.cafile)
        async with connect(
            url,
            additional_headers=headers,
            open_timeout=10,
            max_size=64 * 1024 * 1024,
            compression=None,  # small JSON frames: deflate costs more CPU and memory than it saves
            **extra,
        ) as ws:
            await ws.send(protocol.encode(self._hello()).decode())
            first = protocol.decode_to_worker(await asyncio.wait_for(ws.recv(), timeout=15))
            if isinstance(first, protocol.Refused):
                raise Refused(first.reason)
            if not isinstance(first, protocol.Welcome):
                raise Refused(f"unexpected first frame {type(first).__name__}")
            self.welcome = first
            self.last_ack = self._reached = time.monotonic()
            self._reach_store(first.cas)
            log.info(
                "attached as %s in pool %s (instance %s)", first.name, first.pool, self.instance[:8]
            )
            for job, epoch in first.drop:
                self.outbox.forget((job, epoch))
                await self._kill((job, epoch), "fenced")
            self.outbox.rewind()  # whatever the last session did not see received goes again
            helpers = [
                asyncio.create_task(self._sender(ws)),
                asyncio.create_task(self._beater(ws)),
                asyncio.create_task(self._leave_when_stopped(ws)),
            ]
            self.calls.ws = ws
            try:
                await self._reader(ws)
            finally:
                self.calls.ws = None
                await self.execs.end_all("the worker's connection to the server ended")
                self._reached = time.monotonic()
                for task in helpers:
                    task.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)

    def _reach_store(self, access: protocol.CasAccess | None) -> None:
        """The store for this session: its own [cas], else the one the server hands out.

        The same access as the last session keeps its store (and its connections): runs that
        outlived the reconnect still upload through it.
        """
        if self._own_store is not None or access is None:
            return
        bearer = access.token or self._token  # "": this worker's own credential
        if (access, bearer) == self._opened_from:
            return
        # A path: the store is behind the server this worker dialled.
        url = self._server() + access.url if access.url.startswith("/") else access.url
        cas = Cas(
            provider=access.provider,
            url=url,
            bucket=access.bucket,
            prefix=access.prefix,
            endpoint_url=access.endpoint_url,
            region=access.region,
        )
        self.store = open_store(
            cas,
            home=self.opts.home,
            headers={"Authorization": f"Bearer {bearer}"},
            verify=self.opts.cafile or None,
            expected_id=access.id,
        )
        self._opened_from = (access, bearer)

    def _hello(self) -> protocol.Hello:
        return protocol.Hello(
            protocol=protocol.PROTOCOL_VERSION,
            berth_version=__version__,
            pool=self.opts.pool,
            instance=self.instance,
            labels=self.opts.labels,
            parallel=self.opts.parallel,
            host=host.sample(self.opts.home, self._devices),
            capacity=self.capacity,
            python=".".join(map(str, sys.version_info[:3])),
            env_digest=self._digest,
            held=tuple(sorted(set(self.runs) | self.outbox.finished_keys())),
            cas=self._own_id,
        )

    # -- one session's tasks ------------------------------------------------------------------
    async def _reader(self, ws: ClientConnection) -> None:
        async for raw in ws:
            frame = protocol.decode_to_worker(raw)
            match frame:
                case protocol.Ack():
                    self.last_ack = self._reached = time.monotonic()
                case protocol.Received():
                    self.outbox.received(frame.upto)
                case protocol.Lease() | protocol.Leases():
                    for lease in frame.leases if isinstance(frame, protocol.Leases) else (frame,):
                        self._start(lease)
                case protocol.Cancel() | protocol.Stale():
                    if isinstance(frame, protocol.Stale):
                        self.outbox.forget((frame.job, frame.epoch))
                    reason = "cancelled" if isinstance(frame, protocol.Cancel) else "fenced"
                    await self._kill((frame.job, frame.epoch), reason)
                case protocol.Exit():
                    self.exit_code, self.exit_reason = frame.code, frame.reason
                    if frame.code:
                        await self._give_back_all(ws)
                    return
                case _:
                    await self._on_control(ws, frame)

    async def _on_control(self, ws: ClientConnection, frame: protocol.ToWorker) -> None:
        """Frames about the worker itself rather than its jobs."""
        match frame:
            case protocol.Credential():
                await self._keep_credential(ws, frame.token)
            case protocol.RelayResponse():
                self.calls.answered(frame)
            case protocol.ExecStart():
                run = self.runs.get((frame.job, frame.epoch))

                async def send(out: protocol.Frame) -> None:
                    await ws.send(protocol.encode(out).decode())

                self.execs.start(frame, run, send)
            case protocol.ExecInput():
                self.execs.input(frame)
            case protocol.ExecDelivered():
                self.execs.delivered(frame)
            case protocol.Refused():
                raise Refused(frame.reason)

    async def _keep_credential(self, ws: ClientConnection, token: str) -> None:
        """Store the credential, then confirm: the server retires the old one only after."""
        name = self.welcome.name if self.welcome else ""
        origin = self.opts.origin or credential.digest(self.opts.token)
        await asyncio.to_thread(credential.store, self.opts.home, token, name=name, origin=origin)
        self._token = token
        await ws.send(protocol.encode(protocol.CredentialStored()).decode())
        log.info("stored a new credential")

    async def _leave_when_stopped(self, ws: ClientConnection) -> None:
        """On SIGTERM: stop every job, let the server receive every report, then say bye."""
        await self.stopping.wait()
        held = tuple(sorted(self.runs))
        await self._stop_all("released")  # the copies are dead before the leases are given back
        grace = 2 * self.welcome.heartbeat_seconds if self.welcome else 5.0
        if not await self.outbox.drained(grace):
            log.warning("%d report(s) not received by the server before leaving", len(self.outbox))
        await ws.send(protocol.encode(protocol.Bye(released=held)).decode())
        self.exit_code, self.exit_reason = 0, "stopped"
        await ws.close()

    async def _give_back_all(self, ws: ClientConnection) -> None:
        """Told to exit (e.g. its credential was revoked): kill every job, give the leases back.

        The copies are dead before `bye` names them, so the server may re-queue them at once
        without a job running twice. Results not yet received go back too: the server takes
        no report from a worker it told to exit.
        """
        held = tuple(sorted(set(self.runs) | self.outbox.finished_keys()))
        await self._stop_all("released")
        with contextlib.suppress(ConnectionClosed):
            await ws.send(protocol.encode(protocol.Bye(released=held)).decode())

    async def _sender(self, ws: ClientConnection) -> None:
        while True:
            report = await self.outbox.next()
            await ws.send(protocol.encode(report).decode())

    async def _beater(self, ws: ClientConnection) -> None:
        assert self.welcome is not None
        seq = 0
        while True:
            seq += 1
            if self._devices:  # utilisation changes: ask NVML again
                self._devices = await asyncio.to_thread(gpus.discover) or self._devices
            sample = await asyncio.to_thread(host.sample, self.opts.home, self._devices)
            await ws.send(protocol.encode(protocol.Beat(seq=seq, host=sample)).decode())
            await asyncio.sleep(self.welcome.heartbeat_seconds)

    async def _watchdog(self) -> None:
        """Self-fencing: no ack for the fence window -> stop every job before its lease moves.

        The copies are stopped at once, all together (each may take the kill grace), and each
        is reported as given back, so a server that answers again re-queues them immediately.
        """
        while True:
            await asyncio.sleep(0.1)
            w = self.welcome
            if w is None or not self.runs:
                continue
            window = w.unreachable_seconds + w.evict_seconds - 2 * w.heartbeat_seconds
            if time.monotonic() - self.last_ack > window:
                live = [k for k, r in self.runs.items() if not r.stop_reason]
                if live:
                    log.warning("no ack for %.1fs: stopping %d job(s)", window, len(live))
                    await asyncio.gather(*(self._kill(k, "gave_back") for k in live))

    # -- jobs ---------------------------------------------------------------------------------
    def _start(self, lease: protocol.Lease) -> None:
        key = (lease.job, lease.epoch)
        if key in self.runs:
            return
        assert self._work_root is not None
        grace = self.welcome.kill_grace_seconds if self.welcome else 5.0
        workdir = self._work_root / f"{lease.job}-{lease.epoch}"
        run = Run(
            lease=lease,
            workdir=workdir,
            store=artifacts.for_job(self.store, lease),
            user=None,
            python=self.opts.python,
            grace=grace,
            emit=lambda stream, data: self.outbox.put_output(lease.job, lease.epoch, stream, data),
            worker_env=self.opts.environ,
            pass_env=self.opts.pass_env,
            runtime=self._work_root / "runtime",
            relay=self._relay_for(lease, workdir),
            repo_cache=self.opts.home / "repos",
            allow_local_repos=self.opts.allow_local_repos,
            namespaces=self.namespaces,
        )
        run.ending = lambda: self.execs.end_job(key, "the job's lease ended")
        self.runs[key] = run
        try:
            run.gpu_env = gpus.visible(self.gpu_slots.take(key, lease.gpus))
        except NoFreeGpu as exc:
            run.refusal = f"cannot start: {exc}"
        if lease.cpus > 0 or lease.memory_mb > 0:
            name = f"job-{lease.job}-{lease.epoch}"
            c = self.confinement
            run.limits = (
                c.job(name, cpus=lease.cpus, memory_mb=lease.memory_mb)
                if isinstance(c, confine.Cgroups)
                else c.job(key, cpus=lease.cpus, memory_mb=lease.memory_mb)
            )
        task = asyncio.create_task(self._run(run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, run: Run) -> None:
        job, epoch = run.key
        user = None
        try:
            user = await self.users.acquire()
            run.user = user
            outcome = await run.run(
                lambda: self._report(lambda seq: protocol.Started(seq=seq, job=job, epoch=epoch))
            )
        except NoFreeUid as exc:
            outcome = Outcome("failed", None, f"cannot start: {exc}")
        except Exception as exc:  # a runner bug must still end in a report, never a silent slot
            log.exception("job %s failed to run", job)
            outcome = Outcome("failed", None, f"worker error: {exc}")
        finally:
            self.runs.pop(run.key, None)
            self.gpu_slots.give_back(run.key)
            if isinstance(self.confinement, confine.Rlimits):
                self.confinement.give_back(run.key)
            if user is not None:
                await self.users.release(user)
            run.cleanup()
        reason = run.stop_reason
        if reason in NO_REPORT:
            return
        if reason == "gave_back":
            self.outbox.put(
                lambda seq: protocol.GaveBack(seq=seq, job=job, epoch=epoch, reason="no ack")
            )
            return
        self.outbox.put(
            lambda seq: protocol.Finished(
                seq=seq,
                job=job,
                epoch=epoch,
                state=outcome.state,  # type: ignore[arg-type]
                exit_code=outcome.exit_code,
                error=outcome.error[:4000],
                outputs=tuple(outcome.outputs),
            )
        )

    def _relay_for(self, lease: protocol.Lease, workdir: Path) -> Relay:
        """The job's relay.

        Its API calls go to the server as the job, its artifacts to the store, its metrics and
        saved artifacts into the outbox (fenced by the lease).
        """
        job, epoch = lease.job, lease.epoch

        async def api(method: str, path: str, body: Any) -> tuple[int, Any]:  # noqa: ANN401
            return await self.calls.call(job, epoch, method, path, body)

        def emit(values: dict[str, float]) -> bool:
            if self.outbox.unreceived_bytes >= self.outbox.limit:
                return False  # a job emitting in a loop must not grow the outbox without end
            size = sum(len(k) + 24 for k in values)  # as the frame will carry them
            self.outbox.put(
                lambda seq: protocol.Metrics(seq=seq, job=job, epoch=epoch, values=values), size
            )
            return True

        async def saved(sha: str, size: int) -> bool:
            report = self.outbox.put(
                lambda seq: protocol.Saved(seq=seq, job=job, epoch=epoch, sha256=sha, size=size)
            )
            return await self.outbox.until_received(report.seq, timeout=RELAY_TIMEOUT)

        return Relay(
            socket_path=workdir / ".berth" / "relay.sock",
            store=artifacts.for_job(self.store, lease, "upload"),
            api=api,
            emit=emit,
            saved=saved,
            max_save=gb_bytes(
                self.welcome.relay_max_save_gb if self.welcome else RELAY_MAX_SAVE_GB
            ),
        )

    def _report(self, make: Callable[[int], protocol.Report]) -> None:
        self.outbox.put(make)

    async def _kill(self, key: tuple[int, int], reason: str) -> None:
        run = self.runs.get(key)
        if run is not None:
            log.info("stopping job %s epoch %s (%s)", key[0], key[1], reason)
            await run.stop(reason)

    async def _stop_all(self, reason: str) -> None:
        await asyncio.gather(*(r.stop(reason) for r in list(self.runs.values())))
        await self._wait_all()

    async def _wait_all(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _body(exc: InvalidStatus) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(exc.response.body or b"{}").get("error") or exc)
    return str(exc)


async def run(opts: Options) -> int:
    """Run a worker until it is told to exit or refused; returns the process exit code."""
    worker = Worker(opts)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stopping.set)
    return await worker.run()
