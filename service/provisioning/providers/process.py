"""Provisioned workers as local processes: `python -m service <argv...>`, one session each.

Contract:
- A worker is started with `start_new_session=True`: no signal sent to the server's process group
  or terminal reaches it, and it outlives the server that started it.
- Its environment is the server's minus every `BERTH_*` variable (the server's database URL,
  config overlay and tokens stay with the server), then the pool's `env`, the spec's `env` and its
  `secret_env`. The credential is only in the environment: `/proc/<pid>/cmdline` is readable by
  every user of the machine, `/proc/<pid>/environ` only by the worker's user and root.
- The labels travel in argv: `--provisioned INSTALLATION/POOL/NAME` (each part percent-encoded),
  so `list` finds workers by scanning the process table, with no state file: the next leader,
  another server process on the same machine, adopts what an old one started.
- Security: argv is readable by every process of the machine, so a marker proves nothing: a
  job could run a process with a copy of a worker's command line, to be adopted as that worker
  (holding its name alive after it died, so its leases wait out the silence window), to take
  its place when the pool starts that name, or to have a process of its choice (a setuid one,
  say) and its children signalled as an orphan. A process is this installation's worker only
  when it also runs as this server's user and its environment holds PROOF_ENV: an HMAC of its
  labels under a key derived from the installation's secret key (which servers of one
  installation share). /proc/<pid>/environ is readable only by the process's user and root,
  and a job's environment never holds it (the worker builds a job's from nothing, never with
  BERTH_*).
- Output (stdout and stderr) is appended to `HOME/provisioned/NAME.log`.
- `stop`: SIGTERM, up to `grace` seconds, then SIGKILL for the worker and what it left running.
"""

import asyncio
import hashlib
import hmac
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

import psutil

from service.provisioning.providers.base import Instance, InstanceState, ProviderError, WorkerSpec

MARKER = "--provisioned"  # the worker flag that carries the labels (`berth worker --provisioned`)
PROOF_ENV = "BERTH_PROVISIONED_PROOF"  # in the worker's environment: this provider started it
_PROOF_KEY_INFO = b"berth process provider: proof of a provisioned worker v1"
_POLL_SECONDS = 0.05  # how often stop looks whether a signalled worker is gone
_KILL_WAIT_SECONDS = 5.0  # a SIGKILLed process is gone in far less; this only bounds the wait


def marker(installation: str, pool: str, name: str) -> str:
    """The `--provisioned` value: the three labels, percent-encoded so `/` splits them."""
    return "/".join(quote(part, safe="") for part in (installation, pool, name))


def proof_key(secret_key: bytes) -> bytes:
    """The key proofs are made with, derived from the installation's secret key."""
    return hmac.new(secret_key, _PROOF_KEY_INFO, hashlib.sha256).digest()


def proof(key: bytes, label: str) -> str:
    """What a worker with the marker value `label` carries in PROOF_ENV."""
    return hmac.new(key, label.encode(), hashlib.sha256).hexdigest()


def worker_env(base: Mapping[str, str], *layers: Mapping[str, str]) -> dict[str, str]:
    """`base` without any BERTH_* variable, then each layer over it in order."""
    env = {key: value for key, value in base.items() if not key.startswith("BERTH_")}
    for layer in layers:
        env.update(layer)
    return env


@dataclass(frozen=True, slots=True)
class _Found:
    """A running process in the table that carries a marker, proven ours."""

    pid: int
    installation: str
    pool: str
    name: str


@dataclass(slots=True)
class _Child:
    """A worker this provider object started; kept to reap it and to report how it ended."""

    spec: WorkerSpec
    popen: subprocess.Popen[bytes]


