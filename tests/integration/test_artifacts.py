"""The artifact routes in process, on a real database and a store in a temporary $BERTH_HOME:
tenants reach blobs only through their references, workers as their tokens allow, corrupt
blobs are refused and healed, and the collector never loses a blob an upload still wants."""

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from litestar.exceptions import LitestarException
from sqlalchemy import text

from service.background.cas_gc import CollectArtifacts
from service.cas.local import LocalStore
from service.core.errors import NotFound
from service.db.engine import Database
from service.db.queries import artifacts as artifacts_q
from service.db.queries import workers as workers_q
from service.domain import artifact_gc
from service.domain.artifacts import blobs, references, server_store
from service.domain.artifacts.server_store import ServerStore
from tests.integration.conftest import KEY, Api, rebuilt

TENANT = "/api/v1/cas"
WORKER = "/api/v1/workers/cas"
MIB = 1 << 20


def blob(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def cas(api: Api, tmp_path: Path) -> Api:
    """The in-process app with the server's default store: a folder under a fresh $BERTH_HOME."""
    return rebuilt(
        api, cas=server_store.open_server_store(api.rt.config, home=tmp_path, secret_key=KEY)
    )


def server(api: Api) -> ServerStore:
    assert api.rt.cas is not None
    return api.rt.cas


def on_disk(api: Api, name: str) -> Path:
    store = server(api).store
    assert isinstance(store, LocalStore)
    return store.path(name)


async def put(api: Api, data: bytes, token: str | None = None, **params: str) -> httpx.Response:
    return await api.call("PUT", f"{TENANT}/{sha(data)}", token, content=data, params=params)


async def tenant_token(api: Api, name: str, *tenants: str) -> str:
    return await api.mint(name, "service", *tenants)


async def attach_worker(api: Api, name: str) -> str:
    """A worker row for the token `name` (as attaching makes one); its id."""
    async with api.rt.db.begin() as conn:
        record = await workers_q.attach(
            conn,
            name=name,
            identity=f"token:{name}",
            pool="gpu",
            instance="i",
            server_id="s",
            labels=[],
            tenants=[],
            parallel=0,
            host={},
            python="",
            env_digest="",
            version="",
        )
    assert record is not None
    return record.id


async def leased_job(db: Database, worker_id: str, worker_name: str, tenant: str) -> int:
    """A job of `tenant` leased to the worker at epoch 1."""
    async with db.begin() as conn:
        await conn.execute(
            text("INSERT INTO tenants (name) VALUES (:t) ON CONFLICT DO NOTHING"), {"t": tenant}
        )
        job = (
            await conn.execute(
                text(
                    "INSERT INTO jobs (tenant, pool, command, created_by, state, attempt, worker) "
                    "VALUES (:t, 'gpu', ARRAY['true'], 'test', 'running', 1, :w) RETURNING id"
                ),
                {"t": tenant, "w": worker_name},
            )
        ).scalar_one()
        await conn.execute(
            text(
                "INSERT INTO leases (job_id, epoch, worker_id, kind) VALUES (:j, 1, :w, 'default')"
            ),
            {"j": job, "w": worker_id},
        )
    return int(job)


async def refs(db: Database, name: str) -> list[tuple[str, str, int, int | None]]:
    async with db.begin() as conn:
        rows = await conn.execute(
            text("SELECT tenant, what, size, job_id FROM cas_refs WHERE sha256 = :s ORDER BY id"),
            {"s": name},
        )
        return [(r[0], r[1], r[2], r[3]) for r in rows]


async def age_refs(db: Database, name: str, days: float) -> None:
    """Make every reference to `name` as if what made it ended `days` ago."""
    async with db.begin() as conn:
        await conn.execute(
            text(
                "UPDATE cas_refs SET created_at = now() - make_interval(secs => :s), "
                "ended_at = now() - make_interval(secs => :s) WHERE sha256 = :n"
            ),
            {"s": days * 86400, "n": name},
        )


async def until(predicate, what: str, timeout: float = 10.0) -> None:
    """Wait for an async condition (polling the database), never for a fixed time."""
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.01)


