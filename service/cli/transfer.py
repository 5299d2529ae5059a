"""Moving files between this machine and the server's artifact store, streamed both ways.

A file is hashed first and uploaded only when the store (for this tenant) does not have it
(HEAD first): a second submit of the same 200 MB input sends nothing. A directory travels as one
deterministic tar (sorted names, zero mtimes: service/cas/tree.py), hashed in one pass and sent
in a second, identical one. Downloads go to a temporary file beside the target and are renamed
into place only once their digest matches the name.
"""

import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from service.cas import tree
from service.cli.client import Client, CliError, result

CHUNK = 1 << 20


def _file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def _digest(chunks: Iterator[bytes]) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    for chunk in chunks:
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


def upload(client: Client, path: Path, *, tenant: str | None) -> dict[str, Any]:
    """Upload a file or a directory unless the store has it: {name, sha256, kind, size, sent}."""
    if not path.exists():
        raise CliError(f"{path}: no such file or directory")
    kind = "dir" if path.is_dir() else "file"

    def chunks() -> Iterator[bytes]:
        return tree.iter_tar(path) if kind == "dir" else _file_chunks(path)

    try:
        sha, size = _digest(chunks())
    except (OSError, ValueError) as exc:
        raise CliError(f"{path}: {exc}") from None
    params = {"tenant": tenant} if tenant else {}
    head = client.request("HEAD", f"/api/v1/cas/{sha}", params=params)
    sent = 0
    if head.status_code == 404:
        resp = client.request(
            "PUT", f"/api/v1/cas/{sha}", params=params, content=chunks(), timeout=None
        )
        result(resp)
        sent = size
    elif head.status_code != 200:
        result(head)
    name = path.resolve().name
    return {"name": name, "sha256": sha, "kind": kind, "size": size, "sent": sent}


def download(client: Client, sha: str, dest: Path, *, tenant: str | None = None) -> int:
    """Fetch the blob `sha` into `dest` (verified, then renamed into place); its size."""
    params = {"tenant": tenant} if tenant else {}
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    h = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(fd, "wb") as out, client.stream("GET", f"/api/v1/cas/{sha}", params) as r:
            if r.status_code >= 400:
                r.read()
                result(r)
            for chunk in r.iter_bytes(CHUNK):
                h.update(chunk)
                size += len(chunk)
                out.write(chunk)
        if h.hexdigest() != sha:
            raise CliError(f"{sha}: the server sent bytes that hash to {h.hexdigest()}")
        Path(tmp).replace(dest)
    except httpx.HTTPError as exc:
        raise CliError(f"{sha}: the download broke off ({exc})", 3) from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return size
