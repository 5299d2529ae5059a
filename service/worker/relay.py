"""The worker's side of a job's relay: a Unix socket in the job's own 0700 folder.

A job's `berth` command and its runtime (`emit`, `save_artifact`, `load_artifact`) talk to its
worker here, one request per connection, proving the lease's secret. The worker acts while the
lease is live and refuses once it ended: API calls go to the server over the worker's socket and
the server runs them as `job:<id>` with a member's powers in the job's tenant; artifacts go
to the store directly, and the server references them for the job's tenant (fenced by lease).

Nothing the job sends is trusted: the secret is compared in constant time, a request line is
capped, a `save` is exactly `size` bytes and all of a job's saves together at most
`max_save` ([executor] relay_max_save_gb, from the welcome), and a `load` is answered only for
an artifact the job's tenant holds (the server checks, as the job).
"""

import asyncio
import contextlib
import hmac
import json
import math
import os
import secrets as stdlib_secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosed

from service import protocol
from service.cas.base import CasError, Store, check_name
from service.cas.files import CHUNK
from service.core.bounds import RELAY_MAX_SAVE_GB, gb_bytes, shown_bytes

MAX_LINE = 1 << 20

ApiCall = Callable[[str, str, Any], Awaitable[tuple[int, Any]]]  # (method, path, body)