async def lock_waiters(db: Database) -> int:
    async with db.begin() as conn:
        return int(
            (
                await conn.execute(
                    text(
                        "SELECT count(*) FROM pg_locks "
                        "WHERE locktype = 'advisory' AND NOT granted AND classid = :k"
                    ),
                    {"k": artifacts_q.CAS_LOCK},
                )
            ).scalar_one()
        )


class TestTenantRoutes:
    async def test_round_trip_with_ranges(self, cas):
        """A blob put is read back whole and in ranges, with the contract's headers."""
        data = blob(3 * MIB + 17)
        r = await put(cas, data)
        assert r.status_code == 201, r.text
        assert r.json() == {"sha256": sha(data), "size": len(data)}
        r = await cas.call("GET", f"{TENANT}/{sha(data)}")
        assert r.status_code == 200 and r.content == data
        assert r.headers["content-length"] == str(len(data))
        r = await cas.call("GET", f"{TENANT}/{sha(data)}", headers={"Range": "bytes=10-19"})
        assert r.status_code == 206 and r.content == data[10:20]
        assert r.headers["content-range"] == f"bytes 10-19/{len(data)}"
        r = await cas.call("GET", f"{TENANT}/{sha(data)}", headers={"Range": "bytes=3145000-"})
        assert r.status_code == 206 and r.content == data[3145000:]
        r = await cas.call("GET", f"{TENANT}/{sha(data)}", headers={"Range": "bytes=-5"})
        assert r.status_code == 206 and r.content == data[-5:]
        r = await cas.call("GET", f"{TENANT}/{sha(data)}", headers={"Range": f"bytes={len(data)}-"})
        assert r.status_code == 416
        r = await cas.call("GET", f"{TENANT}/{sha(data)}", headers={"Range": "bytes=9-2"})
        assert r.status_code == 400
        r = await cas.call("GET", f"{TENANT}/.id")
        assert r.status_code == 200 and r.text.strip() == await server(cas).id()

    async def test_head_first_then_a_second_put_is_a_no_op(self, cas):
        """HEAD says 404 before and the size after an upload; a second put answers as the
        first did (201: an upload never says whether the store had the blob)."""
        data = blob(1000, seed=1)
        r = await cas.call("HEAD", f"{TENANT}/{sha(data)}")
        assert r.status_code == 404
        assert (await put(cas, data)).status_code == 201
        r = await cas.call("HEAD", f"{TENANT}/{sha(data)}")
        assert r.status_code == 200 and r.headers["content-length"] == "1000"
        assert (await put(cas, data)).status_code == 201
        assert [x[:3] for x in await refs(cas.rt.db, sha(data))] == [
            ("default", "upload", 1000)
        ] * 2

    async def test_wrong_hash_is_422_and_nothing_is_kept(self, cas):
        """A body that does not hash to its name is refused with the reason; no blob, no ref."""
        data = blob(2 * MIB, seed=2)
        name = sha(b"something else")
        r = await cas.call("PUT", f"{TENANT}/{name}", content=data)
        assert r.status_code == 422 and "does not hash to its name" in r.json()["error"]
        assert not on_disk(cas, name).exists()
        assert await refs(cas.rt.db, name) == []
        r = await cas.call("PUT", f"{TENANT}/not-a-hash", content=data)
        assert r.status_code == 400

    async def test_another_tenant_gets_404_like_a_missing_blob(self, cas):
        """Tenant b is answered for a's blob exactly as for a blob that does not exist."""
        a = await tenant_token(cas, "svc-a", "a")
        b = await tenant_token(cas, "svc-b", "b")
        data = blob(5000, seed=3)
        assert (await put(cas, data, a)).status_code == 201
        assert (await cas.call("GET", f"{TENANT}/{sha(data)}", a)).content == data
        absent = sha(b"never stored")
        for method in ("GET", "HEAD"):
            theirs = await cas.call(method, f"{TENANT}/{sha(data)}", b)
            missing = await cas.call(method, f"{TENANT}/{absent}", b)
            assert theirs.status_code == missing.status_code == 404
            assert theirs.text.replace(sha(data), "X") == missing.text.replace(absent, "X")
            named = await cas.call(method, f"{TENANT}/{sha(data)}", b, params={"tenant": "a"})
            assert named.status_code == 404
        r = await put(cas, data, b, tenant="a")
        assert r.status_code == 403
        # A job of b naming a's blob as an input is refused the same way.
        async with cas.rt.db.begin() as conn:
            with pytest.raises(NotFound):
                await references.reference_held(
                    conn, [references.Named("b", sha(data), "input", 1)], by="t", gc_days=30
                )
        # b may hold it too, by sending the bytes: then b reads it, and a's reference is intact.
        assert (await put(cas, data, b)).status_code == 201
        assert (await cas.call("GET", f"{TENANT}/{sha(data)}", b)).content == data
        assert [x[0] for x in await refs(cas.rt.db, sha(data))] == ["a", "b"]

    async def test_corrupt_blob_is_refused_removed_and_healed(self, cas):
        """A blob corrupted on disk is refused with the reason, removed, and a re-upload heals it."""
        data = blob(4000, seed=4)
        assert (await put(cas, data)).status_code == 201
        path = on_disk(cas, sha(data))
        path.write_bytes(b"X" + data[1:])
        r = await cas.call("GET", f"{TENANT}/{sha(data)}")
        assert r.status_code == 422 and "is corrupt" in r.json()["error"]
        assert not path.exists()
        assert (await cas.call("HEAD", f"{TENANT}/{sha(data)}")).status_code == 404
        assert (await put(cas, data)).status_code == 201
        assert (await cas.call("GET", f"{TENANT}/{sha(data)}")).content == data

    async def test_corruption_found_mid_stream_drops_the_answer(self, cas):
        """A large blob found corrupt after its first bytes went out is cut short and removed."""
        data = blob(3 * MIB, seed=5)
        assert (await put(cas, data)).status_code == 201
        path = on_disk(cas, sha(data))
        path.write_bytes(data[:-1] + b"X")
        # In process, what would drop the connection reaches httpx as the app's exception.
        with pytest.raises(LitestarException) as caught:
            await cas.call("GET", f"{TENANT}/{sha(data)}")
        assert any(isinstance(e, blobs.CorruptBlob) for e in causes(caught.value))
        assert not path.exists()

    async def test_a_server_without_a_store_says_so(self, api):
        """Without a store the routes answer 503, not a crash."""
        r = await api.call("HEAD", f"{TENANT}/{sha(b'x')}")
        assert r.status_code == 503


