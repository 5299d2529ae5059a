"""Fixtures for the artifact store tests: blobs, a local store, an HTTP remote and an S3 server."""

import contextlib
import hashlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.cas.http import HttpStore
from service.cas.local import LocalStore
from tests.cas.server import TOKEN, CasApp, serving


def blob(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def chunked(data: bytes, size: int = 300_000) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def collect(stream: AsyncIterator[bytes], out: bytearray | None = None) -> bytes:
    """Everything the stream yields; `out` keeps what came before an error."""
    out = bytearray() if out is None else out
    async for chunk in stream:
        out += chunk
    return bytes(out)


def flip_byte(path: Path, offset: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def local(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "cas")


@dataclass
class Remote:
    """An HTTP store server over `backing`, and a client of it."""

    app: CasApp
    url: str
    backing: LocalStore
    client: HttpStore


@contextlib.asynccontextmanager
async def remote_server(root: Path, *, verify: bool = True) -> AsyncIterator[Remote]:
    backing = LocalStore(root)
    app = CasApp(backing, verify=verify)
    async with serving(app) as url:
        client = HttpStore(url, headers={"Authorization": f"Bearer {TOKEN}"})
        try:
            yield Remote(app, url, backing, client)
        finally:
            await client.aclose()


@pytest.fixture
async def remote(tmp_path: Path) -> AsyncIterator[Remote]:
    async with remote_server(tmp_path / "remote") as r:
        yield r
