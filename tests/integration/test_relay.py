"""A job's relayed calls at the protocol, in process: a fake worker (tests/fakeworker.py) asks
for its job what `berth_runtime` would; the server answers as the job while the lease is live,
403 for what a job may not do, 410 once the lease ended, and 429 at once past
`[executor] relay_max_in_flight` while the worker's beats go on."""

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from service import protocol
from service.db.engine import plain_url
from tests.fakeworker import FakeWorker, running, until
from tests.integration.conftest import Api

GPU = {"pools": {"gpu": {"slots": {"default": 2}}}}


@pytest.fixture
async def channel(
    api_with: Callable[[dict[str, Any]], Awaitable[Api]], db_url: str
) -> AsyncIterator[Api]:
    api = await api_with({**GPU, "executor": {"relay_max_in_flight": 2}})
    async with running(api, db_url):
        yield api


async def leased(api: Api) -> tuple[FakeWorker, protocol.Lease]:
    """A fake worker holding the lease of a new job of tenant ml."""
    fake = FakeWorker.with_token(api.app, await api.mint("raw", "worker"))
    await fake.connect()
    r = await api.call(
        "POST", "/api/v1/jobs", json={"command": ["true"], "pool": "gpu", "tenant": "ml"}
    )
    assert r.status_code == 201, r.text
    lease = await fake.lease()
    assert lease.job == r.json()["id"]
    return fake, lease


def ask(fake: FakeWorker, n: int, lease: protocol.Lease, path: str, **kw: Any) -> None:
    fields: dict[str, Any] = {"method": "GET", "epoch": lease.epoch, **kw}
    fake.send(protocol.RelayRequest(id=n, job=lease.job, path=path, **fields))


async def answer(fake: FakeWorker, n: int) -> protocol.RelayResponse:
    return await fake.next(protocol.RelayResponse, lambda got: got.id == n)


class TestRelayEnds:
    async def test_the_server_refuses_a_relay_once_the_lease_ended(self, channel: Api):
        """A relayed call under a live lease is answered as the job; a call the job may not
        make is 403; once the result is in, the same call is 410."""
        fake, lease = await leased(channel)
        j = lease.job
        ask(fake, 1, lease, f"/api/v1/jobs/{j}")
        shown = await answer(fake, 1)
        assert shown.status == 200 and json.loads(shown.body)["tenant"] == "ml"
        for n, (method, path) in enumerate(
            [
                ("GET", "/api/v1/secrets"),
                ("GET", f"/api/v1/jobs/{j}/../../secrets"),
                ("POST", "/api/v1/tokens"),
                ("GET", "/api/v1/audit"),
            ],
            start=2,
        ):
            ask(fake, n, lease, path, method=method)
            assert (await answer(fake, n)).status == 403, path
        ask(fake, 7, lease, f"/api/v1/jobs/{j}/logs?follow=true")
        assert (await answer(fake, 7)).status == 400
        ask(fake, 8, lease, f"/api/v1/jobs/{j}", epoch=lease.epoch + 1)
        assert (await answer(fake, 8)).status == 410
        await fake.report(
            protocol.Finished(seq=fake.next_seq(), job=j, epoch=lease.epoch, state="succeeded")
        )
        ask(fake, 9, lease, f"/api/v1/jobs/{j}")
        after = await answer(fake, 9)
        assert after.status == 410 and b"lease has ended" in after.body


class TestRelayInFlight:
    async def test_calls_past_the_bound_get_429_at_once_while_beats_go_on(
        self, channel: Api, db_url: str
    ):
        """With relay_max_in_flight = 2 and the database holding every relayed call, a worker's
        five calls: two wait, three are answered 429 at once naming the bound; its beats are
        acked meanwhile; once the two are answered, the session takes calls again."""
        fake, lease = await leased(channel)
        path = f"/api/v1/jobs/{lease.job}"
        db = await asyncpg.connect(plain_url(db_url))
        held = db.transaction()
        await held.start()
        # Every relayed call reads the job: with the table locked, each waits in flight.
        await db.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        try:
            for n in range(1, 6):
                ask(fake, n, lease, path)
            refused = {n: await answer(fake, n) for n in (3, 4, 5)}
            for n in (3, 4, 5):
                assert refused[n].status == 429
                assert b"executor.relay_max_in_flight = 2" in refused[n].body
            await fake.beat()  # the worker's beats are written and acked meanwhile
            await until(lambda: _waiting(db), "the two calls to wait on the lock")
            assert not any(isinstance(f, protocol.RelayResponse) for f in fake.seen)
        finally:
            await held.rollback()
            await db.close()
        answered = {n: await answer(fake, n) for n in (1, 2)}
        assert answered[1].status == answered[2].status == 200
        assert json.loads(answered[1].body)["id"] == lease.job
        ask(fake, 6, lease, path)
        assert (await answer(fake, 6)).status == 200
        await fake.beat()


async def _waiting(db: asyncpg.Connection) -> bool:
    """Two statements of this database wait on a lock (the two relayed calls in flight)."""
    waiting = await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return bool(waiting >= 2)
