"""Approvals (issue 18): a job asks through its worker's relay, another member answers.

In-process, on a real Postgres: the job's ask and its reads go the relay's way (the server's
side of it, `api/channel/relay.py`, as `job:<id>` while the lease is live); people answer over
the API with tokens of their own. Deadlines are made overdue in the table, never waited for.
"""

import asyncio
import json
import types
from typing import Any

import pytest
from sqlalchemy import text

from service import protocol
from service.api.channel import relay
from service.api.channel.session import Session
from service.domain import approvals, dispatch, leasing, tokens
from tests.integration.conftest import Api

GPU = {"pools": {"gpu": {"slots": {"default": 2}}}}


class Job:
    """A job of tenant a, created by `alice`, running on gpu1: it asks through the relay."""

    def __init__(self, api: Api, session: Session, job: int, epoch: int) -> None:
        self.api, self.session, self.id, self.epoch = api, session, job, epoch
        self._seq = 0

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        self._seq += 1
        ask = protocol.RelayRequest(
            id=self._seq,
            job=self.id,
            epoch=self.epoch,
            method=method,  # type: ignore[arg-type]
            path=path,
            body=json.dumps(body).encode() if body is not None else b"",
        )
        await relay.answer(self.api.rt.db, self.session, ask)
        got = self.session._queue.get_nowait()
        assert isinstance(got, protocol.RelayResponse)
        return got.status, json.loads(got.body) if got.body else None

    async def ask(self, title: str = "deploy v2", details: str = "to prod") -> dict[str, Any]:
        status, body = await self.call(
            "POST", "/api/v1/approvals", {"title": title, "details": details}
        )
        assert status == 201, body
        return dict(body)

    async def look(self, approval: int) -> dict[str, Any]:
        status, body = await self.call("GET", f"/api/v1/approvals/{approval}")
        assert status == 200, body
        return dict(body)


async def running_job(api: Api, alice: str, tenant: str = "a", worker: str = "gpu1") -> Job:
    token = await api.mint(worker, "worker")
    caller = await tokens.authenticate(api.rt.db, token)
    hello = protocol.Hello(
        protocol=protocol.PROTOCOL_VERSION, berth_version="t", pool="gpu", instance="i1"
    )
    attached = await leasing.attach(api.rt.db, caller, hello, server_id="s1", pools=api.rt.pools)
    r = await api.call(
        "POST", "/api/v1/jobs", alice, json={"command": ["sleep", "60"], "tenant": tenant}
    )
    assert r.status_code == 201, r.text
    done = await dispatch.run_pass(api.rt.db, [attached.worker.id], api.rt.pools)
    [(_, leased)] = done.grants
    # No socket: the relay answers into the session's queue; it reaches the app through the
    # socket's `app`, as on a real worker's socket.
    socket = types.SimpleNamespace(app=api.app)
    return Job(api, Session(worker=attached.worker, socket=socket), leased.id, leased.attempt)  # type: ignore[arg-type]


async def members(api: Api, tenant: str = "a") -> tuple[str, str]:
    return (
        await api.mint(f"alice-{tenant}", "service", tenant),
        await api.mint(f"bob-{tenant}", "service", tenant),
    )


async def answer(api: Api, token: str, approval: int, verb: str, reason: str = "") -> Any:
    return await api.call(
        "POST", f"/api/v1/approvals/{approval}/{verb}", token, json={"reason": reason}
    )