class ProcessProvider:
    """Workers as subprocesses of this machine. `command` replaces `python -m service` (tests).

    `secret_key`: the installation's (domain/secrets.load_key); a worker is recognised by a
    proof made with it, so servers of one installation adopt each other's workers.
    """

    def __init__(
        self,
        home: Path,
        *,
        secret_key: bytes,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        grace: float = 10.0,
    ) -> None:
        self._key = proof_key(secret_key)
        self._dir = home / "provisioned"
        self._command = tuple(command) if command else (sys.executable, "-m", "service")
        self._env = dict(env or {})
        self._grace = grace
        self._children: dict[str, _Child] = {}
        self._lock = asyncio.Lock()  # one start or stop at a time: each looks, then acts

    async def start(self, spec: WorkerSpec) -> Instance:
        async with self._lock:
            return await asyncio.to_thread(self._start, spec)

    async def stop(self, name: str) -> None:
        async with self._lock:
            await asyncio.to_thread(self._stop, name)

    async def close(self) -> None:
        """Nothing to release: the workers run on without this object, by design."""

    def log_path(self, name: str) -> Path:
        return self._dir / f"{quote(name, safe='')}.log"

    def _start(self, spec: WorkerSpec) -> Instance:
        for found in _scan(self._key):
            if found.name != spec.name:
                continue
            if found.installation != spec.installation:
                raise ProviderError(
                    f"a worker named {spec.name} of another installation "
                    f"({found.installation}) runs here as pid {found.pid}"
                )
            return Instance(spec.name, found.pool, str(found.pid), InstanceState.RUNNING)
        label = marker(spec.installation, spec.pool, spec.name)
        argv = [*self._command, *spec.argv, MARKER, label]
        # Last, so nothing a pool or spec sets can replace it.
        own = {PROOF_ENV: proof(self._key, label)}
        env = worker_env(os.environ, self._env, spec.env, spec.secret_env, own)
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            with self.log_path(spec.name).open("ab") as log:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self._dir,
                    start_new_session=True,  # its own session: it outlives this server
                    close_fds=True,
                )
        except OSError as exc:
            raise ProviderError(f"cannot start {self._command[0]}: {exc}") from None
        self._children[spec.name] = _Child(spec, popen)
        return Instance(spec.name, spec.pool, str(popen.pid), InstanceState.RUNNING)

    def _stop(self, name: str) -> None:
        child = self._children.pop(name, None)
        procs: list[psutil.Process] = []
        for found in _scan(self._key):
            if found.name == name:
                try:
                    procs.append(psutil.Process(found.pid))
                except psutil.NoSuchProcess:
                    continue
        reap = child.popen if child is not None else None
        for proc in procs:
            _signal(proc, signal.SIGTERM)
        alive = _wait_gone(procs, reap, time.monotonic() + self._grace)
        if alive:
            # Collected before the kill: once the worker dies its jobs are reparented and
            # could no longer be found from it.
            victims = list(alive)
            for proc in alive:
                try:
                    victims.extend(proc.children(recursive=True))
                except psutil.Error:
                    continue
            for proc in victims:
                _signal(proc, signal.SIGKILL)
            alive = _wait_gone(victims, reap, time.monotonic() + _KILL_WAIT_SECONDS)
        if alive:
            pids = ", ".join(str(p.pid) for p in alive)
            raise ProviderError(f"worker {name} did not die after SIGKILL (pid {pids})")

    def _list(self, installation: str, pool: str | None) -> list[Instance]:
        ended: list[Instance] = []
        for name, child in self._children.items():
            code = child.popen.poll()  # reaps it: an exited child of ours is then gone
            spec = child.spec
            if code is None or spec.installation != installation:
                continue
            if pool is None or spec.pool == pool:
                ended.append(_ended(name, spec.pool, child.popen.pid, code))
        instances: list[Instance] = []
        seen: set[str] = set()
        for found in _scan(self._key):
            if found.installation != installation or (pool is not None and found.pool != pool):
                continue
            instances.append(
                Instance(found.name, found.pool, str(found.pid), InstanceState.RUNNING)
            )
            seen.add(found.name)
        return instances + [i for i in ended if i.name not in seen]

    # Last in the class: below it, `list` would name this method, not the builtin.
    async def list(self, *, installation: str, pool: str | None = None) -> list[Instance]:
        return await asyncio.to_thread(self._list, installation, pool)


def _ended(name: str, pool: str, pid: int, code: int) -> Instance:
    if code == 0:
        return Instance(name, pool, str(pid), InstanceState.STOPPED, "exited with code 0")
    detail = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return Instance(name, pool, str(pid), InstanceState.FAILED, detail)


def _scan(key: bytes) -> list[_Found]:
    """Every process whose argv carries a well-formed marker, proven ours (see the contract)."""
    found: list[_Found] = []
    me = os.geteuid()
    for proc in psutil.process_iter(["cmdline", "status", "uids"]):
        cmdline = proc.info.get("cmdline") or []  # None: not ours to read, or already gone
        label = _label(cmdline)
        if label is None:
            continue
        uids = proc.info.get("uids")
        # Security: a worker runs as this server's user, unchanged; a process of a job's uid,
        # or a setuid program a job ran, is not one whatever its argv says.
        if uids is None or uids.real != me or uids.effective != me:
            continue
        # A zombie's environment is gone: unproven, it is not listed (a child of this provider
        # object is reported from its exit code instead).
        if proc.info.get("status") == psutil.STATUS_ZOMBIE or not _proven(proc, key, label):
            continue
        installation, pool, name = (unquote(part) for part in label.split("/"))
        found.append(_Found(proc.pid, installation, pool, name))
    return found


def _proven(proc: psutil.Process, key: bytes, label: str) -> bool:
    """Whether the process's environment holds the proof for `label` (never its argv)."""
    try:
        shown = proc.environ().get(PROOF_ENV, "")
    except psutil.Error:  # gone, or not ours to read: not ours
        return False
    return hmac.compare_digest(shown, proof(key, label))


def _label(cmdline: Sequence[str]) -> str | None:
    """The marker's value when it is well formed: three non-empty percent-encoded parts."""
    try:
        value = cmdline[cmdline.index(MARKER) + 1]
    except (ValueError, IndexError):
        return None
    parts = value.split("/")
    if len(parts) != 3 or not all(parts):
        return None
    return value


def _signal(proc: psutil.Process, signum: signal.Signals) -> None:
    # psutil checks that the pid still names the same process before it signals.
    try:
        proc.send_signal(signum)
    except psutil.NoSuchProcess:
        return


def _gone(proc: psutil.Process) -> bool:
    # A zombie has ended; whether anyone reaps it (init, or us) is not the worker's doing.
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(
    procs: Sequence[psutil.Process],
    reap: subprocess.Popen[bytes] | None,
    deadline: float,
) -> list[psutil.Process]:
    """Wait until every process is gone or the deadline passes; return those still alive."""
    while True:
        if reap is not None:
            reap.poll()
        alive = [proc for proc in procs if not _gone(proc)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(_POLL_SECONDS)
