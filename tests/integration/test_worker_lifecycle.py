"""Workers that are gone leave the fleet: `worker rm` now, or the leader's loop after
`[executor] forget_lost_after_seconds` (SPEC section 2)."""

import uuid

from sqlalchemy import text

from service.db.engine import Database
from service.domain import fleet
from tests.integration.conftest import Api


async def add_worker(db: Database, name: str, *, liveness: str, server: str | None) -> str:
    worker_id = str(uuid.uuid4())
    async with db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO workers (id, name, pool, instance, server_id, host, liveness) "
                "VALUES (:id, :n, 'gpu', 'i', :s, '{}', :l)"
            ),
            {"id": worker_id, "n": name, "s": server, "l": liveness},
        )
    return worker_id


async def lease(db: Database, worker_id: str, *, state: str) -> int:
    """A job of this worker with a lease in `state` (live, or done: its history)."""
    async with db.begin() as conn:
        job = (
            await conn.execute(
                text(
                    "INSERT INTO jobs (tenant, pool, command, created_by, state, attempt) "
                    "VALUES ('default', 'gpu', ARRAY['true'], 'test', :js, 1) RETURNING id"
                ),
                {"js": "running" if state == "live" else "succeeded"},
            )
        ).scalar_one()
        await conn.execute(
            text(
                "INSERT INTO leases (job_id, epoch, worker_id, kind, state) "
                "VALUES (:j, 1, :w, 'default', :s)"
            ),
            {"j": job, "w": worker_id, "s": state},
        )
    return int(job)


async def names(api: Api) -> set[str]:
    return {w["name"] for w in (await api.call("GET", "/api/v1/workers")).json()}


class TestRemove:
    async def test_a_gone_worker_is_removed_with_its_history(self, api: Api):
        """`DELETE /api/v1/workers/NAME` of a gone worker: 200, unlisted, audited; its job stays."""
        db = api.rt.db
        wid = await add_worker(db, "old", liveness="gone", server=None)
        job = await lease(db, wid, state="done")
        r = await api.call("DELETE", "/api/v1/workers/old")
        assert (r.status_code, r.json()) == (200, {"name": "old", "removed": True})
        assert "old" not in await names(api)
        assert (await api.call("GET", f"/api/v1/jobs/{job}")).json()["state"] == "succeeded"
        audit = (await api.call("GET", "/api/v1/audit")).json()
        assert any(e["action"] == "worker.removed" and e["target"] == "old" for e in audit)

    async def test_refused_while_it_holds_a_lease_or_is_attached(self, api: Api):
        """409 naming the leases it holds, or that it is attached; nothing removed."""
        db = api.rt.db
        busy = await add_worker(db, "busy", liveness="lost", server=None)
        job = await lease(db, busy, state="live")
        await add_worker(db, "up", liveness="ok", server="test")
        r = await api.call("DELETE", "/api/v1/workers/busy")
        assert r.status_code == 409 and f"holds 1 lease(s) now (job {job})" in r.json()["error"]
        r = await api.call("DELETE", "/api/v1/workers/up")
        assert r.status_code == 409 and "is attached" in r.json()["error"]
        assert {"busy", "up"} <= await names(api)

    async def test_unknown_and_not_allowed(self, api: Api):
        """An unknown name is 404; a member (no fleet.write) is 403."""
        await add_worker(api.rt.db, "old", liveness="gone", server=None)
        assert (await api.call("DELETE", "/api/v1/workers/nobody")).status_code == 404
        member = await api.mint("ci", "service")
        assert (await api.call("DELETE", "/api/v1/workers/old", token=member)).status_code == 403
        operator = await api.mint("op", "operator")
        assert (await api.call("DELETE", "/api/v1/workers/old", token=operator)).status_code == 200


class TestForget:
    async def test_lost_and_gone_workers_past_the_window(self, api: Api):
        """The leader's pass forgets lost and gone workers silent that long, holding no lease."""
        db = api.rt.db
        await add_worker(db, "lost", liveness="lost", server=None)
        await add_worker(db, "gone", liveness="gone", server=None)
        await add_worker(db, "up", liveness="ok", server="test")
        holding = await add_worker(db, "holding", liveness="lost", server=None)
        await lease(db, holding, state="live")
        await lease(db, await add_worker(db, "ran", liveness="gone", server=None), state="done")
        async with db.begin() as conn:
            await conn.execute(text("UPDATE workers SET last_seen_at = now() - interval '2 hours'"))
        assert await fleet.forget_lost(db, after=3 * 3600.0) == []  # not that long yet
        assert await fleet.forget_lost(db, after=3600.0) == ["gone", "lost", "ran"]
        assert await names(api) == {"up", "holding"}
        audit = (await api.call("GET", "/api/v1/audit")).json()
        assert sorted(e["target"] for e in audit if e["action"] == "worker.forgotten") == [
            "gone",
            "lost",
            "ran",
        ]
