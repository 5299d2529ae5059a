"""A reference server for the HTTP store contract (service/cas/http.py) over a LocalStore.

A bare ASGI app, so the wire behaviour is spelled out in full, served by uvicorn on 127.0.0.1 in
the test's own event loop. The listening socket is bound before the server task starts, so a
client may connect at once: the kernel queues it until uvicorn accepts (no waiting for startup).
"""

import asyncio
import contextlib
import json
import re
import socket
from collections.abc import AsyncIterator

import uvicorn

from service.cas import base, files
from service.cas.local import LocalStore

TOKEN = "secret-token"
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


class CasApp:
    """`verify=False` serves whole blobs raw (to test the client's own check)."""

    def __init__(self, store: LocalStore, *, verify: bool = True) -> None:
        self.store = store
        self.verify = verify
        self.requests: list[tuple[str, str]] = []

    async def __call__(self, scope, receive, send) -> None:
        assert scope["type"] == "http"
        method, path = scope["method"], scope["path"]
        self.requests.append((method, path))
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if headers.get("authorization") != f"Bearer {TOKEN}":
            await _drain(receive)
            await _json(send, 401, {"error": "who are you?"})
            return
        name = path.removeprefix("/cas/")
        if method == "GET" and name == ".id":
            await _send(send, 200, [(b"content-type", b"text/plain")], await self.store.id())
        elif method == "GET" and name == ".list":
            await self._list(send)
        elif not re.fullmatch(r"[0-9a-f]{64}", name):
            await _drain(receive)
            await _json(send, 400 if name else 404, {"error": f"not a blob name: {name!r}"})
        elif method == "HEAD":
            size = await self.store.stat(name)
            if size is None:
                await _send(send, 404, [], b"", length=0)
            else:
                await _send(send, 200, [], b"", length=size)
        elif method == "GET":
            await self._get(send, name, headers.get("range"))
        elif method == "PUT":
            await self._put(receive, send, name)
        elif method == "DELETE":
            found = await self.store.delete(name)
            await _send(send, 204 if found else 404, [], b"")
        else:
            await _json(send, 405, {"error": "method not allowed"})

    async def _put(self, receive, send, name: str) -> None:
        existed = await self.store.stat(name) is not None
        try:
            sha, size = await self.store.put(_body(receive), sha256=name)
        except base.Corrupt as exc:  # the store read the whole body before it could tell
            await _json(send, 422, {"error": str(exc)})
            return
        await _json(send, 200 if existed else 201, {"sha256": sha, "size": size})

    async def _get(self, send, name: str, range_header: str | None) -> None:
        size = await self.store.stat(name)
        if size is None:
            await _json(send, 404, {"error": f"no blob {name}"})
            return
        if range_header is None:
            if self.verify:
                chunks = self.store.get(name)
            else:
                chunks = files.read_chunks(self.store.path(name))
            await _stream(send, 200, [], chunks, size)
            return
        m = _RANGE.fullmatch(range_header.strip())
        if m is None:
            await _json(send, 400, {"error": f"bad range {range_header!r}"})
            return
        start = int(m[1])
        if start >= size:
            await _send(send, 416, [(b"content-range", f"bytes */{size}".encode())], b"")
            return
        end = min(int(m[2]) + 1, size) if m[2] else size
        extra = [(b"content-range", f"bytes {start}-{end - 1}/{size}".encode())]
        chunks = self.store.get(name, start=start, end=end)
        await _stream(send, 206, extra, chunks, end - start)

    async def _list(self, send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain")],
            }
        )
        async for name, size in self.store.list():
            line = f"{name} {size}\n".encode()
            await send({"type": "http.response.body", "body": line, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


async def _body(receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("client went away")
        yield message.get("body", b"")
        if not message.get("more_body"):
            return


async def _drain(receive) -> None:
    async for _ in _body(receive):
        pass


async def _send(send, status: int, headers, body: bytes | str, *, length: int | None = None):
    data = body.encode() if isinstance(body, str) else body
    n = len(data) if length is None else length
    headers = [*headers, (b"content-length", str(n).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _json(send, status: int, obj) -> None:
    await _send(send, status, [(b"content-type", b"application/json")], json.dumps(obj))


async def _stream(send, status: int, headers, chunks, length: int) -> None:
    headers = [*headers, (b"content-length", str(length).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


@contextlib.asynccontextmanager
async def serving(app: CasApp) -> AsyncIterator[str]:
    """Run `app` until the block ends, yielding its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{port}/cas"
    finally:
        server.should_exit = True
        await task
        sock.close()
