"""The worker channel in process: fake workers (tests/fakeworker.py) on the real app and hub.

Lease expiry, stale epochs, cancel while a worker is unreachable and refused frames, each on a
real database and the real websocket handler, without a server or worker process and without
waiting out a window: the silence loop's pass (`leasing.expire_silent`) is called with the
windows a test wants, zero to act now. kill -9, SIGSTOP, TLS and the proxies stay process
tests (tests/e2e).
"""

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import text

from service import protocol
from service.domain import fleet, leasing
from tests.fakeworker import FakeWorker, Refused, running, until
from tests.integration.conftest import Api

HOUR = 3600.0


@pytest.fixture
async def channel(api: Api, db_url: str) -> AsyncIterator[Api]:
    async with running(api, db_url):
        yield api


async def worker(api: Api, name: str, **kw: object) -> FakeWorker:
    """A fake worker holding a fresh worker token `name`, attached and welcomed."""
    fake = FakeWorker.with_token(api.app, await api.mint(name, "worker"), **kw)
    await fake.connect()
    return fake


async def submit(api: Api, **fields: object) -> int:
    r = await api.call("POST", "/api/v1/jobs", json={"command": ["true"], "pool": "gpu", **fields})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


async def job(api: Api, job_id: int) -> dict:
    return dict((await api.call("GET", f"/api/v1/jobs/{job_id}")).json())


async def liveness(api: Api, name: str) -> str:
    listed = {w["name"]: w for w in (await api.call("GET", "/api/v1/workers")).json()}
    return str(listed[name]["state"])


async def expire(api: Api, *, unreachable: float, evict: float) -> dict[str, int]:
    """One pass of the leader's silence loop (background/silence.py) with these windows."""
    return await leasing.expire_silent(api.rt.db, unreachable=unreachable, evict=evict)


class TestFencing:
    async def test_a_stale_epochs_reports_are_refused_and_change_nothing(self, channel: Api):
        """After a restart holding nothing, epoch 1 is freed and the job leased again at epoch 2;
        output and a result under epoch 1 are answered `stale` and recorded nowhere."""
        first = await worker(channel, "w1")
        j = await submit(channel)
        lease = await first.lease()
        assert (lease.job, lease.epoch) == (j, 1)
        await first.vanish()
        # The same credential, a new process holding nothing: its old lease is freed at attach.
        again = FakeWorker.with_token(channel.app, first.headers["Authorization"][7:])
        await again.connect()
        lease = await again.lease()
        assert (lease.job, lease.epoch) == (j, 2)
        again.send(protocol.Output(seq=1, job=j, epoch=1, stream="stdout", data=b"STALE"))
        assert (await again.next(protocol.Stale)) == protocol.Stale(job=j, epoch=1)
        again.send(protocol.Finished(seq=2, job=j, epoch=1, state="succeeded", exit_code=0))
        assert (await again.next(protocol.Stale)) == protocol.Stale(job=j, epoch=1)
        shown = await job(channel, j)
        assert (shown["state"], shown["attempt"], shown["exit_code"]) == ("leased", 2, None)
        await again.report(protocol.Finished(seq=3, job=j, epoch=2, state="failed", exit_code=7))
        shown = await job(channel, j)
        assert (shown["state"], shown["exit_code"]) == ("failed", 7)
        logs = (await channel.call("GET", f"/api/v1/jobs/{j}/logs")).json()
        assert all("STALE" not in c["data"] for c in logs["chunks"])


