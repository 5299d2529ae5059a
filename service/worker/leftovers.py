"""Where jobs get no namespaces: what a uid left behind goes before the uid runs again.

The fallback of worker/isolation.py (a container without CAP_SYS_ADMIN, say): jobs share the
host's /tmp, /var/tmp, /dev/shm and IPC, so after every process of a job's uid is dead the worker
removes everything that uid owns there (files, links, folders, FIFOs, sockets, POSIX semaphores
and shared memory in /dev/shm, message queues in /dev/mqueue) and its SysV shared memory,
semaphores and message queues.

The walk runs as root through other uids' folders, so it trusts no name: every folder is opened
relative to its parent's descriptor with O_NOFOLLOW and checked to be the one it listed, a link is
removed and never followed, it never crosses into another filesystem, and it removes only what
the uid owns. A folder of the uid that still holds another uid's files is given to root (sticky)
instead: the uid then owns nothing there. A tree deeper than MAX_DEPTH is not walked further:
its folder of the uid at that depth is given to root, mode 0700, so no uid reaches below it.
"""

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import os
import stat
import subprocess
from collections.abc import Collection, Sequence

ROOTS = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue")  # noqa: S108
SYSVIPC = "/proc/sysvipc"
SYSV_KINDS = ("shm", "sem", "msg")
IPC_RMID = 0
MAX_DEPTH = 128  # one descriptor per level is held open while walking
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def purge(uids: Collection[int], roots: Sequence[str] = ROOTS) -> int:
    """Remove what `uids` own under `roots` and their SysV IPC objects; how many were removed.

    Call it only once no process of those uids runs (jobusers.kill_all): a live one could make
    more as fast as they go.
    """
    owners = frozenset(uids)
    if not owners:
        return 0
    removed = 0
    for root in dict.fromkeys(os.path.realpath(r) for r in roots):
        try:
            fd = os.open(root, DIR_FLAGS)
        except OSError:
            continue  # no such folder on this host
        try:
            removed += _purge_dir(fd, owners, os.fstat(fd).st_dev, 1)
        finally:
            os.close(fd)
    return removed + purge_sysv(owners)


def _purge_dir(fd: int, owners: frozenset[int], dev: int, depth: int) -> int:
    """Remove what `owners` own inside the folder open at `fd`."""
    removed = 0
    try:
        names = os.listdir(fd)
    except OSError:
        return 0
    for name in names:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue  # gone meanwhile
        if stat.S_ISDIR(st.st_mode):
            if st.st_dev == dev:  # never into another filesystem (a mount under /tmp)
                removed += _purge_subdir(fd, name, st, owners=owners, dev=dev, depth=depth)
            continue
        if st.st_uid in owners:
            # unlink removes the name: a link goes, whatever it points to stays.
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=fd)
                removed += 1
    return removed


def _purge_subdir(
    parent: int, name: str, listed: os.stat_result, *, owners: frozenset[int], dev: int, depth: int
) -> int:
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)  # O_NOFOLLOW: a link swapped in fails here
    except OSError:
        return 0
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (listed.st_dev, listed.st_ino):
            return 0  # replaced between listing and opening: not the folder that was checked
        ours = st.st_uid in owners
        if depth >= MAX_DEPTH:
            if ours:  # too deep to walk on: nobody but root may enter it any more
                _give_to_root(fd, 0o700)
            return 0
        removed = _purge_dir(fd, owners, dev, depth + 1)
        if not ours:
            return removed
        try:
            os.rmdir(name, dir_fd=parent)
            return removed + 1
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                return removed
        # Another uid's files are still in it: they stay, and the folder stops being the uid's.
        _give_to_root(fd, stat.S_IMODE(st.st_mode) | stat.S_ISVTX)
        return removed
    finally:
        os.close(fd)


def _give_to_root(fd: int, mode: int) -> None:
    with contextlib.suppress(OSError):
        os.fchown(fd, 0, 0)
        os.fchmod(fd, mode)


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    libc.semctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    libc.msgctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return libc


def purge_sysv(owners: Collection[int]) -> int:
    """Remove the SysV shared memory, semaphores and message queues `owners` own or created.

    A creator stays in charge of an object whose owner it changed (IPC_SET): both count. Root
    may remove another uid's object only with CAP_SYS_ADMIN, which is exactly what a worker
    without namespaces lacks: the removal runs in a child that became the object's uid.
    """
    found: dict[int, list[tuple[str, int]]] = {}
    for kind in SYSV_KINDS:
        for ident, uid, cuid in _sysv_rows(kind):
            if uid in owners or cuid in owners:
                found.setdefault(uid if uid in owners else cuid, []).append((kind, ident))
    for uid, objects in found.items():
        with contextlib.suppress(OSError, subprocess.SubprocessError):  # counted below
            subprocess.run(
                ["/bin/true"],
                preexec_fn=functools.partial(_remove_as, _libc(), uid, tuple(objects)),
                check=False,
                timeout=30,
            )
    listed = {(kind, ident) for kind in SYSV_KINDS for ident, _, _ in _sysv_rows(kind)}
    return sum(1 for objects in found.values() for o in objects if o not in listed)


def _remove_as(libc: ctypes.CDLL, uid: int, objects: tuple[tuple[str, int], ...]) -> None:
    """In the child: become `uid` (its objects' owner or creator), remove them."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    for kind, ident in objects:
        if kind == "shm":
            libc.shmctl(ident, IPC_RMID, None)
        elif kind == "sem":
            libc.semctl(ident, 0, IPC_RMID)
        else:
            libc.msgctl(ident, IPC_RMID, None)


def _sysv_rows(kind: str) -> list[tuple[int, int, int]]:
    """(id, uid, cuid) of each object in /proc/sysvipc/`kind`: this IPC namespace's."""
    try:
        with open(f"{SYSVIPC}/{kind}") as f:  # noqa: PTH123
            header, *rows = f.read().splitlines()
    except (OSError, ValueError):
        return []
    columns = header.split()
    try:
        at_uid, at_cuid = columns.index("uid"), columns.index("cuid")
    except ValueError:
        return []
    found = []
    for row in rows:
        fields = row.split()
        with contextlib.suppress(IndexError, ValueError):
            found.append((int(fields[1]), int(fields[at_uid]), int(fields[at_cuid])))
    return found
