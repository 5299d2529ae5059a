"""Bounds that protect every tenant from one, through the API on a real Postgres and store:
queued jobs and stored bytes per tenant, the largest upload, who may change the tenant bounds
and who sees them; and an upload that says nothing of other tenants' blobs."""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from sqlalchemy import text

from service import protocol
from service.db.queries import workers as workers_q
from service.db.records import WorkerRecord
from service.domain import reports
from service.domain.artifacts import blobs, server_store
from service.domain.reports import Reports
from tests.integration.conftest import KEY, POOLS, Api, rebuilt
from tests.integration.test_artifacts import (
    WORKER,
    attach_worker,
    blob,
    leased_job,
    on_disk,
    refs,
    sha,
)

TENANT = "/api/v1/cas"
JOB = {"command": ["true"], "pool": "gpu"}
KB = 1000  # the bounds count decimal units: 0.00001 GB is 10 000 bytes


async def with_store(api_with: Any, extra: dict[str, Any], home: Path) -> Api:
    """An app on berth.toml's POOLS plus `extra`, with the default store under `home`."""
    api = await api_with({**POOLS, **extra})
    return rebuilt(
        api, cas=server_store.open_server_store(api.rt.effective, home=home, secret_key=KEY)
    )


async def submit(api: Api, token: str, body: Any) -> Any:
    return await api.call("POST", "/api/v1/jobs", token, json=body)


async def jobs_of(api: Api, tenant: str) -> int:
    async with api.rt.db.begin() as conn:
        return int(
            (
                await conn.execute(
                    text("SELECT count(*) FROM jobs WHERE tenant = :t"), {"t": tenant}
                )
            ).scalar_one()
        )


async def worker_record(api: Api, worker_id: str) -> WorkerRecord:
    async with api.rt.db.begin() as conn:
        return next(w for w in await workers_q.list_all(conn) if w.id == worker_id)


async def put_limit(api: Api, key: str, value: object, token: str | None = None) -> Any:
    body = {"value": value, "reason": "bounds test"}
    return await api.call("PUT", f"/api/v1/limits/{key}", token, json=body)


async def stream(data: bytes) -> AsyncIterator[bytes]:
    """A body without Content-Length (chunked): counted as it arrives."""
    for i in range(0, len(data), 4 * KB):
        yield data[i : i + 4 * KB]


class TestUploadsSayNothing:
    async def test_another_tenants_blob_and_a_new_one_are_answered_alike(self, api_with, tmp_path):
        """Tenant b uploading a blob tenant a stored gets the status and body b gets for a
        blob nobody stored; both bodies are read and checked (a wrong one is 422 either way)."""
        api = await with_store(api_with, {}, tmp_path)
        a = await api.mint("svc-a", "service", "a")
        b = await api.mint("svc-b", "service", "b")
        theirs, new = blob(3000, seed=1), blob(3000, seed=2)
        assert (
            await api.call("PUT", f"{TENANT}/{sha(theirs)}", a, content=theirs)
        ).status_code == 201
        known = await api.call("PUT", f"{TENANT}/{sha(theirs)}", b, content=theirs)
        unknown = await api.call("PUT", f"{TENANT}/{sha(new)}", b, content=new)
        assert known.status_code == unknown.status_code == 201
        assert known.json() == {"sha256": sha(theirs), "size": 3000}
        assert unknown.json() == {"sha256": sha(new), "size": 3000}
        assert known.headers.keys() == unknown.headers.keys()
        # The body of a blob the store has is still read and checked against its name.
        wrong = await api.call("PUT", f"{TENANT}/{sha(theirs)}", b, content=new)
        assert wrong.status_code == 422 and "does not hash to its name" in wrong.json()["error"]


