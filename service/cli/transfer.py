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
from pathlib import Path
from typing import Any

import httpx

from service.cas import files, tree
from service.cas.files import CHUNK
from service.cli import progress
from service.cli.client import Client, CliError
from service.core.exits import Exit


def upload(client: Client, path: Path, *, tenant: str | None) -> dict[str, Any]:
    """Upload a file or a directory unless the store has it: {name, sha256, kind, size, sent}."""
    if not path.exists():
        raise CliError(f"{path}: no such file or directory")
    kind = "dir" if path.is_dir() else "file"
    try:
        if kind == "dir":
            sha, size = files.hash_chunks(tree.iter_tar(path))
        else:
            sha, size = files.hash_file(path)
    except (OSError, ValueError) as exc:
        raise CliError(f"{path}: {exc}") from None
    params = {"tenant": tenant} if tenant else {}
    head = client.request("HEAD", f"/api/v1/cas/{sha}", params=params)
    sent = 0
    if head.status_code == 404:
        with contextlib.ExitStack() as stack:
            chunks = tree.iter_tar(path) if kind == "dir" else _read(stack, path)
            advance = stack.enter_context(progress.bar(f"{path.name} ↑", size))
            resp = client.request(
                "PUT",
                f"/api/v1/cas/{sha}",
                params=params,
                content=progress.counted(chunks, advance),
                timeout=None,
            )
        client.result(resp)
        sent = size
    elif head.status_code != 200:
        client.result(head)
    name = path.resolve().name
    return {"name": name, "sha256": sha, "kind": kind, "size": size, "sent": sent}


def download(client: Client, sha: str, dest: Path | None, *, tenant: str | None = None) -> int:
    """Fetch the blob `sha`; its size.

    Into `dest` (verified, then renamed into place), or to stdout when `dest` is None (the last
    chunk held back until the digest is known, so a wrong blob never arrives whole).
    """
    params = {"tenant": tenant} if tenant else {}
    try:
        with client.stream("GET", f"/api/v1/cas/{sha}", params) as r:
            if r.status_code >= 400:
                r.read()
                client.result(r)
            total = r.headers.get("content-length")
            name = dest.name if dest is not None else sha[:12]
            with progress.bar(f"{name} ↓", int(total) if total else None) as advance:
                chunks = progress.counted(r.iter_bytes(CHUNK), advance)
                if dest is None:
                    size = _verified(chunks, sha, sys.stdout.buffer.write)
                    sys.stdout.buffer.flush()
                    return size
                return _to_file(chunks, sha, dest)
    except httpx.HTTPError as exc:
        raise CliError(
            f"the download of {sha} was cut short ({type(exc).__name__}): "
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
