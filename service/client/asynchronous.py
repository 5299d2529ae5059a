"""`AsyncBerthClient`: `BerthClient` (sync.py) for asyncio, method for method.

    async with AsyncBerthClient("https://berth.example:8443", token) as berth:
        job = await berth.submit_job(JobRequest(command=["echo", "hi"]))
        async for line in berth.follow_logs(job.id):
            ...

Requests are built and answers read by calls.py, as for `BerthClient`: only the waiting differs.
"""

import contextlib
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

from service import views
from service.client import calls, events
from service.client.bodies import JobRequest
from service.client.calls import Call, Encoding, WorkerOrder, answer
from service.client.connection import TIMEOUT, options
from service.client.errors import Unreachable, error_of
from service.client.sync import CHUNK
from service.events import JobEvent

T = TypeVar("T")


class AsyncBlob(AsyncIterator[bytes]):
    """A blob's bytes as they arrive (`async for` them), and its `size` when the server said it."""

    def __init__(self, chunks: AsyncIterator[bytes], size: int | None) -> None:
        self._chunks = chunks
        self.size = size

    async def __anext__(self) -> bytes:
        return await anext(self._chunks)


class AsyncBerthClient:
    """A connection to one berth server; close it (or use `with`) when done."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        ca: str | Path | None = None,
        timeout: httpx.Timeout | float = TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        given = options(url, token, headers=headers, ca=ca, timeout=timeout)
        self._http = httpx.AsyncClient(transport=transport, **given)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- the one way a call goes out -------------------------------------------------------

    async def call(self, call: Call[T], content: Any = None) -> T:  # noqa: ANN401
        """Send `call` (with a raw body `content`, if any) and read its answer."""
        try:
            response = await self._http.send(call.request(self._http, content))
        except httpx.HTTPError as exc:
            raise Unreachable(str(exc)) from exc
        return answer(call, response)

    @contextlib.asynccontextmanager
    async def _stream(self, call: Call[Any]) -> AsyncIterator[httpx.Response]:
        """The response of `call`, its body still to read; an error answer raises."""
        try:
            response = await self._http.send(call.request(self._http), stream=True)
        except httpx.HTTPError as exc:
            raise Unreachable(str(exc)) from exc
        try:
            if response.status_code >= 400:
                await response.aread()
                raise error_of(response)
            try:
                yield response
            except httpx.HTTPError as exc:  # broke off while the body was read
                raise Unreachable(str(exc), lost=True) from exc
        finally:
            await response.aclose()

    # -- health ----------------------------------------------------------------------------

    async def health(self) -> views.HealthView:
        return await self.call(calls.health())

    async def ready(self) -> views.HealthView:
        return await self.call(calls.ready())

    # -- jobs ------------------------------------------------------------------------------

    async def submit_job(self, job: JobRequest) -> views.JobView:
        return await self.call(calls.submit_job(job))

    async def submit_jobs(self, jobs: list[JobRequest]) -> views.JobIdsView:
        """Queue several jobs: all or none."""
        return await self.call(calls.submit_jobs(jobs))

    async def list_jobs(
        self, *, state: str | None = None, tenant: str | None = None, limit: int = 100
    ) -> list[views.JobView]:
        return await self.call(calls.list_jobs(state=state, tenant=tenant, limit=limit))

    async def job(self, job_id: int) -> views.JobView:
        return await self.call(calls.job(job_id))

    async def cancel_job(self, job_id: int) -> views.JobView:
        return await self.call(calls.cancel_job(job_id))

    async def logs(
        self, job_id: int, *, after: int = 0, encoding: Encoding = "text"
    ) -> views.LogsView:
        """Output so far, after chunk `after`."""
        return await self.call(calls.logs(job_id, after=after, encoding=encoding))

    async def follow_logs(
        self, job_id: int, *, after: int = 0, encoding: Encoding = "text"
    ) -> AsyncIterator[views.ChunkView | views.LogEndView]:
        """Chunks as the job writes them, then (last) how it ended."""
        async with self._stream(calls.follow_logs(job_id, after=after, encoding=encoding)) as r:
            async for line in r.aiter_lines():
                if line.strip():
                    yield calls.follow_line(line)

    def follow_events(
        self,
        job_id: int,
        *,
        after: int = 0,
        encoding: Encoding = "text",
        output: bool = True,
        give_up_after: float = events.GIVE_UP_AFTER,
    ) -> AsyncIterator[JobEvent]:
        """`BerthClient.follow_events`: `async for event in berth.follow_events(job_id): ...`."""
        return events.follow_async(
            self._http,
            job_id,
            after=after,
            encoding=encoding,
            output=output,
            give_up_after=give_up_after,
        )

    # -- workers and pools -----------------------------------------------------------------

    async def workers(self) -> list[views.WorkerView]:
        return await self.call(calls.workers())

    async def set_worker_state(self, name: str, order: WorkerOrder) -> views.WorkerStateView:
        return await self.call(calls.set_worker_state(name, order))

    async def remove_worker(self, name: str) -> views.RemovedView:
        return await self.call(calls.remove_worker(name))

    async def create_join_token(
        self,
        pool: str,
        *,
        name: str | None = None,
        labels: list[str] | None = None,
        tenants: list[str] | None = None,
        expires_seconds: float = 3600.0,
    ) -> views.JoinTokenView:
        return await self.call(
            calls.create_join_token(
                pool, name=name, labels=labels, tenants=tenants, expires_seconds=expires_seconds
            )
        )

    async def pools(self) -> list[views.PoolView]:
        return await self.call(calls.pools())

    async def status(self) -> views.StatusView:
        return await self.call(calls.status())

    # -- limits ----------------------------------------------------------------------------

    async def limits(self) -> list[views.LimitView]:
        return await self.call(calls.limits())

    async def set_limit(self, key: str, value: object, *, reason: str) -> views.LimitView:
        return await self.call(calls.set_limit(key, value, reason=reason))

    async def unset_limit(self, key: str) -> views.LimitUnsetView:
        return await self.call(calls.unset_limit(key))

    # -- tokens, secrets, audit ------------------------------------------------------------

    async def tokens(self) -> list[views.TokenView]:
        return await self.call(calls.tokens())

    async def create_token(
        self,
        name: str,
        *,
        kind: str = "worker",
        tenants: list[str] | None = None,
        expires_days: float = 365,
    ) -> views.CreatedTokenView:
        return await self.call(
            calls.create_token(name, kind=kind, tenants=tenants, expires_days=expires_days)
        )

    async def revoke_token(self, name: str, *, force: bool = False) -> views.RevokedTokenView:
        return await self.call(calls.revoke_token(name, force=force))

    async def secrets(self) -> list[views.SecretView]:
        return await self.call(calls.secrets())

    async def set_secret(
        self, name: str, value: str, *, tenants: list[str] | None = None, all_tenants: bool = False
    ) -> views.SecretSetView:
        return await self.call(
            calls.set_secret(name, value, tenants=tenants, all_tenants=all_tenants)
        )

    async def remove_secret(
        self, name: str, *, tenants: list[str] | None = None, all_tenants: bool = False
    ) -> views.RemovedView:
        return await self.call(calls.remove_secret(name, tenants=tenants, all_tenants=all_tenants))

    async def audit(self, *, limit: int = 100) -> list[views.AuditEntryView]:
        return await self.call(calls.audit(limit=limit))

    # -- approvals -------------------------------------------------------------------------

    async def approvals(
        self,
        *,
        state: calls.ApprovalState | None = None,
        job: int | None = None,
        limit: int = 100,
    ) -> list[views.ApprovalView]:
        """Requests of the caller's tenants' jobs, newest first (every state when None)."""
        return await self.call(calls.approvals(state=state, job=job, limit=limit))

    async def approval(self, approval_id: int) -> views.ApprovalView:
        return await self.call(calls.approval(approval_id))

    async def approve(self, approval_id: int, *, reason: str = "") -> views.ApprovalView:
        """Say yes to a pending request (with four-eyes, not as the job's creator)."""
        return await self.call(calls.answer_approval(approval_id, approve=True, reason=reason))

    async def deny(self, approval_id: int, *, reason: str = "") -> views.ApprovalView:
        """Say no to a pending request; the asking job's call returns False."""
        return await self.call(calls.answer_approval(approval_id, approve=False, reason=reason))

    # -- the artifact store ----------------------------------------------------------------

    async def store_id(self) -> str:
        return await self.call(calls.store_id())

    async def has_blob(self, sha256: str, *, tenant: str | None = None) -> bool:
        return await self.call(calls.has_blob(sha256, tenant=tenant))

    async def put_blob(
        self, sha256: str, content: bytes | AsyncIterable[bytes], *, tenant: str | None = None
    ) -> views.StoredView:
        """Upload a blob named by its sha256, streamed from `content` (the server checks it)."""
        return await self.call(calls.put_blob(sha256, tenant=tenant), content)

    @contextlib.asynccontextmanager
    async def blob(self, sha256: str, *, tenant: str | None = None) -> AsyncIterator[AsyncBlob]:
        """The blob's bytes as they arrive: `async with berth.blob(sha) as chunks: ...`.

        `chunks.size` is the size the server announced (None when it did not). The server stops
        short of the end (Unreachable, `lost`) when it finds the blob corrupt; a caller that
        must not keep a bad copy also checks the digest itself.
        """
        async with self._stream(calls.blob(sha256, tenant=tenant)) as r:
            yield AsyncBlob(r.aiter_bytes(CHUNK), calls.size_of(r))
