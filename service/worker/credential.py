"""The worker's own credential, kept 0600 in its state directory.

A node that joined with a one-time join token gets a credential of its own, and the server
rotates it over the socket. It is kept here, written atomically (a crash never leaves half a
token), and a stored credential wins over BERTH_TOKEN: after a rotation the one in the
environment is retired.
"""

import contextlib
import os
from pathlib import Path

FILE = "credential"


def load(home: Path) -> str:
    """The stored credential, or "" when there is none."""
    try:
        return (home / FILE).read_text().strip()
    except FileNotFoundError:
        return ""


def store(home: Path, token: str) -> None:
    """Keep `token`: a temp file (0600 from its creation), fsynced, renamed into place."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = home / f".{FILE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(home / FILE)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
