"""Which user a job runs as (SPEC section 4).

A worker started as root runs each job under a uid of its own from `--uid-range`, so a job can
read neither the worker's state nor another running job's files or `/proc/<pid>/environ`. A uid
is held by one job at a time on the whole host: an exclusive flock on a file per uid, under a
root-only folder, so two workers on one machine never hand out the same uid. Before a uid is
handed out, and again when its job ends, every process running under it is killed: a job that
left a process behind (even one that escaped its process group with setsid) cannot watch the
next job of that uid. Nor do its files and IPC objects: each job gets private /tmp, /var/tmp,
/dev/shm and IPC (worker/isolation.py), or, where namespaces cannot be made, whatever the uid
owns there is removed when its job ends, and again before the uid is handed out if the worker
that held it died before it could (worker/leftovers.py).

`--run-as USER` runs every job as one fixed user (no isolation between jobs). A worker that is
not root runs jobs as its own user: nothing separates them from the worker.
"""

import asyncio
import contextlib
import fcntl
import os
import pwd
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from service.worker import accounts, leftovers

DEFAULT_RANGE = (61000, 61999)


class NoFreeUid(Exception):
    """Every uid of the range is held by a running job."""


@dataclass(frozen=True, slots=True)
class JobUser:
    uid: int
    gid: int
    name: str  # $USER for the job
    isolated: bool  # a uid of its own: kill every process of it when the job ends