class TestMaxQueued:
    async def test_a_tenant_at_its_bound_is_refused_and_others_go_on(self, api_with):
        """Tenant a at its max_queued gets a 429 naming tenants.a.max_queued; b still submits."""
        api = await api_with({**POOLS, "tenants": {"a": {"max_queued": 2}}})
        a = await api.mint("svc-a", "service", "a")
        b = await api.mint("svc-b", "service", "b")
        for _ in range(2):
            assert (await submit(api, a, JOB)).status_code == 201
        r = await submit(api, a, JOB)
        assert r.status_code == 429, r.text
        error = r.json()["error"]
        assert "tenants.a.max_queued = 2" in error and "tenant a has 2 queued jobs" in error
        assert await jobs_of(api, "a") == 2
        for _ in range(3):  # b lives under [tenants.default] (100000)
            assert (await submit(api, b, JOB)).status_code == 201
        assert await jobs_of(api, "b") == 3

    async def test_a_batch_crossing_the_bound_is_refused_whole(self, api_with):
        """A batch that would take a past its bound creates no job, audits none, wakes none;
        one that fits it is queued whole."""
        api = await api_with({**POOLS, "tenants": {"default": {"max_queued": 5}}})
        a = await api.mint("svc-a", "service", "a")
        assert (await submit(api, a, [JOB] * 3)).status_code == 201
        r = await submit(api, a, [JOB] * 3)
        assert r.status_code == 429, r.text
        assert "tenants.default.max_queued = 5" in r.json()["error"]
        assert await jobs_of(api, "a") == 3
        audit = (await api.call("GET", "/api/v1/audit")).json()
        assert [e["target"] for e in audit if e["action"] == "job.submitted"] == ["1..3"]
        assert (await submit(api, a, [JOB] * 2)).status_code == 201
        assert await jobs_of(api, "a") == 5

    async def test_only_queued_jobs_count(self, api_with):
        """A job that left the queue (cancelled) frees its place under the bound."""
        api = await api_with({**POOLS, "tenants": {"a": {"max_queued": 1}}})
        a = await api.mint("svc-a", "service", "a")
        first = (await submit(api, a, JOB)).json()["id"]
        assert (await submit(api, a, JOB)).status_code == 429
        assert (await api.call("POST", f"/api/v1/jobs/{first}/cancel", a)).status_code == 200
        assert (await submit(api, a, JOB)).status_code == 201

    async def test_a_limit_raises_it_at_run_time(self, api_with):
        """`limits set tenants.a.max_queued` raises the bound on the running server."""
        api = await api_with({**POOLS, "tenants": {"a": {"max_queued": 1}}})
        a = await api.mint("svc-a", "service", "a")
        assert (await submit(api, a, JOB)).status_code == 201
        assert (await submit(api, a, JOB)).status_code == 429
        r = await put_limit(api, "tenants.a.max_queued", "3")
        assert r.status_code == 200, r.text
        assert r.json()["default"] == 1 and r.json()["value"] == 3
        assert (await submit(api, a, [JOB, JOB])).status_code == 201
        r = await submit(api, a, JOB)
        assert r.status_code == 429 and "tenants.a.max_queued = 3" in r.json()["error"]
        assert (await api.call("DELETE", "/api/v1/limits/tenants.a.max_queued")).status_code == 200
        assert "tenants.a.max_queued = 1" in (await submit(api, a, JOB)).json()["error"]


STORED = {"tenants": {"a": {"max_stored_gb": 0.00002}}}  # tenant a keeps at most 20 000 bytes


