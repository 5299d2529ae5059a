"""The worker's own credential, kept 0600 in its state directory (`berth worker --home DIR`).

A node that joined with a one-time join token gets a credential of its own, and the server
rotates it over the socket. It is kept here, written atomically (a crash never leaves half a
token), beside what it came from: the sha256 of the credential the worker was started with (the
join token it traded, or the token its first rotation replaced), and the worker's name.

At start (`choose`), the stored credential and the one given (BERTH_TOKEN or BERTH_JOIN_TOKEN)
must agree: the same credential, or the given one is where the stored one came from (the same
join token, given again after a restart). Anything else is an error naming both, never a silent
choice: a second worker on the host given its own token must not attach as the first.
"""

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

FILE = "credential"
META = "credential.json"  # {"name": ..., "origin": sha256 hex}: never a secret
JOIN_PREFIX = "brj_"


@dataclass(frozen=True, slots=True)
class Stored:
    token: str
    name: str  # the worker it attached as ("" when not known yet)
    origin: str  # sha256 hex of the credential the worker was first given ("" when not known)


class Disagree(Exception):
    """A stored credential and the one given are not the same worker's."""


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def shown(token: str) -> str:
    """A credential named without its secret: its kind and first characters."""
    kind = "join token" if token.startswith(JOIN_PREFIX) else "token"
    return f"{kind} {token[:8]}…"


def load(home: Path) -> Stored | None:
    """The stored credential, or None when there is none."""
    try:
        token = (home / FILE).read_text().strip()
    except FileNotFoundError:
        return None
    if not token:
        return None
    meta: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError):
        found = json.loads((home / META).read_text())
        meta = found if isinstance(found, dict) else {}
    return Stored(token=token, name=str(meta.get("name", "")), origin=str(meta.get("origin", "")))


def choose(home: Path, given: str, *, given_as: str = "BERTH_TOKEN") -> tuple[str, str]:
    """The credential to attach with, and the origin to keep with its successors.

    Raises Disagree naming both (by name and first characters) when they are not the same
    worker's.
    """
    stored = load(home)
    if stored is None:
        return given, digest(given) if given else ""
    if not given or given == stored.token or digest(given) == stored.origin:
        return stored.token, stored.origin or digest(stored.token)
    who = f"worker {stored.name}" if stored.name else shown(stored.token)
    raise Disagree(
        f"{home / FILE} holds the credential of {who}, and {given_as} is another "
        f"({shown(given)}): unset {given_as} to run as {stored.name or 'that worker'}, or give "
        "this worker a state directory of its own (berth worker --home DIR)"
    )


def store(home: Path, token: str, *, name: str = "", origin: str = "") -> None:
    """Keep `token`: temp files (0600 from their creation), fsynced, renamed into place."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    # The description first: a crash between the two leaves the new credential described.
    _write(home, META, json.dumps({"name": name, "origin": origin}))
    _write(home, FILE, token)


def _write(home: Path, name: str, text: str) -> None:
    tmp = home / f".{name}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(home / name)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
