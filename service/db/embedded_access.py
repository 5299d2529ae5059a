"""Who the embedded Postgres runs as, and the folders it must reach (service/db/embedded.py).

As root, Postgres runs as PG_USER with that user's group and no other, and its data lives under
DATA_ROOT, a folder only root may write. Every folder on the way to its data and to the
wheel's programs must let it pass (x, never more).
"""

import contextlib
import grp
import os
import pwd
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from service.core.errors import Unavailable

PG_USER = "embedded_postgres"  # whom Postgres runs as when berth runs as root
DATA_ROOT = Path("/var/lib/berth/postgres")  # as root: the data folders, one per home


@dataclass(frozen=True)
class RunAs:
    """The identity Postgres runs under: PG_USER and its own group when root, else ourselves."""

    uid: int
    gid: int

    @property
    def switch(self) -> bool:
        return self.uid != os.geteuid()


def data_root() -> None:
    """/var/lib/berth/postgres: root's, 0711 (Postgres passes through; nobody else lists)."""
    try:
        DATA_ROOT.parent.mkdir(mode=0o755, parents=True, exist_ok=True)  # the worker's too
        with contextlib.suppress(FileExistsError):
            DATA_ROOT.mkdir(mode=0o711)
    except OSError as exc:
        raise Unavailable(
            f"cannot make {DATA_ROOT} for the embedded Postgres' data ({exc.strerror}): "
            "set [database] url, or run berth serve as a user other than root"
        ) from None
    # Security: a folder someone else may write to could swap a data folder for one of theirs.
    for folder in (DATA_ROOT.parent, DATA_ROOT):
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
            raise Unavailable(
                f"refusing {folder} for the embedded Postgres: not a folder only root may write"
            )
    DATA_ROOT.chmod(0o711)


def pg_ids() -> RunAs | None:
    """PG_USER's uid and the group Postgres runs with (that name's, else the user's primary).

    None when there is no such user.
    """
    try:
        entry = pwd.getpwnam(PG_USER)
    except KeyError:
        return None
    try:
        gid = grp.getgrnam(PG_USER).gr_gid
    except KeyError:
        gid = entry.pw_gid
    return RunAs(entry.pw_uid, gid)


def run_as() -> RunAs:
    if os.geteuid() != 0:
        return RunAs(os.geteuid(), os.getegid())
    ids = pg_ids()
    if ids is None:
        # Postgres refuses to run as root: it gets a system user with a group of its own.
        r = subprocess.run(
            [
                *("useradd", "--system", "--user-group", "--no-create-home"),
                *("--shell", "/usr/sbin/nologin", PG_USER),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0:
            raise Unavailable(
                f"cannot create the user {PG_USER} for the embedded Postgres: "
                f"{last_line(r.stderr) or r.returncode}"
            ) from None
        ids = pg_ids()
        assert ids is not None, "useradd succeeded"
    return ids


def reachable(path: Path, who: RunAs) -> None:
    """Every folder from / down to `path` lets `who` pass through (x only, never list)."""
    for folder in [*reversed(path.parents), path]:
        info = folder.stat()
        if info.st_uid == who.uid:
            bit = stat.S_IXUSR
        elif info.st_gid == who.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            folder.chmod(stat.S_IMODE(info.st_mode) | stat.S_IXOTH)


def readable_tree(top: Path) -> None:
    """The wheel's programs and libraries readable (and runnable) by Postgres' user."""
    for folder, dirs, files in os.walk(top):
        for name in [".", *dirs]:
            _add_mode(Path(folder) / name, stat.S_IROTH | stat.S_IXOTH)
        for name in files:
            path = Path(folder) / name
            extra = stat.S_IXOTH if path.stat().st_mode & stat.S_IXUSR else 0
            _add_mode(path, stat.S_IROTH | extra)


def _add_mode(path: Path, bits: int) -> None:
    mode = stat.S_IMODE(path.lstat().st_mode)
    if mode & bits != bits and not path.is_symlink():
        path.chmod(mode | bits)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