class TestMaxStored:
    async def test_an_upload_past_it_is_refused_and_nothing_is_kept(self, api_with, tmp_path):
        """a's upload past its max_stored_gb is a 429 naming the key; the store and cas_refs
        have nothing of it; b's upload of the same size goes on; a may still upload a blob
        it already holds (it adds nothing)."""
        api = await with_store(api_with, STORED, tmp_path)
        a = await api.mint("svc-a", "service", "a")
        b = await api.mint("svc-b", "service", "b")
        kept, over = blob(15 * KB, seed=3), blob(8 * KB, seed=4)
        assert (await api.call("PUT", f"{TENANT}/{sha(kept)}", a, content=kept)).status_code == 201
        for body in (over, stream(over)):  # declared (Content-Length), then counted
            r = await api.call("PUT", f"{TENANT}/{sha(over)}", a, content=body)
            assert r.status_code == 429, r.text
            assert "tenants.a.max_stored_gb" in r.json()["error"]
            assert not on_disk(api, sha(over)).exists()
            assert await refs(api.rt.db, sha(over)) == []
        assert (await api.call("PUT", f"{TENANT}/{sha(kept)}", a, content=kept)).status_code == 201
        r = await api.call("PUT", f"{TENANT}/{sha(over)}", b, content=over)
        assert r.status_code == 201, r.text
        assert [x[0] for x in await refs(api.rt.db, sha(over))] == ["b"]
        # Another tenant holding it does not let a reach past its bound.
        r = await api.call("PUT", f"{TENANT}/{sha(over)}", a, content=over)
        assert r.status_code == 429
        assert [x[0] for x in await refs(api.rt.db, sha(over))] == ["b"]

    async def test_a_jobs_output_past_it_is_refused_and_its_result_says_so(
        self, api_with, tmp_path
    ):
        """A job's output written through the server past its tenant's bound is a 429 naming
        the key (nothing stored); its result then lists no outputs and the outputs written
        before it are let go: nothing of them stays referenced."""
        api = await with_store(api_with, STORED, tmp_path)
        token = await api.mint("w1", "worker")
        worker_id = await attach_worker(api, "w1")
        job = await leased_job(api.rt.db, worker_id, "w1", "a")
        first, second = blob(12 * KB, seed=5), blob(12 * KB, seed=6)
        params = {"job": str(job), "epoch": "1", "what": "output"}
        r = await api.call("PUT", f"{WORKER}/{sha(first)}", token, content=first, params=params)
        assert r.status_code == 201, r.text
        r = await api.call("PUT", f"{WORKER}/{sha(second)}", token, content=second, params=params)
        assert r.status_code == 429 and "tenants.a.max_stored_gb" in r.json()["error"]
        assert not on_disk(api, sha(second)).exists() and await refs(api.rt.db, sha(second)) == []
        # The worker reports the result without outputs (its upload failed), saying why.
        worker = await worker_record(api, worker_id)
        done = protocol.Finished(
            seq=1, job=job, epoch=1, state="failed", error="its outputs could not be kept: 429"
        )
        await reports.apply(
            api.rt.db, Reports(finished=[(worker, done)]), in_force=api.rt.effective
        )
        assert await refs(api.rt.db, sha(first)) == []
        shown = (await api.call("GET", f"/api/v1/jobs/{job}")).json()
        assert shown["state"] == "failed" and shown["outputs"] == []

    async def test_reported_outputs_past_it_are_not_kept(self, api_with, tmp_path):
        """Outputs a fleet-wide worker wrote to the store itself and reports with its result
        are not referenced past the bound: the job fails saying its outputs were not kept,
        naming the key; a job of another tenant keeps the same outputs."""
        api = await with_store(api_with, STORED, tmp_path)
        await api.mint("w1", "worker")
        worker_id = await attach_worker(api, "w1")
        mine = await leased_job(api.rt.db, worker_id, "w1", "a")
        other = await leased_job(api.rt.db, worker_id, "w1", "b")
        data = blob(25 * KB, seed=7)
        assert api.rt.cas is not None
        await blobs.write(api.rt.cas, sha(data), stream(data))  # as the worker's own store
        out = (protocol.Artifact(path="big.bin", sha256=sha(data), size=len(data)),)
        worker = await worker_record(api, worker_id)
        batch = Reports(
            finished=[
                (
                    worker,
                    protocol.Finished(seq=1, job=mine, epoch=1, state="succeeded", outputs=out),
                ),
                (
                    worker,
                    protocol.Finished(seq=2, job=other, epoch=1, state="succeeded", outputs=out),
                ),
            ]
        )
        await reports.apply(api.rt.db, batch, in_force=api.rt.effective)
        refused = (await api.call("GET", f"/api/v1/jobs/{mine}")).json()
        assert refused["state"] == "failed" and refused["outputs"] == []
        assert "outputs were not kept" in refused["error"]
        assert "tenants.a.max_stored_gb" in refused["error"]
        kept = (await api.call("GET", f"/api/v1/jobs/{other}")).json()
        assert kept["state"] == "succeeded" and [o["sha256"] for o in kept["outputs"]] == [
            sha(data)
        ]
        assert [(x[0], x[3]) for x in await refs(api.rt.db, sha(data))] == [("b", other)]


