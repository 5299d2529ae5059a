"""The job's uid has a name (SPEC section 4): `id -un`, `getent passwd $(id -u)` and `$USER` agree.

A uid from `--uid-range` usually has no entry in the host's /etc/passwd, and tools that look the
user up (ssh, git's author, pip's cache, getpass) then fail. With namespaces, each job sees
/etc/passwd and /etc/group of its own: the host's, with an entry `berth-job-<uid>` (or the host's
name for the uid, when it has one) whose home is the job's folder, made by the worker and bound
over them in the job's mount namespace. Without namespaces the worker adds `berth-job-<uid>`
entries for the whole range to the host's files once, at start (home /nonexistent, shell
nologin: nobody logs in as them); a job's $HOME is its folder all the same.
"""

import fcntl
import os
import pwd
from collections.abc import Iterable
from pathlib import Path

ETC = Path("/etc")
FALLBACK_HOME = "/nonexistent"
FALLBACK_SHELL = "/usr/sbin/nologin"


def job_name(uid: int) -> str:
    return f"berth-job-{uid}"


def name_of(uid: int) -> str:
    """The host's name for `uid`, else the name berth gives a job's uid."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return job_name(uid)


def for_job(*, uid: int, gid: int, name: str, home: Path, etc: Path = ETC) -> tuple[bytes, bytes]:
    """The job's own /etc/passwd and /etc/group: the host's, with the job's uid as `name`.

    The host's entry for the uid, if any, gives way to the job's (its home is the job's folder).
    """
    passwd = [
        line
        for line in _read(etc / "passwd")
        if _field(line, 2) != str(uid) and _field(line, 0) != name
    ]
    passwd.append(f"{name}:x:{uid}:{gid}:berth job:{home}:/bin/sh")
    group = _read(etc / "group")
    if not any(_field(line, 2) == str(gid) for line in group):
        group.append(f"{name}:x:{gid}:")
    return _text(passwd), _text(group)


def add_to_host(uids: Iterable[int], etc: Path = ETC) -> int:
    """Add `berth-job-<uid>` to the host's passwd and group for each uid that has no entry.

    Appended under the lock shadow-utils (useradd, lckpwdf) take, so a concurrent useradd or
    another worker never interleaves with it. Returns how many users were added.
    """
    lock = os.open(etc / ".pwd.lock", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        passwd, group = _read(etc / "passwd"), _read(etc / "group")
        taken_uids = {_field(line, 2) for line in passwd}
        taken_gids = {_field(line, 2) for line in group}
        names = {_field(line, 0) for line in passwd} | {_field(line, 0) for line in group}
        users, groups = [], []
        for uid in uids:
            name = job_name(uid)
            if str(uid) in taken_uids or name in names:
                continue
            users.append(f"{name}:x:{uid}:{uid}:berth job:{FALLBACK_HOME}:{FALLBACK_SHELL}")
            if str(uid) not in taken_gids:
                groups.append(f"{name}:x:{uid}:")
        _append(etc / "group", groups)  # the group first: a user never names a missing group
        _append(etc / "passwd", users)
        return len(users)
    finally:
        os.close(lock)


def _read(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def _field(line: str, index: int) -> str:
    parts = line.split(":")
    return parts[index] if len(parts) > index else ""


def _text(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def _append(path: Path, lines: list[str]) -> None:
    if not lines:
        return
    # In place (O_APPEND), not a rename: in a container /etc/passwd may be a bind-mounted file.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_size and not path.read_bytes().endswith(b"\n"):
            os.write(fd, b"\n")
        os.write(fd, _text(lines))
    finally:
        os.close(fd)
