"""`BerthClient`: the API from ordinary (blocking) Python; `AsyncBerthClient` is its twin.

    with BerthClient("https://berth.example:8443", token) as berth:
        job = berth.submit_job(JobRequest(command=["echo", "hi"]))
        for line in berth.follow_logs(job.id):
            ...

Each method is one operation of calls.py, answered with its view (service/views.py). An error
answer raises `ApiError` (status, error, field); no answer raises `Unreachable`.
"""

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self, TypeVar

import httpx

from service import views
from service.client import calls, events
from service.client.bodies import JobRequest
from service.client.calls import Call, Encoding, WorkerOrder, answer
from service.client.connection import TIMEOUT, options
from service.client.errors import Unreachable, error_of
from service.events import JobEvent

T = TypeVar("T")

CHUNK = 1 << 20  # bytes a blob is read in


class Blob(Iterator[bytes]):
    """A blob's bytes as they arrive (iterate it), and its `size` when the server said it."""

    def __init__(self, chunks: Iterator[bytes], size: int | None) -> None:
        self._chunks = chunks
        self.size = size

    def __next__(self) -> bytes:
        return next(self._chunks)


class BerthClient:
    """A connection to one berth server; close it (or use `with`) when done."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        ca: str | Path | None = None,
        timeout: httpx.Timeout | float = TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        given = options(url, token, headers=headers, ca=ca, timeout=timeout)
        self._http = httpx.Client(transport=transport, **given)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- the one way a call goes out -------------------------------------------------------

    def call(self, call: Call[T], content: Any = None) -> T:  # noqa: ANN401
        """Send `call` (with a raw body `content`, if any) and read its answer."""
        try:
            response = self._http.send(call.request(self._http, content))
        except httpx.HTTPError as exc:
            raise Unreachable(str(exc)) from exc
        return answer(call, response)

    @contextlib.contextmanager
    def _stream(self, call: Call[Any]) -> Iterator[httpx.Response]:
        """The response of `call`, its body still to read; an error answer raises."""
        try:
            response = self._http.send(call.request(self._http), stream=True)
        except httpx.HTTPError as exc:
            raise Unreachable(str(exc)) from exc
        try:
            if response.status_code >= 400:
                response.read()
                raise error_of(response)
            try:
                yield response
            except httpx.HTTPError as exc:  # broke off while the body was read
                raise Unreachable(str(exc), lost=True) from exc
        finally:
            response.close()

    # -- health ----------------------------------------------------------------------------

    def health(self) -> views.HealthView:
        return self.call(calls.health())

    def ready(self) -> views.HealthView:
        return self.call(calls.ready())

    # -- jobs ------------------------------------------------------------------------------

    def submit_job(self, job: JobRequest) -> views.JobView:
        return self.call(calls.submit_job(job))

    def submit_jobs(self, jobs: list[JobRequest]) -> views.JobIdsView:
        """Queue several jobs: all or none."""
        return self.call(calls.submit_jobs(jobs))

    def list_jobs(
        self, *, state: str | None = None, tenant: str | None = None, limit: int = 100
    ) -> list[views.JobView]:
        return self.call(calls.list_jobs(state=state, tenant=tenant, limit=limit))

    def job(self, job_id: int) -> views.JobView:
        return self.call(calls.job(job_id))

    def cancel_job(self, job_id: int) -> views.JobView:
        return self.call(calls.cancel_job(job_id))

    def logs(self, job_id: int, *, after: int = 0, encoding: Encoding = "text") -> views.LogsView:
        """Output so far, after chunk `after`."""
        return self.call(calls.logs(job_id, after=after, encoding=encoding))

    def follow_logs(
        self, job_id: int, *, after: int = 0, encoding: Encoding = "text"
    ) -> Iterator[views.ChunkView | views.LogEndView]:
        """Chunks as the job writes them, then (last) how it ended."""
        with self._stream(calls.follow_logs(job_id, after=after, encoding=encoding)) as r:
            for line in r.iter_lines():
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
    ) -> Iterator[JobEvent]:
        """The job's state changes and output chunks (after `after`), pushed until its end.

        Each is a `service.events` Struct: StateEvent, OutputEvent, and last an EndEvent.
        `output=False`: the states and the end only. A dropped connection is dialled again,
        resuming after the last chunk; down for `give_up_after` seconds: `Unreachable`.
        """
        return events.follow(
            self._http,
            job_id,
            after=after,
            encoding=encoding,
            output=output,
            give_up_after=give_up_after,
        )

    # -- workers and pools -----------------------------------------------------------------

    def workers(self) -> list[views.WorkerView]:
        return self.call(calls.workers())

    def set_worker_state(self, name: str, order: WorkerOrder) -> views.WorkerStateView:
        return self.call(calls.set_worker_state(name, order))

    def remove_worker(self, name: str) -> views.RemovedView:
        return self.call(calls.remove_worker(name))

    def create_join_token(
        self,
        pool: str,
        *,
        name: str | None = None,
        labels: list[str] | None = None,
        tenants: list[str] | None = None,
        expires_seconds: float = 3600.0,
    ) -> views.JoinTokenView:
        return self.call(
            calls.create_join_token(
                pool, name=name, labels=labels, tenants=tenants, expires_seconds=expires_seconds
            )
        )

    def pools(self) -> list[views.PoolView]:
        return self.call(calls.pools())

    def status(self) -> views.StatusView:
        return self.call(calls.status())

    # -- limits ----------------------------------------------------------------------------

    def limits(self) -> list[views.LimitView]:
        return self.call(calls.limits())

    def set_limit(self, key: str, value: object, *, reason: str) -> views.LimitView:
        return self.call(calls.set_limit(key, value, reason=reason))

    def unset_limit(self, key: str) -> views.LimitUnsetView:
        return self.call(calls.unset_limit(key))

    # -- tokens, secrets, audit ------------------------------------------------------------

    def tokens(self) -> list[views.TokenView]:
        return self.call(calls.tokens())

    def create_token(
        self,
        name: str,
        *,
        kind: str = "worker",
        tenants: list[str] | None = None,
        expires_days: float = 365,
    ) -> views.CreatedTokenView:
        return self.call(
            calls.create_token(name, kind=kind, tenants=tenants, expires_days=expires_days)
        )

    def revoke_token(self, name: str, *, force: bool = False) -> views.RevokedTokenView:
        return self.call(calls.revoke_token(name, force=force))

    def secrets(self) -> list[views.SecretView]:
        return self.call(calls.secrets())

    def set_secret(
        self, name: str, value: str, *, tenants: list[str] | None = None, all_tenants: bool = False
    ) -> views.SecretSetView:
        return self.call(calls.set_secret(name, value, tenants=tenants, all_tenants=all_tenants))

    def remove_secret(
        self, name: str, *, tenants: list[str] | None = None, all_tenants: bool = False
    ) -> views.RemovedView:
        return self.call(calls.remove_secret(name, tenants=tenants, all_tenants=all_tenants))

    def audit(self, *, limit: int = 100) -> list[views.AuditEntryView]:
        return self.call(calls.audit(limit=limit))

    # -- approvals -------------------------------------------------------------------------

    def approvals(
        self,
        *,
        state: calls.ApprovalState | None = None,
        job: int | None = None,
        limit: int = 100,
    ) -> list[views.ApprovalView]:
        """Requests of the caller's tenants' jobs, newest first (every state when None)."""
        return self.call(calls.approvals(state=state, job=job, limit=limit))

    def approval(self, approval_id: int) -> views.ApprovalView:
        return self.call(calls.approval(approval_id))

    def approve(self, approval_id: int, *, reason: str = "") -> views.ApprovalView:
        """Say yes to a pending request (with four-eyes, not as the job's creator)."""
        return self.call(calls.answer_approval(approval_id, approve=True, reason=reason))

    def deny(self, approval_id: int, *, reason: str = "") -> views.ApprovalView:
        """Say no to a pending request; the asking job's call returns False."""
        return self.call(calls.answer_approval(approval_id, approve=False, reason=reason))

    # -- the artifact store ----------------------------------------------------------------

    def store_id(self) -> str:
        return self.call(calls.store_id())

    def has_blob(self, sha256: str, *, tenant: str | None = None) -> bool:
        return self.call(calls.has_blob(sha256, tenant=tenant))

    def put_blob(
        self,
        sha256: str,
        content: bytes | IO[bytes] | Iterable[bytes],
        *,
        tenant: str | None = None,
    ) -> views.StoredView:
        """Upload a blob named by its sha256, streamed from `content` (the server checks it)."""
        return self.call(calls.put_blob(sha256, tenant=tenant), content)

    @contextlib.contextmanager
    def blob(self, sha256: str, *, tenant: str | None = None) -> Iterator[Blob]:
        """The blob's bytes as they arrive: `with berth.blob(sha) as chunks: ...`.

        `chunks.size` is the size the server announced (None when it did not). The server stops
        short of the end (Unreachable, `lost`) when it finds the blob corrupt; a caller that
        must not keep a bad copy also checks the digest itself.
        """
        with self._stream(calls.blob(sha256, tenant=tenant)) as r:
            yield Blob(r.iter_bytes(CHUNK), calls.size_of(r))
