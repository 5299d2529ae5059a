"""Every API operation once: its method, path, parameters, body and the view it answers with.

`BerthClient` and `AsyncBerthClient` build their requests from these `Call`s and read the answers
with `answer()`, so the two differ only in how they wait: one HTTP path for both.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from service import views
from service.client.bodies import JobRequest
from service.client.errors import error_of

T = TypeVar("T")
Params = dict[str, str | list[str]]

JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request, and how its (successful) response becomes a `T`."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: Params = field(default_factory=dict)
    body: object = None  # encoded as JSON when not None
    allow: tuple[int, ...] = ()  # error statuses that are answers (a HEAD's 404)

    def request(
        self,
        http: httpx.Client | httpx.AsyncClient,
        content: Any = None,  # noqa: ANN401
    ) -> httpx.Request:
        """The request; `content` (bytes or an iterator of them) streams a raw body."""
        if self.body is None:
            return http.build_request(self.method, self.path, params=self.params, content=content)
        return http.build_request(
            self.method,
            self.path,
            params=self.params,
            content=msgspec.json.encode(self.body),
            headers=JSON,
        )


def answer(call: Call[T], response: httpx.Response) -> T:
    """The call's view, or the `ApiError` the response carries (its body already read)."""
    if response.status_code >= 400 and response.status_code not in call.allow:
        raise error_of(response)
    return call.read(response)


_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def typed(kind: type[T]) -> Callable[[httpx.Response], T]:
    """A reader decoding the body as `kind` (a view, or a list of views)."""
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    return lambda r: decoder.decode(r.content)


def _text(r: httpx.Response) -> str:
    return r.text.strip()


def _found(r: httpx.Response) -> bool:
    return r.status_code == 200


def _name(name: str) -> str:
    """A name as one path segment: `/` and the rest escaped."""
    return quote(name, safe="")


def _params(**given: str | int | bool | list[str] | None) -> Params:
    """Query parameters without the unset ones; booleans as `true`."""
    out: Params = {}
    for k, v in given.items():
        if v is None or v is False or v == []:
            continue
        out[k] = v if isinstance(v, list) else "true" if v is True else str(v)
    return out


# -- health ----------------------------------------------------------------------------------


def health() -> Call[views.HealthView]:
    return Call("GET", "/healthz", typed(views.HealthView))


def ready() -> Call[views.HealthView]:
    return Call("GET", "/readyz", typed(views.HealthView))


# -- jobs ------------------------------------------------------------------------------------


def submit_job(job: JobRequest) -> Call[views.JobView]:
    return Call("POST", "/api/v1/jobs", typed(views.JobView), body=job)


def submit_jobs(jobs: list[JobRequest]) -> Call[views.JobIdsView]:
    return Call("POST", "/api/v1/jobs", typed(views.JobIdsView), body=jobs)


def list_jobs(
    *, state: str | None = None, tenant: str | None = None, limit: int = 100
) -> Call[list[views.JobView]]:
    params = _params(state=state, tenant=tenant, limit=limit)
    return Call("GET", "/api/v1/jobs", typed(list[views.JobView]), params)


def job(job_id: int) -> Call[views.JobView]:
    return Call("GET", f"/api/v1/jobs/{int(job_id)}", typed(views.JobView))


def cancel_job(job_id: int) -> Call[views.JobView]:
    return Call("POST", f"/api/v1/jobs/{int(job_id)}/cancel", typed(views.JobView))


Encoding = Literal["text", "base64"]


def logs(job_id: int, *, after: int = 0, encoding: Encoding = "text") -> Call[views.LogsView]:
    params = _params(after=after, encoding=encoding)
    return Call("GET", f"/api/v1/jobs/{int(job_id)}/logs", typed(views.LogsView), params)


def follow_logs(job_id: int, *, after: int = 0, encoding: Encoding = "text") -> Call[None]:
    """The streamed form of `logs`: read line by line with `follow_line`."""
    params = _params(after=after, encoding=encoding, follow=True)
    return Call("GET", f"/api/v1/jobs/{int(job_id)}/logs", lambda _: None, params)


def follow_line(line: str) -> views.ChunkView | views.LogEndView:
    """One line of a followed output: a chunk, or (last) how the job ended."""
    raw = msgspec.json.decode(line)
    if isinstance(raw, dict) and "stream" in raw:
        return msgspec.convert(raw, views.ChunkView)
    return msgspec.convert(raw, views.LogEndView)


def job_events(
    job_id: int, *, after: int = 0, encoding: Encoding = "text", output: bool = True
) -> Call[None]:
    """GET .../events: the job's server-sent events, read by `service.client.events`."""
    params = _params(after=after, encoding=encoding)
    if not output:
        params["output"] = "false"  # (`_params` leaves a False out: the server's default is true)
    path = f"/api/v1/jobs/{int(job_id)}/events"
    return Call("GET", path, lambda _: None, params)


# -- workers and pools -----------------------------------------------------------------------


def workers() -> Call[list[views.WorkerView]]:
    return Call("GET", "/api/v1/workers", typed(list[views.WorkerView]))


WorkerOrder = Literal["drain", "disable", "enable"]


def set_worker_state(name: str, order: WorkerOrder) -> Call[views.WorkerStateView]:
    path = f"/api/v1/workers/{_name(name)}/{order}"
    return Call("POST", path, typed(views.WorkerStateView))


def remove_worker(name: str) -> Call[views.RemovedView]:
    return Call("DELETE", f"/api/v1/workers/{_name(name)}", typed(views.RemovedView))