class TestWorkerRoutes:
    async def test_fleet_worker_reaches_any_blob_and_bound_worker_only_its_tenants(self, cas):
        """A fleet-wide worker reads any blob; a tenant-bound one only its tenants' blobs."""
        a = await tenant_token(cas, "svc-a", "a")
        mine, theirs = blob(100, seed=6), blob(100, seed=7)
        assert (await put(cas, mine, a)).status_code == 201
        assert (await put(cas, theirs)).status_code == 201  # tenant "default"
        fleet = await cas.mint("fleet", "worker")
        bound = await cas.mint("bound", "worker", "a")
        for data in (mine, theirs):
            r = await cas.call("GET", f"{WORKER}/{sha(data)}", fleet)
            assert r.status_code == 200 and r.content == data
        assert (await cas.call("GET", f"{WORKER}/{sha(mine)}", bound)).content == mine
        for method in ("GET", "HEAD"):
            assert (await cas.call(method, f"{WORKER}/{sha(theirs)}", bound)).status_code == 404
        # Writes: the fleet worker writes anything (kept unreferenced); the bound one may not.
        new = blob(50, seed=8)
        r = await cas.call("PUT", f"{WORKER}/{sha(new)}", bound, content=new)
        assert r.status_code == 404
        r = await cas.call("PUT", f"{WORKER}/{sha(new)}", fleet, content=new)
        assert r.status_code == 201 and await refs(cas.rt.db, sha(new)) == []
        assert (await cas.call("GET", f"{WORKER}/.id", fleet)).text.strip() == await server(
            cas
        ).id()
        # Tenants do not use the workers' route, nor workers the tenants'.
        assert (await cas.call("GET", f"{WORKER}/{sha(mine)}", a)).status_code == 403
        assert (await cas.call("GET", f"{TENANT}/{sha(mine)}", fleet)).status_code == 403

    async def test_output_reference_live_and_stale(self, cas):
        """At the live epoch the output is referenced for the job's tenant, who may read it;
        at a stale epoch the write is refused with 409 and references nothing."""
        token = await cas.mint("w2", "worker")
        job = await leased_job(cas.rt.db, await attach_worker(cas, "w2"), "w2", "t")
        out, late = blob(1234, seed=10), blob(99, seed=11)
        ok = {"job": str(job), "epoch": "1", "what": "output"}
        r = await cas.call("PUT", f"{WORKER}/{sha(out)}", token, content=out, params=ok)
        assert r.status_code == 201, r.text
        assert await refs(cas.rt.db, sha(out)) == [("t", "output", 1234, job)]
        reader = await tenant_token(cas, "svc-t", "t")
        assert (await cas.call("GET", f"{TENANT}/{sha(out)}", reader)).content == out
        stale = {**ok, "epoch": "2"}
        r = await cas.call("PUT", f"{WORKER}/{sha(late)}", token, content=late, params=stale)
        assert r.status_code == 409 and "not a live lease" in r.json()["error"]
        assert await refs(cas.rt.db, sha(late)) == []
        other = await cas.mint("w2-other", "worker")  # the live epoch, but not its worker
        r = await cas.call("PUT", f"{WORKER}/{sha(late)}", other, content=late, params=ok)
        assert r.status_code == 409
        assert await refs(cas.rt.db, sha(late)) == []
        r = await cas.call(
            "PUT", f"{WORKER}/{sha(late)}", token, content=late, params={**ok, "what": "input"}
        )
        assert r.status_code == 400


