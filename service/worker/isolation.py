"""Private /tmp, /var/tmp, /dev/shm and IPC for each job (SPEC section 4), as systemd's PrivateTmp.

A uid runs one job after another (worker/jobusers.py), and the next job of a uid is often
another tenant's. Whatever a job left where every uid writes (/tmp, /var/tmp, /dev/shm, SysV IPC,
POSIX message queues) would meet that next job, and a job could plant files and links there for
it. A worker that is root therefore starts each job in a mount and an IPC namespace of its own:
mount propagation private (nothing the job mounts reaches the host, nothing leaks back), its
folder's `.berth/tmp` and `.berth/var-tmp` bound over /tmp and /var/tmp (so they are removed with
its folder), a fresh tmpfs on /dev/shm no larger than the host's own, its own /etc/passwd and
/etc/group (worker/accounts.py), and SysV IPC and message queues nobody else sees. The
namespaces live as long as the job's processes; killing every process of its uid at its end
(jobusers.kill_all) takes them along. While the job runs they can be joined through
/proc/<its shim's pid>/ns/{mnt,ipc}.

All of it happens in the child between fork and exec, as root, before it drops to the job's uid
(runner.py). Python 3.11 has no os.unshare: libc's unshare and mount through ctypes, looked up
before the fork so the child only makes system calls. Where namespaces cannot be made (a
container without CAP_SYS_ADMIN), `detect` says why and the worker removes what a uid left
instead (worker/leftovers.py).
"""

import ctypes
import ctypes.util
import errno
import functools
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service.worker import accounts

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

SHARED = ("/tmp", "/var/tmp")  # noqa: S108  (the folders each job gets its own of)
SHM = "/dev/shm"  # noqa: S108
MQUEUE = "/dev/mqueue"
ACCOUNTS = ("passwd", "group")
PROBE_FAILED = 100  # the probe's exit code is this + errno when a step failed

Step = Callable[[], None]


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.unshare.argtypes = [ctypes.c_int]
    libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
    ]
    return libc


def libc_setns() -> ctypes.CDLL:
    """The C library with setns declared: how an exec joins a running job's namespaces."""
    libc = _libc()
    libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


@dataclass(frozen=True)
class Namespaces:
    """What each job's namespaces replace, as found on this host when the worker started."""

    shared: tuple[str, ...]  # /tmp and /var/tmp, resolved (one, when /var/tmp links to /tmp)
    shm: str  # /dev/shm, or "" where the host has none
    shm_bytes: int  # the size of a job's /dev/shm: the host's own
    mqueue: bool  # /dev/mqueue exists: a job gets a view of its own queues only
    etc: Path = accounts.ETC

    def hides(self, path: Path) -> str:
        """The private folder `path` lies under (a job would not see it there), or ""."""
        real = Path(os.path.realpath(path))
        for folder in (*self.shared, self.shm):
            if folder and real.is_relative_to(folder):
                return folder
        return ""

    def prepare(self, workdir: Path, *, uid: int, gid: int, name: str) -> Step:
        """Make the job's private folders and accounts in `workdir`; the child's step to enter.

        Everything is root's: the job writes into its /tmp (1777, like the host's) but can
        change neither its passwd nor its group file (a passwd it could write would make `su`
        let it in as root).
        """
        private = workdir / ".berth"
        private.mkdir(mode=0o700, exist_ok=True)
        os.chown(private, uid, gid)  # the relay's socket goes here too (worker/relay.py)
        binds: list[tuple[bytes, bytes]] = []
        for folder in self.shared:
            source = private / folder.strip("/").replace("/", "-")
            source.mkdir(mode=0o700)
            os.chmod(source, 0o1777)  # noqa: PTH101, S103  (a /tmp: anyone writes, sticky)
            binds.append((bytes(source), folder.encode()))
        files = accounts.for_job(uid=uid, gid=gid, name=name, home=workdir, etc=self.etc)
        for base, content in zip(ACCOUNTS, files, strict=True):
            target = self.etc / base
            if not target.exists():
                continue
            source = private / base
            fd = os.open(source, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            os.fchmod(fd, 0o644)  # readable by the job whatever the worker's umask
            with os.fdopen(fd, "wb") as f:
                f.write(content)
            binds.append((bytes(source), str(target).encode()))
        shm = f"mode=1777,size={self.shm_bytes}".encode() if self.shm else None
        return functools.partial(_enter, _libc(), tuple(binds), self.shm.encode(), shm, self.mqueue)


def detect(etc: Path = accounts.ETC) -> Namespaces | str:
    """This host's namespaces for jobs, or why there are none (jobs then share /tmp)."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if os.geteuid() != 0:
        return "the worker is not root"
    shared = tuple(dict.fromkeys(os.path.realpath(p) for p in SHARED if Path(p).is_dir()))
    shm = os.path.realpath(SHM) if Path(SHM).is_dir() else ""
    size = 0
    if shm:
        st = os.statvfs(shm)
        size = st.f_blocks * st.f_frsize
    found = Namespaces(shared, shm, size, Path(MQUEUE).is_dir(), etc)
    try:
        code = subprocess.run(
            ["/bin/true"], preexec_fn=_probe(found), check=False, timeout=30
        ).returncode
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot test them: {exc}"
    if code == 0:
        return found
    return f"unshare or mount failed: {os.strerror(code - PROBE_FAILED)}"


def _probe(plan: Namespaces) -> Step:
    """The child's step of `detect`: every kind of mount a job's start makes, on throwaway ones.

    Exits with PROBE_FAILED + errno instead of raising: a raising preexec_fn loses the errno.
    """
    libc = _libc()
    binds = tuple((f.encode(), f.encode()) for f in plan.shared)
    shm = b"mode=1777,size=4096" if plan.shm else None

    def probe() -> None:
        try:
            _enter(libc, binds, plan.shm.encode(), shm, plan.mqueue)
        except OSError as exc:
            os._exit(PROBE_FAILED + min(exc.errno or errno.EPERM, 100))

    return probe


def _enter(
    libc: ctypes.CDLL,
    binds: tuple[tuple[bytes, bytes], ...],
    shm: bytes,
    shm_options: bytes | None,
    mqueue: bool,
) -> None:
    """In the child, as root: new mount and IPC namespaces, then the job's own folders on top.

    Raises on any failure, so the job never starts with the host's /tmp by mistake.
    """
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC))
    # Private, recursively: the job's mounts stay out of the host, and the host's out of the job.
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None))
    for source, target in binds:
        _check(libc.mount(source, target, None, MS_BIND, None))
    if shm_options is not None:
        _check(libc.mount(b"tmpfs", shm, b"tmpfs", MS_NOSUID | MS_NODEV, shm_options))
    if mqueue:  # the IPC namespace's own queues, as mq_open sees them
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        _check(libc.mount(b"mqueue", MQUEUE.encode(), b"mqueue", flags, None))


def _check(result: int) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def describe(found: Namespaces | str, *, cleanup: bool) -> str:
    """What the worker enforces between jobs of one uid, for its start-up log line."""
    if isinstance(found, Namespaces):
        places = ", ".join((*found.shared, found.shm) if found.shm else found.shared)
        return f"namespace (each job gets its own {places} and IPC)"
    if cleanup:
        return (
            f"cleanup (no namespaces: {found}; what a uid leaves in /tmp, /var/tmp, /dev/shm "
            "and IPC is removed before it runs another job)"
        )
    return f"none ({found}; jobs share /tmp, /var/tmp, /dev/shm and IPC)"
