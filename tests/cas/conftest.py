"""Fixtures for the artifact store tests: blobs, a local store, an HTTP remote and an S3 server."""

import contextlib
import hashlib
import logging
import os
import random
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.cas.http import HttpStore
from service.cas.local import LocalStore
from tests.cas.server import TOKEN, CasApp, serving

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


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


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 for the session, with fake credentials in the env."""
    from moto.server import ThreadedMotoServer

    saved = {k: os.environ.get(k) for k in S3_ENV}
    os.environ.update(S3_ENV)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    """A new, empty bucket."""
    import boto3

    name = f"berth-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    client.close()
    return name