class TestMaxBlob:
    async def test_an_upload_over_it_is_413_before_it_is_stored(self, api_with, tmp_path):
        """An upload larger than [cas] max_blob_gb is a 413 naming the key, declared or
        counted; nothing is stored; a smaller one (of another tenant too) goes on."""
        api = await with_store(api_with, {"cas": {"max_blob_gb": 0.00001}}, tmp_path)
        a = await api.mint("svc-a", "service", "a")
        b = await api.mint("svc-b", "service", "b")
        big, small = blob(10 * KB + 1, seed=8), blob(10 * KB, seed=9)
        for body in (big, stream(big)):
            r = await api.call("PUT", f"{TENANT}/{sha(big)}", a, content=body)
            assert r.status_code == 413, r.text
            assert "cas.max_blob_gb" in r.json()["error"]
            assert not on_disk(api, sha(big)).exists() and await refs(api.rt.db, sha(big)) == []
        for token in (a, b):
            r = await api.call("PUT", f"{TENANT}/{sha(small)}", token, content=stream(small))
            assert r.status_code == 201, r.text
        assert sorted(x[0] for x in await refs(api.rt.db, sha(small))) == ["a", "b"]
        assert not list(Path(tmp_path, "cas").glob(".tmp-*"))


class TestWhoMayChangeAndSee:
    async def test_an_operator_of_a_changes_only_its_tenants_keys(self, api: Api):
        """An operator of tenant a sets and unsets tenants.a.*; pools.*, tenants.default.* and
        tenants.b.* are 403 saying why, and change nothing."""
        op_a = await api.mint("op-a", "operator", "a")
        r = await put_limit(api, "tenants.a.max_queued", 10, op_a)
        assert r.status_code == 200, r.text
        for key, why in [
            ("pools.gpu.slots.default", "fleet-wide operator"),
            ("pools.gpu.max_load", "fleet-wide operator"),
            ("tenants.default.max_queued", "every tenant"),
            ("tenants.b.max_queued", "tenant 'b'"),
            ("tenants.b.max_stored_gb", "tenant 'b'"),
        ]:
            r = await put_limit(api, key, 1, op_a)
            assert r.status_code == 403, (key, r.text)
            assert why in r.json()["error"]
        assert [x["key"] for x in (await api.call("GET", "/api/v1/limits")).json()] == [
            "tenants.a.max_queued"
        ]
        assert (await put_limit(api, "tenants.b.max_queued", 1)).status_code == 200
        r = await api.call("DELETE", "/api/v1/limits/tenants.b.max_queued", op_a)
        assert r.status_code == 403
        r = await api.call("DELETE", "/api/v1/limits/tenants.a.max_queued", op_a)
        assert r.status_code == 200

    async def test_a_fleet_wide_operator_changes_any(self, api: Api):
        """An operator of no tenants sets pool keys, tenants.default.* and any tenant's."""
        ops = await api.mint("ops", "operator")
        for key in (
            "pools.gpu.slots.default",
            "tenants.default.max_queued",
            "tenants.b.max_queued",
        ):
            r = await put_limit(api, key, 4, ops)
            assert r.status_code == 200, (key, r.text)
        assert (
            await api.call("DELETE", "/api/v1/limits/tenants.b.max_queued", ops)
        ).status_code == 200

    async def test_a_member_sees_no_other_tenants_keys(self, api: Api):
        """A member of a sees pool keys, tenants.default.* and tenants.a.*, never tenants.b.*,
        in `limits list` and `status`; an admin sees all."""
        for key in (
            "pools.gpu.slots.default",
            "tenants.default.max_stored_gb",
            "tenants.a.max_queued",
            "tenants.b.max_queued",
            "tenants.b.max_stored_gb",
        ):
            assert (await put_limit(api, key, 3)).status_code == 200
        member = await api.mint("svc-a", "service", "a")
        op_a = await api.mint("op-a", "operator", "a")
        mine = ["pools.gpu.slots.default", "tenants.a.max_queued", "tenants.default.max_stored_gb"]
        for token in (member, op_a):
            listed = (await api.call("GET", "/api/v1/limits", token)).json()
            assert sorted(x["key"] for x in listed) == mine
            status = (await api.call("GET", "/api/v1/status", token)).json()
            assert sorted(x["key"] for x in status["limits"]) == mine
            assert "tenants.b" not in str(status)
        assert len((await api.call("GET", "/api/v1/limits")).json()) == 5