class TestCollector:
    async def test_expired_blob_goes_and_held_blob_stays(self, cas):
        """After a pass, a blob whose references all expired is gone with its rows; a blob held
        by a running job's reference stays, as does a fresh upload."""
        old, fresh, running = blob(10, seed=12), blob(10, seed=13), blob(10, seed=14)
        for data in (old, fresh):
            assert (await put(cas, data)).status_code == 201
        await age_refs(cas.rt.db, sha(old), days=31)
        worker = await cas.mint("w3", "worker")
        job = await leased_job(cas.rt.db, await attach_worker(cas, "w3"), "w3", "t")
        params = {"job": str(job), "epoch": "1", "what": "log"}
        r = await cas.call(
            "PUT", f"{WORKER}/{sha(running)}", worker, content=running, params=params
        )
        assert r.status_code == 201
        await age_refs(cas.rt.db, sha(running), days=31)  # ended_at is not what ends a job's
        done = await artifact_gc.collect(cas.rt.db, server(cas), sweep=True)
        assert done.deleted == 1
        assert not on_disk(cas, sha(old)).exists() and await refs(cas.rt.db, sha(old)) == []
        assert on_disk(cas, sha(fresh)).exists() and on_disk(cas, sha(running)).exists()
        # Once the job finished over gc_days ago, its log goes too.
        async with cas.rt.db.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE jobs SET state = 'succeeded', finished_at = now() - interval '31 days'"
                )
            )
        assert (await artifact_gc.collect(cas.rt.db, server(cas), sweep=False)).deleted == 1
        assert not on_disk(cas, sha(running)).exists()

    async def test_tiny_gc_days_and_unreferenced_blobs(self, cas, tmp_path):
        """With a tiny gc_days, an upload expires at once; a blob nobody references is noted by
        a sweep and goes on the next pass."""
        cas = rebuilt(cas, cas=ServerStore(store=server(cas).store, heals=True, gc_days=1e-9))
        data = blob(10, seed=15)
        assert (await put(cas, data)).status_code == 201
        stray = blob(10, seed=16)
        await server(cas).store.put(_once(stray), sha256=sha(stray))
        first = await artifact_gc.collect(cas.rt.db, server(cas), sweep=True)
        assert (first.deleted, first.noted) == (1, 1)
        assert not on_disk(cas, sha(data)).exists() and on_disk(cas, sha(stray)).exists()
        second = await artifact_gc.collect(cas.rt.db, server(cas), sweep=True)
        assert (second.deleted, second.noted) == (1, 0)
        assert not on_disk(cas, sha(stray)).exists()
        assert await refs(cas.rt.db, sha(stray)) == []

    async def test_the_leader_loop_collects(self, cas):
        """Two passes of the leader's loop (sweeping each pass) remove a stray blob."""
        cas = rebuilt(cas, cas=ServerStore(store=server(cas).store, heals=True, gc_days=1e-6))
        stray = blob(10, seed=19)
        await server(cas).store.put(_once(stray), sha256=sha(stray))
        loop = CollectArtifacts(cas.rt.db, server(cas), interval=0.0, sweep_seconds=0.0)
        await until(lambda: _gone_after_pass(loop, on_disk(cas, sha(stray))), "the stray blob")

    async def test_the_collector_holding_the_lock_first_loses_nothing(self, cas):
        """The collector decides and deletes under the blob's lock while an upload of that blob
        waits for it; the upload then writes the blob anew: it is there and readable."""
        data = blob(2 * MIB, seed=17)
        assert (await put(cas, data)).status_code == 201
        await age_refs(cas.rt.db, sha(data), days=31)
        async with cas.rt.db.begin() as conn:
            assert await artifact_gc.delete_if_unheld(conn, server(cas), sha256=sha(data))
            assert not on_disk(cas, sha(data)).exists()
            upload = asyncio.create_task(put(cas, data))
            await until(lambda: _waiting(cas.rt.db), "the upload waits for the collector's lock")
            assert not upload.done()
        r = await upload
        assert r.status_code == 201
        assert on_disk(cas, sha(data)).exists()
        assert (await cas.call("GET", f"{TENANT}/{sha(data)}")).content == data

    async def test_an_upload_in_progress_keeps_its_blob_from_the_collector(self, cas):
        """An upload whose reference is committed but whose body is still arriving keeps the
        blob (already stored, its old references expired): the collector re-checks and spares it."""
        data = blob(3 * MIB, seed=18)
        assert (await put(cas, data)).status_code == 201
        await age_refs(cas.rt.db, sha(data), days=31)
        first = on_disk(cas, sha(data)).stat().st_ino
        go = asyncio.Event()

        async def body() -> AsyncIterator[bytes]:
            yield data[:MIB]
            await go.wait()
            yield data[MIB:]

        upload = asyncio.create_task(cas.call("PUT", f"{TENANT}/{sha(data)}", content=body()))
        await until(lambda: _pending(cas.rt.db, sha(data)), "the upload's pending reference")
        done = await artifact_gc.collect(cas.rt.db, server(cas), sweep=True)
        assert done.deleted == 0
        async with cas.rt.db.begin() as conn:
            assert not await artifact_gc.delete_if_unheld(conn, server(cas), sha256=sha(data))
        go.set()
        assert (await upload).status_code == 201
        # The file the first upload wrote, never deleted and written again.
        assert on_disk(cas, sha(data)).stat().st_ino == first
        assert (await cas.call("GET", f"{TENANT}/{sha(data)}")).content == data


def causes(exc: BaseException) -> list[BaseException]:
    """The exception, its causes, and the members of any group among them."""
    out: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop()
        out.append(e)
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        if isinstance(e, BaseExceptionGroup):
            todo += list(e.exceptions)
    return out


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _gone_after_pass(loop: CollectArtifacts, path: Path) -> bool:
    await loop.run(asyncio.Event(), passes=1)
    return not path.exists()


async def _waiting(db: Database) -> bool:
    return await lock_waiters(db) > 0


async def _pending(db: Database, name: str) -> bool:
    return any(size < 0 for _, _, size, _ in await refs(db, name))