def create_join_token(
    pool: str,
    *,
    name: str | None = None,
    labels: list[str] | None = None,
    tenants: list[str] | None = None,
    expires_seconds: float = 3600.0,
) -> Call[views.JoinTokenView]:
    body: dict[str, Any] = {
        "pool": pool,
        "labels": labels or [],
        "tenants": tenants or [],
        "expires_seconds": expires_seconds,
    }
    if name:
        body["name"] = name
    return Call("POST", "/api/v1/workers/join-tokens", typed(views.JoinTokenView), body=body)


def pools() -> Call[list[views.PoolView]]:
    return Call("GET", "/api/v1/pools", typed(list[views.PoolView]))


def status() -> Call[views.StatusView]:
    return Call("GET", "/api/v1/status", typed(views.StatusView))


# -- limits ----------------------------------------------------------------------------------


def limits() -> Call[list[views.LimitView]]:
    return Call("GET", "/api/v1/limits", typed(list[views.LimitView]))


def set_limit(key: str, value: object, *, reason: str) -> Call[views.LimitView]:
    body = {"value": value, "reason": reason}
    return Call("PUT", f"/api/v1/limits/{_name(key)}", typed(views.LimitView), body=body)


def unset_limit(key: str) -> Call[views.LimitUnsetView]:
    return Call("DELETE", f"/api/v1/limits/{_name(key)}", typed(views.LimitUnsetView))


# -- tokens, secrets, audit ------------------------------------------------------------------


def tokens() -> Call[list[views.TokenView]]:
    return Call("GET", "/api/v1/tokens", typed(list[views.TokenView]))


def create_token(
    name: str, *, kind: str = "worker", tenants: list[str] | None = None, expires_days: float = 365
) -> Call[views.CreatedTokenView]:
    body = {"name": name, "kind": kind, "tenants": tenants or [], "expires_days": expires_days}
    return Call("POST", "/api/v1/tokens", typed(views.CreatedTokenView), body=body)


def revoke_token(name: str, *, force: bool = False) -> Call[views.RevokedTokenView]:
    path = f"/api/v1/tokens/{_name(name)}"
    return Call("DELETE", path, typed(views.RevokedTokenView), _params(force=force))


def secrets() -> Call[list[views.SecretView]]:
    return Call("GET", "/api/v1/secrets", typed(list[views.SecretView]))


def set_secret(
    name: str, value: str, *, tenants: list[str] | None = None, all_tenants: bool = False
) -> Call[views.SecretSetView]:
    body: dict[str, Any] = {"value": value, "tenants": tenants or []}
    if all_tenants:
        body["all_tenants"] = True
    return Call("PUT", f"/api/v1/secrets/{_name(name)}", typed(views.SecretSetView), body=body)


def remove_secret(
    name: str, *, tenants: list[str] | None = None, all_tenants: bool = False
) -> Call[views.RemovedView]:
    params = _params(tenant=tenants or None, all_tenants=all_tenants)
    return Call("DELETE", f"/api/v1/secrets/{_name(name)}", typed(views.RemovedView), params)


def audit(*, limit: int = 100) -> Call[list[views.AuditEntryView]]:
    params = _params(limit=limit)
    return Call("GET", "/api/v1/audit", typed(list[views.AuditEntryView]), params)


# -- approvals -------------------------------------------------------------------------------

ApprovalState = Literal["pending", "approved", "denied", "timed_out", "closed"]


def approvals(
    *, state: ApprovalState | None = None, job: int | None = None, limit: int = 100
) -> Call[list[views.ApprovalView]]:
    params = _params(state=state, job=job, limit=limit)
    return Call("GET", "/api/v1/approvals", typed(list[views.ApprovalView]), params)


def approval(approval_id: int) -> Call[views.ApprovalView]:
    return Call("GET", f"/api/v1/approvals/{int(approval_id)}", typed(views.ApprovalView))


def answer_approval(
    approval_id: int, *, approve: bool, reason: str = ""
) -> Call[views.ApprovalView]:
    verb = "approve" if approve else "deny"
    path = f"/api/v1/approvals/{int(approval_id)}/{verb}"
    return Call("POST", path, typed(views.ApprovalView), body={"reason": reason})


# -- the artifact store ----------------------------------------------------------------------


def store_id() -> Call[str]:
    return Call("GET", "/api/v1/cas/.id", _text)


def has_blob(sha256: str, *, tenant: str | None = None) -> Call[bool]:
    """HEAD: True when the tenant holds the blob; a 404 is False, not an error."""
    path = f"/api/v1/cas/{_name(sha256)}"
    return Call("HEAD", path, _found, _params(tenant=tenant), allow=(404,))


def put_blob(sha256: str, *, tenant: str | None = None) -> Call[views.StoredView]:
    """PUT: the body is the caller's stream (`content`), sent as it is read."""
    path = f"/api/v1/cas/{_name(sha256)}"
    return Call("PUT", path, typed(views.StoredView), _params(tenant=tenant))


def size_of(response: httpx.Response) -> int | None:
    """A streamed blob's size, as its Content-Length says (None without one)."""
    length = response.headers.get("content-length", "")
    return int(length) if length.isdigit() else None


def blob(sha256: str, *, tenant: str | None = None) -> Call[None]:
    """GET: the blob's bytes, streamed (`BerthClient.blob`)."""
    return Call("GET", f"/api/v1/cas/{_name(sha256)}", lambda _: None, _params(tenant=tenant))
