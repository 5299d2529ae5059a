"""A worker's name is not its identity (SPEC section 2): rows, leases, reports and relayed calls
belong to the credential that attached the worker. In-process, on a real Postgres.

An impostor is a credential of another identity under a live worker's name: a tenant's worker
token minted under a revoked fleet worker's name, or a proxy principal naming itself like one.
"""

import pytest
from sqlalchemy import text

from service import protocol
from service.auth.callers import Caller, Kind, Role
from service.domain import dispatch, leasing, reports, tokens
from service.domain.leasing import Refusal


def hello(pool: str = "gpu", held: tuple[tuple[int, int], ...] = (), instance: str = "i1"):
    return protocol.Hello(
        protocol=protocol.PROTOCOL_VERSION,
        berth_version="t",
        pool=pool,
        instance=instance,
        held=held,
    )


async def submit(api, tenant: str) -> int:
    body = {"command": ["sleep", "60"], "pool": "gpu", "tenant": tenant}
    r = await api.call("POST", "/api/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


async def job_row(api, job: int) -> dict:
    r = await api.call("GET", f"/api/v1/jobs/{job}")
    assert r.status_code == 200, r.text
    return r.json()


async def fleet_worker_with_b_job(api):
    """gpu1, a fleet-wide worker, holding the live lease of tenant b's job."""
    token = await api.mint("gpu1", "worker")
    caller = await tokens.authenticate(api.rt.db, token)
    attached = await leasing.attach(api.rt.db, caller, hello(), server_id="s1", pools=api.rt.pools)
    job = await submit(api, "b")
    done = await dispatch.run_pass(api.rt.db, [attached.worker.id], api.rt.pools)
    assert [(w, j.id) for w, j in done.grants] == [(attached.worker.id, job)]
    return attached.worker, job, done.grants[0][1].attempt


class TestTokenMode:
    async def test_a_name_holding_leases_is_not_reissued(self, api):
        """Revoking gpu1 while it holds b's lease frees the name for nobody: minting it again
        (an operator of tenant a, or an admin) is refused while the lease is live."""
        await fleet_worker_with_b_job(api)
        r = await api.call("DELETE", "/api/v1/tokens/gpu1")
        assert r.status_code == 200, r.text
        operator = await api.mint("op-a", "operator", "a")
        for token, tenants in ((operator, ["a"]), (None, [])):
            body = {"name": "gpu1", "kind": "worker", "tenants": tenants}
            r = await api.call("POST", "/api/v1/tokens", token, json=body)
            assert r.status_code == 409, r.text
            assert "still holds leases" in r.json()["error"]

    async def test_another_identity_cannot_attach_under_a_busy_name(self, api):
        """A credential of another identity naming a worker that holds leases is refused, and
        the live lease stays where it was."""
        worker, job, epoch = await fleet_worker_with_b_job(api)
        impostor = Caller(Kind.WORKER, "gpu1", Role.WORKER, frozenset({"a"}), identity="token:999")
        with pytest.raises(Refusal, match="belongs to another credential"):
            await leasing.attach(
                api.rt.db, impostor, hello(held=((job, epoch),)), server_id="s2", pools=api.rt.pools
            )
        assert await leasing.live_job(api.rt.db, worker, job=job, epoch=epoch) is not None
        assert (await job_row(api, job))["state"] == "leased"

    async def test_after_the_name_is_free_nothing_carries_over(self, api):
        """Once gpu1 is lost and its lease expired, another identity may take the name: it gets
        a row of its own, the held lease is dropped, not adopted, and the old lease's reports
        and relayed calls are refused for it."""
        worker, job, epoch = await fleet_worker_with_b_job(api)
        moved = await leasing.expire_silent(api.rt.db, unreachable=0, evict=0)
        assert moved["requeued"] == 1
        again = await dispatch.run_pass(api.rt.db, [worker.id], api.rt.pools)
        assert again.grants == []  # a lost worker takes nothing
        impostor = Caller(Kind.WORKER, "gpu1", Role.WORKER, frozenset({"a"}), identity="token:999")
        attached = await leasing.attach(
            api.rt.db,
            impostor,
            hello(held=((job, epoch),), instance="i2"),
            server_id="s2",
            pools=api.rt.pools,
        )
        assert attached.worker.id != worker.id and attached.worker.identity == "token:999"
        assert attached.drop == ((job, epoch),)
        assert (await job_row(api, job))["state"] == "queued"
        assert await leasing.live_job(api.rt.db, attached.worker, job=job, epoch=epoch) is None
        batch = reports.Reports()
        batch.add(
            attached.worker,
            protocol.Finished(seq=1, job=job, epoch=epoch, state="succeeded", exit_code=0),
        )
        verdicts = await reports.apply(api.rt.db, batch)
        assert verdicts.stale == {(attached.worker.id, job, epoch)}
        shown = await job_row(api, job)
        assert shown["state"] == "queued" and shown["exit_code"] is None
        # b's job is a's worker's to take never: it serves tenant a only.
        none = await dispatch.run_pass(api.rt.db, [attached.worker.id], api.rt.pools)
        assert none.grants == []

    async def test_held_leases_of_a_tenant_not_served_are_given_back(self, api):
        """A worker that reattaches serving fewer tenants gives back the leases of the others,
        never resumes them (its token's tenants are what it serves)."""
        token = await api.mint("box", "worker")
        caller = await tokens.authenticate(api.rt.db, token)
        first = await leasing.attach(api.rt.db, caller, hello(), server_id="s1", pools=api.rt.pools)
        job = await submit(api, "b")
        done = await dispatch.run_pass(api.rt.db, [first.worker.id], api.rt.pools)
        epoch = done.grants[0][1].attempt
        bound = Caller(Kind.WORKER, "box", Role.WORKER, frozenset({"a"}), identity=caller.identity)
        again = await leasing.attach(
            api.rt.db, bound, hello(held=((job, epoch),)), server_id="s1", pools=api.rt.pools
        )
        assert again.worker.id == first.worker.id  # the same identity keeps its row
        assert again.drop == ((job, epoch),) and again.freed == 1
        assert (await job_row(api, job))["state"] == "queued"

    async def test_the_same_identity_resumes_its_leases(self, api):
        """The identity that leased a job resumes it after a reconnect (nothing regresses)."""
        worker, job, epoch = await fleet_worker_with_b_job(api)
        async with api.rt.db.begin() as conn:
            identity = (
                await conn.execute(
                    text("SELECT identity FROM workers WHERE id = :id"), {"id": worker.id}
                )
            ).scalar_one()
        same = Caller(Kind.WORKER, "gpu1", Role.WORKER, frozenset(), identity=identity)
        again = await leasing.attach(
            api.rt.db, same, hello(held=((job, epoch),)), server_id="s2", pools=api.rt.pools
        )
        assert again.worker.id == worker.id and again.drop == () and again.freed == 0
        assert await leasing.live_job(api.rt.db, again.worker, job=job, epoch=epoch) is not None