class TestSilence:
    async def test_a_silent_workers_lease_moves_only_after_both_windows(self, channel: Api):
        """Silent past `unreachable`: no new work, its lease kept. Past `evict` too: lost, and
        its job goes to another worker at the next epoch; the silent one's late result is
        stale."""
        silent = await worker(channel, "w1")
        j = await submit(channel)
        lease = await silent.lease()
        await silent.report(protocol.Started(seq=silent.next_seq(), job=j, epoch=1))
        # From here w1 says nothing: no beat, no report.
        assert await expire(channel, unreachable=HOUR, evict=HOUR) == {
            "unreachable": 0,
            "lost": 0,
            "requeued": 0,
        }
        assert await liveness(channel, "w1") == "active"
        assert (await expire(channel, unreachable=0, evict=HOUR))["unreachable"] == 1
        assert await liveness(channel, "w1") == "unreachable"
        shown = await job(channel, j)
        assert (shown["state"], shown["attempt"], shown["worker"]) == ("running", 1, "w1")
        assert await expire(channel, unreachable=0, evict=0) == {
            "unreachable": 0,
            "lost": 1,
            "requeued": 1,
        }
        assert await liveness(channel, "w1") == "lost"
        other = await worker(channel, "w2")
        moved = await other.lease()
        assert (moved.job, moved.epoch) == (j, 2)
        await other.report(
            protocol.Finished(seq=other.next_seq(), job=j, epoch=2, state="succeeded", exit_code=0)
        )
        shown = await job(channel, j)
        assert (shown["state"], shown["attempt"], shown["worker"]) == ("succeeded", 2, "w2")
        # w1 wakes up and reports its copy: too late, and it is told to kill it.
        silent.send(
            protocol.Finished(seq=silent.next_seq(), job=j, epoch=lease.epoch, state="failed")
        )
        assert (await silent.next(protocol.Stale)) == protocol.Stale(job=j, epoch=1)
        assert (await job(channel, j))["state"] == "succeeded"

    async def test_a_beat_keeps_a_worker_out_of_the_window(self, channel: Api):
        """A worker that beat since the window's start is neither unreachable nor lost."""
        live = await worker(channel, "w1")
        j = await submit(channel)
        await live.lease()
        await live.beat()
        assert (await expire(channel, unreachable=HOUR, evict=0))["lost"] == 0
        assert await liveness(channel, "w1") == "active"
        assert (await job(channel, j))["attempt"] == 1

    async def test_cancel_while_the_worker_is_unreachable(self, channel: Api):
        """Cancelling a job whose worker is unreachable marks it cancelled at once; the cancel
        waits on the worker's socket and is the first thing it reads when it wakes."""
        silent = await worker(channel, "w1")
        j = await submit(channel)
        await silent.lease()
        await silent.report(protocol.Started(seq=silent.next_seq(), job=j, epoch=1))
        assert (await expire(channel, unreachable=0, evict=HOUR))["unreachable"] == 1
        assert await liveness(channel, "w1") == "unreachable"
        r = await channel.call("POST", f"/api/v1/jobs/{j}/cancel")
        assert (r.status_code, r.json()["state"]) == (200, "cancelled")
        cancel = await silent.next(protocol.Cancel)
        assert (cancel.job, cancel.epoch) == (j, 1)
        await silent.report(
            protocol.Finished(seq=silent.next_seq(), job=j, epoch=1, state="cancelled")
        )
        shown = await job(channel, j)
        assert (shown["state"], shown["attempt"]) == ("cancelled", 1)


class TestSlowSocket:
    async def test_a_worker_that_stops_reading_delays_no_one(
        self, api_with: Callable[[dict[str, Any]], Awaitable[Api]], db_url: str
    ):
        """One worker stops reading while megabytes of leases queue for it; the others' beats are
        all acknowledged and their jobs all finish."""
        api = await api_with(
            {"pools": {"gpu": {"slots": {"default": 4}}, "slow": {"slots": {"default": 32}}}}
        )
        async with running(api, db_url):
            slow = await worker(api, "slow", pool="slow")
            assert slow.socket is not None
            slow.socket.stop_reading()
            big = {f"V{i}": "x" * 120_000 for i in range(8)}  # ~960 KB per lease
            for _ in range(16):  # (a body is bounded: two such jobs at a time)
                r = await api.call(
                    "POST",
                    "/api/v1/jobs",
                    json=[{"command": ["true"], "pool": "slow", "env": big} for _ in range(2)],
                )
                assert r.status_code == 201, r.text
            await until(lambda: _leased(api, 32), "32 leases (~30 MB) granted to the slow worker")
            good = [await worker(api, f"good{i}") for i in range(2)]
            r = await api.call(
                "POST", "/api/v1/jobs", json=[{"command": ["true"], "pool": "gpu"}] * 12
            )
            gpu_jobs = set(r.json()["ids"])
            done: set[int] = set()
            while not gpu_jobs <= done:
                for w in good:
                    await w.beat()  # each beat of theirs is acked while slow's writes wait
                    with contextlib.suppress(TimeoutError):
                        lease = await w.lease(timeout=0.2)
                        await w.report(
                            protocol.Finished(
                                seq=w.next_seq(),
                                job=lease.job,
                                epoch=lease.epoch,
                                state="succeeded",
                            )
                        )
                        done.add(lease.job)
            states = {
                j["id"]: j["state"]
                for j in (await api.call("GET", "/api/v1/jobs", params={"limit": 100})).json()
            }
            assert all(states[j] == "succeeded" for j in gpu_jobs)
            assert slow.socket.pending() == 0  # every write to it since it stopped is waiting
            await slow.vanish()


async def _leased(api: Api, n: int) -> bool:
    async with api.rt.db.begin() as conn:
        count = await conn.scalar(text("SELECT count(*) FROM jobs WHERE state = 'leased'"))
    return bool(count == n)


class TestForgotten:
    async def test_lost_and_gone_workers_are_forgotten_and_a_live_one_stays(self, channel: Api):
        """A worker whose socket dropped (lost, once silent past the windows) and one that said
        bye (gone) leave the list after `forget_lost_after_seconds`, audited; one that beats
        stays."""
        killed = await worker(channel, "killed")
        stopped = await worker(channel, "stopped")
        live = await worker(channel, "live")
        await killed.vanish()
        await stopped.leave()
        await until(lambda: _gone(channel, "stopped"), "the goodbye to be recorded")
        assert (await expire(channel, unreachable=0, evict=0))["lost"] >= 1
        await live.beat()  # heard again: no longer silent
        assert await liveness(channel, "killed") == "lost"
        assert await fleet.forget_lost(channel.rt.db, after=HOUR) == []  # not that long yet
        assert sorted(await fleet.forget_lost(channel.rt.db, after=0)) == ["killed", "stopped"]
        listed = {w["name"] for w in (await channel.call("GET", "/api/v1/workers")).json()}
        assert listed == {"live"}
        audit = (await channel.call("GET", "/api/v1/audit", params={"limit": 200})).json()
        forgotten = sorted(e["target"] for e in audit if e["action"] == "worker.forgotten")
        assert forgotten == ["killed", "stopped"]