async def audit_of(api: Api, approval: int) -> list[tuple[str, str]]:
    r = await api.call("GET", "/api/v1/audit", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return [
        (e["action"], e["caller"])
        for e in reversed(r.json())
        if e["action"].startswith("approval.") and e["target"] == str(approval)
    ]


async def overdue(api: Api, approval: int) -> None:
    async with api.rt.db.begin() as conn:
        await conn.execute(
            text("UPDATE approvals SET deadline = now() - interval '1 second' WHERE id = :i"),
            {"i": approval},
        )


class TestFourEyes:
    async def test_another_member_approves_and_the_job_reads_yes(self, api_with):
        """Alice's job asks; alice may not answer (403, naming four-eyes); bob approves; the job
        reads approved; a second answer is a conflict; all of it is in the audit."""
        api = await api_with(GPU)
        alice, bob = await members(api)
        job = await running_job(api, alice)
        asked = await job.ask()
        assert asked["state"] == "pending" and asked["policy"] == "four-eyes"
        assert asked["job_creator"] == "service:alice-a"

        own = await answer(api, alice, asked["id"], "approve")
        assert own.status_code == 403, own.text
        assert "four-eyes" in own.json()["error"] and "service:alice-a" in own.json()["error"]
        assert (await job.look(asked["id"]))["state"] == "pending"

        yes = await answer(api, bob, asked["id"], "approve", "looks right")
        assert yes.status_code == 200, yes.text
        seen = await job.look(asked["id"])
        assert (seen["state"], seen["approved"], seen["answered_by"], seen["reason"]) == (
            "approved",
            True,
            "service:bob-a",
            "looks right",
        )
        again = await answer(api, bob, asked["id"], "deny")
        assert again.status_code == 409, again.text
        assert await audit_of(api, asked["id"]) == [
            ("approval.requested", f"job:{job.id}"),
            ("approval.refused", "service:alice-a"),
            ("approval.approved", "service:bob-a"),
        ]

    async def test_a_denial_reaches_the_job(self, api_with):
        api = await api_with(GPU)
        alice, bob = await members(api)
        job = await running_job(api, alice)
        asked = await job.ask()
        no = await answer(api, bob, asked["id"], "deny", "not today")
        assert no.status_code == 200, no.text
        seen = await job.look(asked["id"])
        assert (seen["state"], seen["approved"]) == ("denied", False)
        assert ("approval.denied", "service:bob-a") in await audit_of(api, asked["id"])

    async def test_any_member_lets_the_creator_answer(self, api_with):
        api = await api_with(
            {"pools": {"gpu": {"slots": {"default": 2}, "approvals": "any-member"}}}
        )
        alice, _ = await members(api)
        job = await running_job(api, alice)
        asked = await job.ask()
        assert asked["policy"] == "any-member"
        yes = await answer(api, alice, asked["id"], "approve")
        assert yes.status_code == 200, yes.text
        assert (await job.look(asked["id"]))["approved"] is True


class TestWhoSees:
    async def test_another_tenant_sees_nothing_and_answers_nothing(self, api_with):
        """Tenant b's member: the request is not in its list, and show/approve are 404."""
        api = await api_with(GPU)
        alice, _ = await members(api)
        carol = await api.mint("carol", "service", "b")
        job = await running_job(api, alice)
        asked = await job.ask()
        r = await api.call("GET", "/api/v1/approvals", carol)
        assert r.status_code == 200 and r.json() == []
        for method, path in (
            ("GET", f"/api/v1/approvals/{asked['id']}"),
            ("POST", f"/api/v1/approvals/{asked['id']}/approve"),
        ):
            r = await api.call(method, path, carol)
            assert r.status_code == 404, r.text
            assert r.json()["error"] == f"no approval request {asked['id']}"
        mine = await api.call("GET", "/api/v1/approvals", alice)
        assert [a["id"] for a in mine.json()] == [asked["id"]]

    async def test_a_person_may_not_ask_and_a_job_may_not_answer(self, api_with):
        api = await api_with(GPU)
        alice, bob = await members(api)
        job = await running_job(api, alice)
        asked = await job.ask()
        r = await api.call("POST", "/api/v1/approvals", bob, json={"title": "me too"})
        assert r.status_code == 403, r.text
        assert "only a job asks" in r.json()["error"]
        status, body = await job.call("POST", f"/api/v1/approvals/{asked['id']}/approve")
        assert status == 403, body  # the relay does not carry an answer

    async def test_show_says_what_the_job_waits_for(self, api_with):
        api = await api_with(GPU)
        alice, bob = await members(api)
        job = await running_job(api, alice)
        asked = await job.ask(title="drop table users")
        shown = (await api.call("GET", f"/api/v1/jobs/{job.id}", bob)).json()
        assert shown["waiting_for"].startswith(f"approval: drop table users (request {asked['id']}")
        await answer(api, bob, asked["id"], "deny")
        shown = (await api.call("GET", f"/api/v1/jobs/{job.id}", bob)).json()
        assert shown["waiting_for"] == ""


class TestEnds:
    async def test_an_overdue_request_is_denied_when_anyone_looks(self, api_with):
        """Past its deadline, the job reads timed_out (not approved); an approve is refused;
        the timeout is audited once, by the server."""
        api = await api_with(GPU)
        alice, bob = await members(api)
        job = await running_job(api, alice)
        asked = await job.ask()
        await overdue(api, asked["id"])
        seen = await job.look(asked["id"])
        assert (seen["state"], seen["approved"]) == ("timed_out", False)
        late = await answer(api, bob, asked["id"], "approve")
        assert late.status_code == 409, late.text
        assert "timed_out" in late.json()["error"]
        assert await audit_of(api, asked["id"]) == [
            ("approval.requested", f"job:{job.id}"),
            ("approval.timed_out", "service:berth"),
        ]

    async def test_the_leaders_pass_times_out_what_nobody_looks_at(self, api_with):
        """The deadline comes from [pools.P] approval_timeout_seconds; the pass settles it."""
        api = await api_with(
            {"pools": {"gpu": {"slots": {"default": 2}, "approval_timeout_seconds": 600}}}
        )
        alice, _ = await members(api)
        job = await running_job(api, alice)
        asked = await job.ask()
        async with api.rt.db.begin() as conn:
            seconds = (
                await conn.execute(
                    text("SELECT extract(epoch FROM deadline - created_at) FROM approvals")
                )
            ).scalar_one()
        assert 599 <= float(seconds) <= 601
        assert await approvals.settle(api.rt.db) == 0
        await overdue(api, asked["id"])
        assert await approvals.settle(api.rt.db) == 1
        assert await approvals.settle(api.rt.db) == 0
        async with api.rt.db.begin() as conn:
            state = (await conn.execute(text("SELECT state FROM approvals"))).scalar_one()
        assert state == "timed_out"

    async def test_a_cancelled_job_closes_its_request(self, api_with):
        api = await api_with(GPU)
        alice, bob = await members(api)
        job = await running_job(api, alice)
        asked = await job.ask()
        r = await api.call("POST", f"/api/v1/jobs/{job.id}/cancel", bob)
        assert r.status_code == 200, r.text
        assert await approvals.settle(api.rt.db) == 1  # the leader's pass, before anyone looks
        r = await api.call("GET", f"/api/v1/approvals/{asked['id']}", bob)
        assert r.json()["state"] == "closed", r.text
        assert (await answer(api, bob, asked["id"], "approve")).status_code == 409
        assert ("approval.closed", "service:berth") in await audit_of(api, asked["id"])
        status, _ = await job.call("GET", f"/api/v1/approvals/{asked['id']}")
        assert status == 410  # the relay itself refuses once the lease ended

    @pytest.mark.parametrize("bad", ["", "x" * 201])
    async def test_a_bad_title_is_refused(self, api_with, bad):
        api = await api_with(GPU)
        alice, _ = await members(api)
        job = await running_job(api, alice)
        status, body = await job.call("POST", "/api/v1/approvals", {"title": bad})
        assert status == 400, body
        assert "title" in body["error"]


class TestChildJobs:
    async def test_four_eyes_sees_through_a_job_that_submitted_the_job(self, api_with):
        """Alice's job submits a child (created by job:<parent>); the child asks: alice is still
        its creator for four-eyes, bob may answer."""
        api = await api_with(GPU)
        alice, bob = await members(api)
        parent = await running_job(api, alice)
        status, child = await parent.call(
            "POST", "/api/v1/jobs", {"command": ["true"], "pool": "gpu"}
        )
        assert status == 201 and child["created_by"] == f"job:{parent.id}", child
        done = await dispatch.run_pass(api.rt.db, [parent.session.worker.id], api.rt.pools)
        [(_, leased)] = done.grants
        asked = await Job(api, parent.session, leased.id, leased.attempt).ask()
        assert asked["job_creator"] == "service:alice-a"
        own = await answer(api, alice, asked["id"], "approve")
        assert own.status_code == 403 and "four-eyes" in own.json()["error"], own.text
        assert (await answer(api, bob, asked["id"], "approve")).status_code == 200


class TestBadInput:
    async def test_each_is_a_4xx_naming_the_problem(self, api_with):
        api = await api_with(GPU)
        alice, bob = await members(api)
        job = await running_job(api, alice)
        status, body = await job.call("POST", "/api/v1/approvals", {"title": "a\u0000b"})
        assert status == 400 and "title" in body["error"], body
        asked = await job.ask()
        for method, path, kw, status, said in (
            ("GET", "/api/v1/approvals?state=maybe", {}, 400, "unknown state 'maybe'"),
            ("GET", "/api/v1/approvals?limit=0", {}, 400, "limit"),
            ("GET", f"/api/v1/approvals?job={2**63}", {}, 400, "job"),
            ("GET", "/api/v1/approvals/0", {}, 404, "no approval request 0"),
            ("GET", f"/api/v1/approvals/{2**63}", {}, 404, "no approval request"),
            ("POST", f"/api/v1/approvals/{asked['id']}/approve", {"json": {"why": 1}}, 400, "why"),
            (
                "POST",
                f"/api/v1/approvals/{asked['id']}/deny",
                {"json": {"reason": 5}},
                400,
                "reason",
            ),
            ("POST", "/api/v1/approvals/999/approve", {}, 404, "no approval request 999"),
        ):
            r = await api.call(method, path, bob, **kw)
            assert r.status_code == status, (path, r.text)
            assert said in r.json()["error"] and r.json()["status"] == status, r.text
        r = await api.call("POST", f"/api/v1/approvals/{asked['id']}/approve", bob)
        assert r.status_code == 200, r.text  # no body at all is no reason


class TestSettleRaces:
    async def test_passes_and_listings_at_once_settle_each_request_once(self, api_with):
        """20 overdue requests, 8 settles and 4 listings at once: no deadlock, each request
        timed out (and audited) exactly once."""
        api = await api_with(GPU)
        alice, bob = await members(api)
        job = await running_job(api, alice)
        ids = [(await job.ask(title=f"step {i}"))["id"] for i in range(20)]
        async with api.rt.db.begin() as conn:
            await conn.execute(text("UPDATE approvals SET deadline = now()"))
        settled = await asyncio.gather(
            *[approvals.settle(api.rt.db) for _ in range(8)],
            *[api.call("GET", "/api/v1/approvals", bob) for _ in range(4)],
        )
        assert [r.status_code for r in settled[8:]] == [200] * 4, [r.text for r in settled[8:]]
        async with api.rt.db.begin() as conn:
            rows = await conn.execute(
                text(
                    "SELECT target, count(*) FROM audit WHERE action = 'approval.timed_out' "
                    "GROUP BY target"
                )
            )
            counted = {int(t): n for t, n in rows}
        assert counted == dict.fromkeys(ids, 1)


class TestSlot:
    async def test_a_job_waiting_for_approval_holds_its_slot(self, api_with):
        """One slot: while the first job waits for an answer, the next job is not leased."""
        api = await api_with({"pools": {"gpu": {"slots": {"default": 1}}}})
        alice, bob = await members(api)
        job = await running_job(api, alice)
        await job.ask()
        r = await api.call("POST", "/api/v1/jobs", bob, json={"command": ["true"], "pool": "gpu"})
        assert r.status_code == 201, r.text
        done = await dispatch.run_pass(api.rt.db, [job.session.worker.id], api.rt.pools)
        assert done.grants == []
        shown = (await api.call("GET", f"/api/v1/jobs/{r.json()['id']}", bob)).json()
        assert shown["state"] == "queued" and shown["waiting_for"], shown
