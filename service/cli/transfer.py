"""Moving files between this machine and the server's artifact store, streamed both ways.

A file is hashed first and uploaded only when the store (for this tenant) does not have it
(HEAD first): a second submit of the same 200 MB input sends nothing. A directory travels as one
deterministic tar (sorted names, zero mtimes: service/cas/tree.py), hashed in one pass and sent
in a second, identical one. Downloads go to a temporary file beside the target and are renamed
into place only once their digest matches the name.
"""

import contextlib
import hashlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from service.cas import files, tree
from service.cas.files import CHUNK
from service.cli import progress
from service.cli.client import CliError
from service.client import BerthClient, Unreachable
from service.core.exits import Exit


@dataclass(frozen=True)
class Uploaded:
    """A file or directory in the store: its name here, digest, kind, size and bytes sent."""

    name: str
    sha256: str
    kind: Literal["file", "dir"]
    size: int
    sent: int  # 0 when the store had it already


def upload(client: BerthClient, path: Path, *, tenant: str | None) -> Uploaded:
    """Upload a file or a directory unless the store (for the tenant) has it."""
    if not path.exists():
        raise CliError(f"{path}: no such file or directory")
    kind: Literal["file", "dir"] = "dir" if path.is_dir() else "file"
    try:
        if kind == "dir":
            sha, size = files.hash_chunks(tree.iter_tar(path))
        else:
            sha, size = files.hash_file(path)
    except (OSError, ValueError) as exc:
        raise CliError(f"{path}: {exc}") from None
    sent = 0
    if not client.has_blob(sha, tenant=tenant):
        with contextlib.ExitStack() as stack:
            chunks = tree.iter_tar(path) if kind == "dir" else _read(stack, path)
            advance = stack.enter_context(progress.bar(f"{path.name} ↑", size))
            client.put_blob(sha, progress.counted(chunks, advance), tenant=tenant)
        sent = size
    return Uploaded(name=path.resolve().name, sha256=sha, kind=kind, size=size, sent=sent)


def download(client: BerthClient, sha: str, dest: Path | None, *, tenant: str | None = None) -> int:
    """Fetch the blob `sha`; its size.

    Into `dest` (verified, then renamed into place), or to stdout when `dest` is None (the last
    chunk held back until the digest is known, so a wrong blob never arrives whole).
    """
    try:
        with client.blob(sha, tenant=tenant) as blob:
            name = dest.name if dest is not None else sha[:12]
            with progress.bar(f"{name} ↓", blob.size) as advance:
                chunks = progress.counted(blob, advance)
                if dest is None:
                    size = _verified(chunks, sha, sys.stdout.buffer.write)
                    sys.stdout.buffer.flush()
                    return size
                return _to_file(chunks, sha, dest)
    except Unreachable as exc:
        if not exc.lost:
            raise  # never connected: said as for any command
        raise CliError(
            f"the download of {sha} was cut short ({type(exc.__cause__).__name__}): "
            "the server found the blob corrupt, or went away",
            Exit.UNREACHABLE,
        ) from None


def _read(stack: contextlib.ExitStack, path: Path) -> Iterator[bytes]:
    """The file's bytes in CHUNK pieces, closed with `stack`."""
    f = stack.enter_context(path.open("rb"))
    return iter(lambda: f.read(CHUNK), b"")


def _verified(chunks: Iterator[bytes], sha: str, sink: Callable[[bytes], object]) -> int:
    """Pass `chunks` to `sink`, holding the last back until the digest is known; the size."""
    digest = hashlib.sha256()
    held: bytes | None = None
    size = 0
    for chunk in chunks:
        digest.update(chunk)
        size += len(chunk)
        if held is not None:
            sink(held)
        held = chunk
    if digest.hexdigest() != sha:
        raise CliError(
            f"blob {sha} is corrupt: it hashes to {digest.hexdigest()}", Exit.SERVER_ERROR
        )
    if held is not None:
        sink(held)
    return size


def _to_file(chunks: Iterator[bytes], sha: str, dest: Path) -> int:
    """Write to a temporary file beside `dest`, renamed over it once verified."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    except OSError as exc:
        raise CliError(f"cannot write {dest}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            size = _verified(chunks, sha, out.write)
        Path(tmp).replace(dest)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return size