async def _gone(api: Api, name: str) -> bool:
    async with api.rt.db.begin() as conn:
        liveness = await conn.scalar(
            text("SELECT liveness FROM workers WHERE name = :n"), {"n": name}
        )
    return bool(liveness == "gone")


def raw(**frame: object) -> str:
    return json.dumps(frame)


BAD_FRAMES = [
    pytest.param(
        protocol.encode(
            protocol.Output(
                seq=1, job=1, epoch=1, stream="stdout", data=b"x" * (protocol.MAX_OUTPUT + 1)
            )
        ).decode(),
        "$.data",
        id="oversized-output",
    ),
    pytest.param(raw(type="explode.v2", seq=1), "explode.v2", id="unknown-type"),
    pytest.param(raw(type="started.v2", seq=1, job=1, epoch=0), "$.epoch", id="epoch-zero"),
    pytest.param(raw(type="started.v2", seq=1, job=1, epoch=2**31), "$.epoch", id="epoch-big"),
    pytest.param(raw(type="started.v2", seq=-1, job=1, epoch=1), "$.seq", id="negative-seq"),
    pytest.param(raw(type="beat.v2", seq=1, host={}, extra=1), "extra", id="unknown-field"),
    pytest.param("{not json", "bad frame", id="not-json"),
    pytest.param(
        protocol.encode(
            protocol.Hello(
                protocol=protocol.PROTOCOL_VERSION, berth_version="t", pool="gpu", instance="i"
            )
        ).decode(),
        "hello was already said",
        id="second-hello",
    ),
]


BAD_HELLOS = [
    pytest.param(raw(type="hello.v1", protocol=1), "protocol 1 is not the server's", id="old"),
    pytest.param(
        protocol.encode(protocol.Beat(seq=1, host=protocol.Host())).decode(),
        # it carries no protocol number: read as one of another version
        "protocol 0 is not the server's",
        id="beat-first",
    ),
    pytest.param(
        raw(
            type="hello.v2",
            protocol=protocol.PROTOCOL_VERSION,
            berth_version="t",
            pool="gpu",
            instance="i\x00",
        ),
        "$.instance",
        id="control-character",
    ),
    pytest.param(
        raw(
            type="hello.v2",
            protocol=protocol.PROTOCOL_VERSION,
            berth_version="t",
            pool="nope",
            instance="i",
        ),
        "nope",
        id="unknown-pool",
    ),
]


class TestBadFrames:
    async def test_a_bad_frame_is_refused_naming_it_and_records_nothing(self, channel: Api):
        """The worker is told why, the socket closes (4001), and nothing of it is kept: the
        job it holds is still leased, with no output. (One database, a worker and job a case.)"""
        for n, case in enumerate(BAD_FRAMES):
            text, says = case.values
            fake = await worker(channel, f"w{n}")
            j = await submit(channel)
            assert (await fake.lease()).job == j
            fake.send_raw(text.replace('"job":1,', f'"job":{j},'))
            refused = await fake.next(protocol.Refused)
            assert says in refused.reason, (case.id, refused.reason)
            assert (await fake.closed()).code == 4001, case.id
            shown = await job(channel, j)
            assert (shown["state"], shown["attempt"]) == ("leased", 1), case.id
            logs = (await channel.call("GET", f"/api/v1/jobs/{j}/logs")).json()
            assert logs["chunks"] == [], case.id

    async def test_a_bad_hello_is_refused_and_attaches_nothing(self, channel: Api):
        """A hello the server cannot take: refused with the reason, closed, no worker listed."""
        for n, case in enumerate(BAD_HELLOS):
            first, says = case.values
            fake = FakeWorker.with_token(channel.app, await channel.mint(f"w{n}", "worker"))
            with pytest.raises(Refused) as refused:
                await fake.connect(first)
            assert says in refused.value.reason, (case.id, refused.value.reason)
            assert refused.value.closed.code == 4001, case.id
        listed = (await channel.call("GET", "/api/v1/workers")).json()
        assert not any(w["attached"] for w in listed)

    async def test_a_credential_that_is_not_a_workers_is_refused(self, channel: Api):
        """A member's token, an unknown token and no token: refused before any hello is read."""
        member = await channel.mint("alice", "service", "default")
        for headers, says in [
            ({"Authorization": f"Bearer {member}"}, "not a worker's"),
            ({"Authorization": "Bearer brt_" + "y" * 43}, "unknown token"),
            ({}, "missing bearer token"),
        ]:
            fake = FakeWorker(app=channel.app, headers=headers)
            with pytest.raises(Refused) as refused:
                await fake.connect()
            assert says in refused.value.reason, refused.value.reason