class Users:
    """Hands out the user each job runs as, and takes it back when the job ends."""

    def __init__(
        self,
        *,
        uid_range: tuple[int, int] | None = DEFAULT_RANGE,
        run_as: str = "",
        lock_dir: Path | None = None,
        cleanup: bool = False,
    ) -> None:
        self.root = os.geteuid() == 0
        self._cleanup = cleanup
        self._fixed: JobUser | None = None
        self._locks: dict[int, int] = {}  # uid -> fd holding its flock
        self._order: list[int] = []
        if not self.root:
            uid = os.geteuid()
            self._fixed = JobUser(uid, os.getegid(), accounts.name_of(uid), isolated=False)
        elif run_as:
            entry = pwd.getpwnam(run_as)
            self._fixed = JobUser(entry.pw_uid, entry.pw_gid, entry.pw_name, isolated=False)
        else:
            lo, hi = uid_range or DEFAULT_RANGE
            self._order = list(range(lo, hi + 1))
            self._lock_dir = lock_dir or default_lock_dir()

    @property
    def uids(self) -> tuple[int, ...]:
        """The uids jobs get, one each (none when every job runs as one user)."""
        return tuple(sorted(self._order))

    @property
    def cleanup(self) -> bool:
        """Whether what a job's uid leaves in /tmp & co is removed: its own uid, no namespaces."""
        return self._cleanup and self._fixed is None

    @property
    def mode(self) -> str:
        """How jobs run, for the log and `--help`: per-job uids, one user, or the worker's."""
        if self._fixed is None:
            return f"a uid of its own per job ({self._order[0]}-{self._order[-1]})"
        if self.root:
            return f"user {self._fixed.name} for every job"
        return f"the worker's own user ({self._fixed.name}): jobs can read the worker's files"

    async def acquire(self) -> JobUser:
        if self._fixed is not None:
            return self._fixed
        for uid in list(self._order):
            fd = self._lock(uid)
            if fd is None:
                continue
            self._locks[uid] = fd
            # Least recently used first next time: a uid's processes and files, if anything
            # escaped, meet the next job of that uid as late as possible.
            self._order.remove(uid)
            self._order.append(uid)
            await kill_all(uid)  # a clean slate: nothing of an earlier job still runs as it
            if self.cleanup:
                if os.fstat(fd).st_size:  # its last holder died before it cleaned up after it
                    await asyncio.to_thread(leftovers.purge, (uid,))
                os.pwrite(fd, b"in use\n", 0)  # until release has removed what this job left
            return JobUser(uid, uid, accounts.name_of(uid), isolated=True)
        raise NoFreeUid("every uid of --uid-range is in use by a running job")

    async def release(self, user: JobUser) -> None:
        if not user.isolated:
            return
        await kill_all(user.uid)
        fd = self._locks.pop(user.uid, None)
        if fd is None:
            return
        try:
            if self.cleanup:
                # Security: the next job of this uid may be another tenant's. Nothing of this
                # one runs any more (kill_all), so nothing can make more behind the walk.
                await asyncio.to_thread(leftovers.purge, (user.uid,))
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing drops the flock

    async def sweep(self) -> tuple[int, int]:
        """At start, for range uids no worker holds: what a dead worker left of their jobs.

        Kills what runs as them and, in cleanup mode, removes what they own. Returns (uids
        killed, files and IPC objects removed).
        """
        if self._fixed is not None:
            return 0, 0
        lo, hi = min(self._order), max(self._order)
        running = {uid for uid in await asyncio.to_thread(list, _uids()) if lo <= uid <= hi}
        held: dict[int, int] = {}
        killed = removed = 0
        try:
            for uid in self._order if self.cleanup else sorted(running):
                fd = self._lock(uid)
                if fd is None:
                    continue  # a running job of another worker on this host
                held[uid] = fd
                if uid in running:
                    await kill_all(uid)
                    killed += 1
            if self.cleanup and held:
                removed = await asyncio.to_thread(leftovers.purge, list(held))
                for fd in held.values():
                    os.ftruncate(fd, 0)
        finally:
            for fd in held.values():
                os.close(fd)
        return killed, removed

    def _lock(self, uid: int) -> int | None:
        """The uid's lock, held (a descriptor), or None when another job holds it."""
        fd = os.open(self._lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd


def default_lock_dir() -> Path:
    """A root-only folder for the uid locks, shared by every worker on the host."""
    base = Path("/run") if os.access("/run", os.W_OK) else Path(tempfile.gettempdir())
    path = base / "berth-uids"
    path.mkdir(mode=0o700, exist_ok=True)
    st = path.lstat()
    if st.st_uid != 0 or st.st_mode & 0o077 or not path.is_dir() or path.is_symlink():
        raise PermissionError(f"{path} must be a folder owned by root with mode 0700")
    return path


def _uids() -> Iterable[int]:
    """The real uid of every live process.

    A zombie is dead already (only its parent's wait() is missing); a process that ends while
    we look is skipped. Read from each /proc/PID/status (one file, its first lines) where there
    is a /proc: psutil reads two files and builds an object per process, and this scan runs
    three times per job over every process of the host (it was the worker's largest cost).
    Never the owner of /proc/PID: a job that makes itself non-dumpable may show as root there.
    """
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        entries = None
    if entries is None:
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    yield p.uids().real
        return
    for pid in entries:
        if (uid := _status_uid(pid)) is not None:
            yield uid


def _status_uid(pid: str) -> int | None:
    """The real uid of a live process from its status file; None if a zombie or gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:  # noqa: PTH123
            head = f.read(2048)
    except OSError:
        return None
    state = uid = None
    for line in head.split(b"\n"):
        if line.startswith(b"State:"):
            state = line[6:].strip()[:1]
        elif line.startswith(b"Uid:"):
            with contextlib.suppress(IndexError, ValueError):
                uid = int(line.split()[1])
            break
    if state in (b"Z", b"X") or uid is None:
        return None
    return uid


def become(uid: int, gid: int) -> Callable[[], None]:
    """A child-side step that drops to `uid`/`gid` with no supplementary groups.

    preexec_fn rather than subprocess's user=/group=: uvloop (the server's loop, which runs the
    built-in worker) supports only this. Three system calls, no locks taken, in the child.
    """

    def drop() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    return drop


def _runs_as(uid: int) -> bool:
    return any(u == uid for u in _uids())


async def kill_all(uid: int, attempts: int = 5) -> None:
    """Kill every process running as `uid`.

    kill(-1) sent by a process of that uid reaches exactly the processes of that uid (and not
    the sender), in one system call: a job forking as fast as it can is caught whole.
    """
    for _ in range(attempts):
        # The common case: the job left nothing behind. The scan reads /proc: off the loop.
        if not await asyncio.to_thread(_runs_as, uid):
            return
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            "kill -KILL -1 2>/dev/null; exit 0",
            preexec_fn=become(uid, uid),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
        )
        await proc.wait()


def job_python(preferred: str) -> str:
    """The interpreter for Python jobs: `preferred`, unless jobs (other uids) cannot run it.

    A worker started as root from a virtualenv under /root would hand jobs an interpreter they
    may not even reach; the system's python3 is the one every uid can run. The runtime
    (`berth_runtime`) needs only the standard library, so either serves.
    """
    if os.geteuid() != 0 or _others_may_run(preferred):
        return preferred
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(candidate).exists() and _others_may_run(candidate):
            return candidate
    return preferred


def _others_may_run(path: str) -> bool:
    real = Path(os.path.realpath(path))
    try:
        if not real.stat().st_mode & 0o001:
            return False
        return all(parent.stat().st_mode & 0o001 for parent in real.parents)
    except OSError:
        return False