@dataclass
class Relay:
    """One job's relay. `api` relays a call to the server as the job; `emit`/`saved` report."""

    socket_path: Path
    store: Store | None
    api: ApiCall
    emit: Callable[[dict[str, float]], bool]  # False: the outbox is full, try later
    saved: Callable[[str, int], Awaitable[bool]]  # True once the server referenced it
    # What this job may save through its relay, all saves together ([executor]
    # relay_max_save_gb, from the welcome).
    max_save: int = gb_bytes(RELAY_MAX_SAVE_GB)
    secret: str = field(default_factory=lambda: stdlib_secrets.token_urlsafe(32))
    live: bool = True
    _saved: int = 0  # bytes of the saves taken so far (counted when each begins)
    _server: asyncio.base_events.Server | None = None
    _open: set[asyncio.StreamWriter] = field(default_factory=set)

    async def start(self, uid: int, gid: int) -> None:
        """Listen in the job's folder; only the job's user may connect (the folder is 0700)."""
        self.socket_path.parent.mkdir(mode=0o700, exist_ok=True)
        os.chown(self.socket_path.parent, uid, gid)
        self._server = await asyncio.start_unix_server(
            self._handle, path=str(self.socket_path), limit=MAX_LINE
        )
        os.chown(self.socket_path, uid, gid)

    async def close(self) -> None:
        """The lease ended: refuse from now on, stop listening, drop open connections.

        A process the job left behind may hold a connection open without a word; closing it
        here keeps the end of the job from waiting on it.
        """
        self.live = False
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.close()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):  # (an OSError: the socket is gone anyway)
                await asyncio.wait_for(self._server.wait_closed(), timeout=CLOSE_TIMEOUT)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= MAX_CONNECTIONS:
            await _answer(writer, {"error": f"at most {MAX_CONNECTIONS} relay calls at once"})
            writer.close()
            return
        self._open.add(writer)
        try:
            await self._serve(reader, writer)
        except (ValueError, KeyError, TypeError, asyncio.LimitOverrunError) as exc:
            await _answer(writer, {"error": f"bad request: {exc}"})
        except (CasError, ConnectionError, OSError) as exc:
            await _answer(writer, {"error": str(exc)})
        except (TimeoutError, asyncio.IncompleteReadError):
            pass  # a request that never came whole: nothing to answer
        finally:
            self._open.discard(writer)
            with contextlib.suppress(OSError):  # TimeoutError and a reset peer among them
                writer.close()
                await asyncio.wait_for(writer.wait_closed(), timeout=CLOSE_TIMEOUT)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await asyncio.wait_for(reader.readuntil(b"\n"), timeout=READ_TIMEOUT)
        request = json.loads(line)
        if not isinstance(request, dict) or not hmac.compare_digest(
            str(request.get("secret", "")), self.secret
        ):
            await _answer(writer, {"error": "refused: this relay is another job's"})
            return
        if not self.live:
            await _answer(writer, {"error": "the job's lease has ended: the relay refuses"})
            return
        match request.get("op"):
            case "emit":
                values = _metrics(request["values"])
                if not self.emit(values):
                    await _answer(writer, {"error": "the worker is behind on reports; emit later"})
                    return
                await _answer(writer, {"ok": True})
            case "api":
                status, body = await self.api(
                    str(request["method"]), str(request["path"]), request.get("body")
                )
                await _answer(writer, {"status": status, "body": body})
            case "save":
                await self._save(int(request["size"]), reader, writer)
            case "load":
                await self._load(check_name(str(request["ref"])), writer)
            case other:
                await _answer(writer, {"error": f"unknown op {other!r}"})

    async def _save(
        self, size: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self.store is None:
            await _answer(writer, {"error": "this worker reaches no artifact store"})
            return
        if size < 0:
            raise ValueError("size must be >= 0")
        if self._saved + size > self.max_save:
            # Security: a job's saves are bounded, so one job cannot fill the store all tenants
            # share; the size is checked before a byte of the body is read.
            await _answer(
                writer,
                {
                    "error": f"this save of {shown_bytes(size)} would pass "
                    f"executor.relay_max_save_gb = {shown_bytes(self.max_save)}, what one job may "
                    f"save through its relay (it saved {shown_bytes(self._saved)} so far); "
                    "nothing was saved"
                },
            )
            return
        self._saved += size  # counted before the put: saves running at once cannot pass it
        try:
            sha, stored = await self.store.put(_exactly(reader, size))
        except BaseException:
            self._saved -= size
            raise
        if not await self.saved(sha, stored):
            await _answer(writer, {"error": "the artifact could not be referenced (lease ended?)"})
            return
        await _answer(writer, {"ref": sha, "size": stored})

    async def _load(self, ref: str, writer: asyncio.StreamWriter) -> None:
        if self.store is None:
            await _answer(writer, {"error": "this worker reaches no artifact store"})
            return
        status, _ = await self.api("HEAD", f"/api/v1/cas/{ref}", None)
        size = await self.store.stat(ref) if status == 200 else None
        if size is None:  # the job's tenant holds no such artifact: the same as none at all
            await _answer(writer, {"error": f"no artifact {ref}"})
            return
        await _answer(writer, {"size": size})
        async with contextlib.aclosing(self.store.get(ref)) as chunks:
            async for chunk in chunks:
                writer.write(chunk)
                await writer.drain()


def _metrics(raw: Any) -> dict[str, float]:  # noqa: ANN401  (the job's JSON)
    """The job's metrics, as the server will take them; ValueError saying what is wrong."""
    values = {str(k): float(v) for k, v in dict(raw).items()}
    if bad := [k for k, v in values.items() if not math.isfinite(v)]:
        raise ValueError(f"metric {bad[0]!r} is not a finite number")
    why = protocol.refusal(protocol.Metrics(seq=1, job=1, epoch=1, values=values))
    if why is not None:
        raise ValueError(f"metrics refused: {why}")
    return values


async def _exactly(reader: asyncio.StreamReader, size: int) -> AsyncIterator[bytes]:
    left = size
    while left > 0:
        chunk = await reader.read(min(CHUNK, left))
        if not chunk:
            raise ConnectionError("the job closed the relay before sending the whole artifact")
        left -= len(chunk)
        yield chunk


async def _answer(writer: asyncio.StreamWriter, answer: dict[str, Any]) -> None:
    writer.write(json.dumps(answer).encode() + b"\n")
    await writer.drain()


RELAY_TIMEOUT = 60.0  # seconds a job's relayed call may wait for the server
READ_TIMEOUT = 30.0  # seconds a job has to send its request line
CLOSE_TIMEOUT = 2.0  # seconds the end of a lease waits for the relay's connections to close
MAX_CONNECTIONS = 8  # relay calls of one job at once (each may hold a MAX_LINE buffer)


@dataclass
class Calls:
    """Jobs' API calls on their way to the server over the worker's socket, by id."""

    ws: Any = None  # this session's connection; None between sessions
    _seq: int = 0
    _waiting: dict[int, "asyncio.Future[protocol.RelayResponse]"] = field(default_factory=dict)

    async def call(
        self,
        job: int,
        epoch: int,
        method: str,
        path: str,
        body: Any,  # noqa: ANN401
    ) -> tuple[int, Any]:
        """(status, JSON body) of the call, run by the server as `job:<job>`."""
        ws = self.ws
        if ws is None:
            return 503, {"error": "the worker is not connected to a server right now"}
        self._seq += 1
        ask = protocol.RelayRequest(
            id=self._seq,
            job=job,
            epoch=epoch,
            # The job may name any method: the server's decoder refuses one it does not offer.
            method=method,  # type: ignore[arg-type]
            path=path,
            body=json.dumps(body).encode() if body is not None else b"",
        )
        if (why := protocol.refusal(ask)) is not None:
            return 400, {"error": f"the worker refused to relay this call: {why}"}
        answer: asyncio.Future[protocol.RelayResponse] = asyncio.get_running_loop().create_future()
        self._waiting[ask.id] = answer
        try:
            await ws.send(protocol.encode(ask).decode())
            got = await asyncio.wait_for(answer, timeout=RELAY_TIMEOUT)
        except (TimeoutError, ConnectionError, OSError):
            return 503, {"error": "the server did not answer the relayed call"}
        except ConnectionClosed as exc:  # the socket closed under the call
            return 503, {"error": f"the worker lost the server: {exc}"}
        finally:
            self._waiting.pop(ask.id, None)
        try:
            return got.status, json.loads(got.body) if got.body else None
        except ValueError:
            return got.status, None

    def answered(self, frame: protocol.RelayResponse) -> None:
        if (waiting := self._waiting.get(frame.id)) is not None and not waiting.done():
            waiting.set_result(frame)
