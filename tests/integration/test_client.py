"""The typed client (service/client) against the real app on a real database, in process.

Every listing and answer the API gives is decoded through the client's types (the views the
CLI reads too), and its JSON checked key for key against them: a field the server adds, drops
or renames fails here, not in a user's script. Errors decode to ApiError (status, error, field).
The async client runs on the app's ASGI transport; the sync one on the same app, through a
transport that hands each request to the test's event loop.
"""

import asyncio
import base64
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import msgspec.inspect as mi
import pytest
from sqlalchemy import text

from service import protocol, views
from service.client import (
    ApiError,
    AsyncBerthClient,
    BerthClient,
    InputRequest,
    JobRequest,
    Unreachable,
)
from service.domain import leasing, tokens
from service.domain.artifacts import server_store
from service.events import EndEvent, OutputEvent, StateEvent
from tests.integration.conftest import KEY, Api, rebuilt
from tests.procs import free_port

DATA = b"hello, artifact\n"
SHA = hashlib.sha256(DATA).hexdigest()


def same_shape(raw: Any, kind: Any, where: str = "$") -> None:
    """Every key of `raw` (the server's JSON) is a field of `kind`, and every required field is
    there, all the way down."""
    t = kind if isinstance(kind, mi.Type) else mi.type_info(kind)
    if isinstance(t, mi.UnionType):
        if raw is None:
            return
        t = next(x for x in t.types if not isinstance(x, mi.NoneType))
    if isinstance(t, mi.StructType):
        assert isinstance(raw, dict), f"{where}: {raw!r} is not an object"
        fields = {f.encode_name: f for f in t.fields}
        extra = sorted(set(raw) - set(fields))
        missing = sorted(f for f, info in fields.items() if info.required and f not in raw)
        assert not extra, f"{where}: the server sends {extra}, which {t.cls.__name__} lacks"
        assert not missing, f"{where}: {t.cls.__name__} requires {missing}, the server omits it"
        for name, value in raw.items():
            same_shape(value, fields[name].type, f"{where}.{name}")
    elif isinstance(t, mi.ListType):
        assert isinstance(raw, list), f"{where}: {raw!r} is not a list"
        for i, item in enumerate(raw):
            same_shape(item, t.item_type, f"{where}[{i}]")
    elif isinstance(t, mi.DictType):
        assert isinstance(raw, dict), f"{where}: {raw!r} is not an object"
        for k, v in raw.items():
            same_shape(v, t.value_type, f"{where}.{k}")


async def raw(api: Api, path: str, **params: Any) -> Any:
    r = await api.call("GET", path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


class LoopTransport(httpx.BaseTransport):
    """A sync transport for a thread: each request is answered by an async transport on the
    test's event loop (bodies read whole, both ways)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, loop: asyncio.AbstractEventLoop) -> None:
        self.inner = inner
        self.loop = loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        sent = httpx.Request(
            request.method, request.url, headers=request.headers, content=request.read()
        )

        async def answer() -> httpx.Response:
            r = await self.inner.handle_async_request(sent)
            body = await r.aread()
            return httpx.Response(r.status_code, headers=r.headers, content=body)

        return asyncio.run_coroutine_threadsafe(answer(), self.loop).result()


@pytest.fixture
def api(api: Api, tmp_path: Path) -> Api:
    """The in-process server, with an artifact store under tmp_path."""
    return rebuilt(
        api, cas=server_store.open_server_store(api.rt.config, home=tmp_path, secret_key=KEY)
    )


@pytest.fixture
async def berth(api: Api) -> AsyncIterator[AsyncBerthClient]:
    """The async client on the in-process app."""
    transport = api.client._transport
    assert isinstance(transport, httpx.AsyncBaseTransport)
    async with AsyncBerthClient("http://berth.test", api.admin, transport=transport) as client:
        yield client


async def attach(api: Api, name: str) -> None:
    """A worker row, as a worker's hello makes one."""
    caller = await tokens.authenticate(api.rt.db, await api.mint(name, "worker"))
    hello = protocol.Hello(
        protocol=protocol.PROTOCOL_VERSION,
        berth_version="test",
        pool="gpu",
        instance=f"instance-{name}",
        parallel=1,
    )
    await leasing.attach(api.rt.db, caller, hello, server_id=api.rt.server_id, pools=api.rt.pools)


async def finished_job(api: Api, berth: AsyncBerthClient) -> views.JobView:
    """A job with an input, run to its end: output on both streams, an artifact, a metric."""
    await berth.put_blob(SHA, DATA)
    job = await berth.submit_job(
        JobRequest(
            command=["echo", "hi"],
            pool="gpu",
            env={"A": "1"},
            labels=["x"],
            inputs=[InputRequest(name="in.txt", sha256=SHA)],
        )
    )
    outputs = msgspec.json.encode([{"path": "out.txt", "sha256": SHA, "size": len(DATA)}])
    async with api.rt.db.begin() as conn:
        await conn.execute(
            text(
                "UPDATE jobs SET state = 'succeeded', exit_code = 0, attempt = 1, "
                "started_at = now(), finished_at = now(), outputs = CAST(:o AS jsonb), "
                "metrics = '{\"loss\": 0.25}' WHERE id = :id"
            ),
            {"id": job.id, "o": outputs.decode()},
        )
        for seq, (stream, data) in enumerate([("stdout", b"hi\n"), ("stderr", b"\xff oops\n")]):
            await conn.execute(
                text(
                    "INSERT INTO job_output (job_id, epoch, seq, stream, data) "
                    "VALUES (:j, 1, :s, :st, :d)"
                ),
                {"j": job.id, "s": seq, "st": stream, "d": data},
            )
    return job


async def test_every_answer_decodes_through_the_client_types(
    api: Api, berth: AsyncBerthClient
) -> None:
    await attach(api, "w1")
    job = await finished_job(api, berth)
    await berth.create_token("ci", kind="service", tenants=["acme"])
    await berth.create_token("gone", kind="worker")
    await berth.revoke_token("gone")
    await berth.set_secret("db-pass", "s3cret", tenants=["acme"])
    await berth.set_secret("shared", "x", all_tenants=True)
    await berth.set_limit("pools.gpu.slots.default", 1, reason="a test")
    await berth.set_limit("tenants.acme.max_queued", 5, reason="a test")
    await berth.create_join_token("gpu", labels=["a"])

    listings: list[tuple[str, Any, dict[str, Any]]] = [
        ("/api/v1/jobs", list[views.JobView], {}),
        (f"/api/v1/jobs/{job.id}", views.JobView, {}),
        (f"/api/v1/jobs/{job.id}/logs", views.LogsView, {}),
        (f"/api/v1/jobs/{job.id}/logs", views.LogsView, {"encoding": "base64"}),
        ("/api/v1/workers", list[views.WorkerView], {}),
        ("/api/v1/pools", list[views.PoolView], {}),
        ("/api/v1/status", views.StatusView, {}),
        ("/api/v1/limits", list[views.LimitView], {}),
        ("/api/v1/tokens", list[views.TokenView], {}),
        ("/api/v1/secrets", list[views.SecretView], {}),
        ("/api/v1/audit", list[views.AuditEntryView], {}),
        ("/healthz", views.HealthView, {}),
    ]
    for path, kind, params in listings:
        body = await raw(api, path, **params)
        assert body, f"{path}: empty, so it proves nothing"
        same_shape(body, kind, path)

    # ... and the client's methods decode them to those types, non-empty where data was made.
    jobs = await berth.list_jobs()
    assert [j.id for j in jobs] == [job.id]
    shown = await berth.job(job.id)
    assert shown.outputs == [views.ArtifactView(path="out.txt", sha256=SHA, size=len(DATA))]
    assert shown.inputs == [views.InputView(name="in.txt", sha256=SHA, kind="file")]
    assert shown.metrics == {"loss": 0.25} and shown.env == ["A"]
    assert shown.finished_at is not None and shown.finished_at.tzinfo is not None
    text_logs = await berth.logs(job.id)
    assert [(c.stream, c.data) for c in text_logs.chunks] == [
        ("stdout", "hi\n"),
        ("stderr", "\ufffd oops\n"),
    ]
    b64_logs = await berth.logs(job.id, encoding="base64")
    assert all(c.b64 and c.data is None for c in b64_logs.chunks)
    followed = [x async for x in berth.follow_logs(job.id, after=text_logs.chunks[0].id)]
    assert [type(x) for x in followed] == [views.ChunkView, views.LogEndView]
    end = followed[-1]
    assert isinstance(end, views.LogEndView) and (end.state, end.exit_code) == ("succeeded", 0)

    workers = await berth.workers()
    assert [w.name for w in workers] == ["w1"] and workers[0].attached
    gpu = {p.name: p for p in await berth.pools()}["gpu"]
    assert [x.key for x in gpu.limits] == ["pools.gpu.slots.default"] and gpu.slots["default"] == 1
    status = await berth.status()
    assert status.server.id == api.rt.server_id and "gpu" in status.pools
    assert {x.key for x in await berth.limits()} == {
        "pools.gpu.slots.default",
        "tenants.acme.max_queued",
    }
    by_name = {t.name: t for t in await berth.tokens()}
    assert by_name["gone"].revoked_at is not None and by_name["ci"].tenants == ["acme"]
    assert {(s.name, s.owner) for s in await berth.secrets()} == {
        ("db-pass", "acme"),
        ("shared", "all tenants"),
    }
    actions = {e.action for e in await berth.audit()}
    assert {"token.created", "secret.set", "limit.set"} <= actions, actions
    assert (await berth.health()).status == "ok"

    # The artifact store: the answer of a PUT, the HEAD, the bytes, the store's id.
    assert await berth.has_blob(SHA)
    assert not await berth.has_blob(hashlib.sha256(b"absent").hexdigest())
    async with berth.blob(SHA) as chunks:
        assert chunks.size == len(DATA)
        assert b"".join([c async for c in chunks]) == DATA
    put = await api.call("PUT", f"/api/v1/cas/{SHA}", content=DATA)
    same_shape(put.json(), views.StoredView, "PUT /api/v1/cas")
    assert await berth.store_id()


async def test_writes_answer_with_their_views(api: Api, berth: AsyncBerthClient) -> None:
    """The answers of writes, checked key for key too (the CLI prints them with --json)."""

    async def write(method: str, path: str, kind: Any, **kw: Any) -> Any:
        r = await api.call(method, path, **kw)
        assert r.status_code < 300, r.text
        same_shape(r.json(), kind, f"{method} {path}")
        return r.json()

    await attach(api, "w1")
    job = await write("POST", "/api/v1/jobs", views.JobView, json={"command": ["true"]})
    await write("POST", "/api/v1/jobs", views.JobIdsView, json=[{"command": ["true"]}])
    await write("POST", f"/api/v1/jobs/{job['id']}/cancel", views.JobView)
    await write("POST", "/api/v1/workers/w1/drain", views.WorkerStateView)
    body = {"name": "t1", "kind": "worker"}
    await write("POST", "/api/v1/tokens", views.CreatedTokenView, json=body)
    await write("DELETE", "/api/v1/tokens/t1", views.RevokedTokenView)
    await write("POST", "/api/v1/workers/join-tokens", views.JoinTokenView, json={"pool": "gpu"})
    await write("PUT", "/api/v1/secrets/s", views.SecretSetView, json={"value": "v"})
    await write("DELETE", "/api/v1/secrets/s", views.RemovedView)
    limit = {"value": 1, "reason": "r"}
    await write("PUT", "/api/v1/limits/pools.gpu.max_load", views.LimitView, json=limit)
    await write("DELETE", "/api/v1/limits/pools.gpu.max_load", views.LimitUnsetView)
    # The same through the client, decoded.
    assert (await berth.set_worker_state("w1", "enable")).set == "active"
    assert (await berth.cancel_job(job["id"])).state == "cancelled"


async def test_errors_are_api_errors(api: Api, berth: AsyncBerthClient) -> None:
    with pytest.raises(ApiError) as missing:
        await berth.job(424242)
    assert (missing.value.status, missing.value.error) == (404, "no job 424242")
    assert missing.value.message == "no job 424242"  # as every BerthError says it

    with pytest.raises(ApiError) as bad:
        await berth.submit_job(JobRequest(command=["true"], max_attempts=0))
    assert (bad.value.status, bad.value.field) == (400, "max_attempts"), bad.value

    transport = api.client._transport
    assert isinstance(transport, httpx.AsyncBaseTransport)
    own = await api.mint("own", "admin")
    async with AsyncBerthClient("http://berth.test", own, transport=transport) as client:
        with pytest.raises(ApiError) as mine:  # the credential in use: only with force
            await client.revoke_token("own")
    assert mine.value.status == 409 and mine.value.field is None

    async with AsyncBerthClient("http://berth.test", "brt_nope", transport=transport) as nobody:
        with pytest.raises(ApiError) as refused:
            await nobody.list_jobs()
    assert refused.value.status == 401 and refused.value.error

    viewer = await api.mint("viewer", "service", "acme")
    async with AsyncBerthClient("http://berth.test", viewer, transport=transport) as member:
        with pytest.raises(ApiError) as forbidden:
            await member.audit()
    assert forbidden.value.status == 403


async def test_follow_events_pushes_states_output_and_the_end(
    api: Api, berth: AsyncBerthClient
) -> None:
    """follow_events: the job's state, its output after `after` (text or exact bytes), its end;
    `output=False` the state and end only; a job the caller may not see is an ApiError."""
    job = await finished_job(api, berth)
    got = [e async for e in berth.follow_events(job.id)]
    assert [type(e) for e in got] == [StateEvent, OutputEvent, OutputEvent, EndEvent]
    state, out, err, end = got
    assert isinstance(state, StateEvent) and state.state == "succeeded"
    assert isinstance(out, OutputEvent) and (out.stream, out.data) == ("stdout", "hi\n")
    assert isinstance(err, OutputEvent) and (err.stream, err.data) == ("stderr", "\ufffd oops\n")
    assert end == EndEvent(state="succeeded", exit_code=0, error="")

    rest = [e async for e in berth.follow_events(job.id, after=out.id, encoding="base64")]
    assert [(e.stream, e.b64) for e in rest if isinstance(e, OutputEvent)] == [
        ("stderr", base64.b64encode(b"\xff oops\n").decode())
    ]
    moves = [e async for e in berth.follow_events(job.id, output=False)]
    assert [type(e) for e in moves] == [StateEvent, EndEvent]

    with pytest.raises(ApiError) as missing:
        [e async for e in berth.follow_events(424242)]
    assert (missing.value.status, missing.value.error) == (404, "no job 424242")
    with pytest.raises(ApiError) as bad:
        [e async for e in berth.follow_events(job.id, after=-1)]
    assert bad.value.status == 400


async def test_the_sync_client_reads_the_same_answers(api: Api, berth: AsyncBerthClient) -> None:
    """BerthClient (what the CLI uses) against the same app: same views, same errors."""
    job = await finished_job(api, berth)
    transport = LoopTransport(api.client._transport, asyncio.get_running_loop())  # type: ignore[arg-type]

    def run() -> tuple[Any, ...]:
        with BerthClient("http://berth.test", api.admin, transport=transport) as client:
            with pytest.raises(ApiError) as missing:
                client.job(424242)
            assert missing.value.status == 404
            with client.blob(SHA) as chunks:
                assert chunks.size == len(DATA)  # what a progress bar shows the total of
                got = b"".join(chunks)
            with pytest.raises(ApiError) as gone:
                list(client.follow_events(424242))
            assert gone.value.status == 404
            return (
                client.list_jobs(),
                client.job(job.id),
                client.logs(job.id),
                list(client.follow_logs(job.id)),
                list(client.follow_events(job.id)),
                client.tokens(),
                client.secrets(),
                client.put_blob(SHA, iter([DATA[:5], DATA[5:]])),
                got,
            )

    jobs, shown, logs, followed, events, toks, secs, stored, got = await asyncio.to_thread(run)
    assert jobs == await berth.list_jobs()
    assert shown == await berth.job(job.id)
    assert logs == await berth.logs(job.id)
    assert followed == [x async for x in berth.follow_logs(job.id)]
    assert events == [x async for x in berth.follow_events(job.id)] and len(events) == 4
    assert toks == await berth.tokens() and secs == await berth.secrets()
    assert stored == views.StoredView(sha256=SHA, size=len(DATA)) and got == DATA


def test_no_answer_is_unreachable() -> None:
    with (
        BerthClient(f"http://127.0.0.1:{free_port()}", "brt_x") as client,
        pytest.raises(Unreachable) as gone,
    ):
        client.status()
    assert not gone.value.lost and gone.value.message


def test_same_shape_finds_a_field_added_or_dropped() -> None:
    """The check above is not vacuous: an extra key or a missing required one fails it."""
    good = {"name": "x", "removed": True}
    same_shape(good, views.RemovedView)
    with pytest.raises(AssertionError, match="sends \\['new'\\]"):
        same_shape([{**good, "new": 1}], list[views.RemovedView])
    with pytest.raises(AssertionError, match="requires \\['removed'\\]"):
        same_shape({"x": {"name": "x"}}, dict[str, views.RemovedView])


def test_a_job_request_names_the_fields_the_server_takes() -> None:
    """JobRequest mirrors the route's body (which the server keeps, with its bounds): a field
    renamed or added on one side only fails here, not as a 400 in a user's script."""
    from service.api.routes.jobs import InputBody, JobBody

    def names(kind: type) -> set[str]:
        return {f.encode_name for f in msgspec.structs.fields(kind)}

    assert names(JobRequest) == names(JobBody)
    assert names(InputRequest) == names(InputBody)
