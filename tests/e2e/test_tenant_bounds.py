"""Bounds on what a job reaches through its relay, end to end (SPEC section 8): what one job
may save, queued jobs of its tenant when it submits jobs, and relayed calls in flight per
worker session; past each the job (or the worker) is told the bound by name and the worker's
other work goes on."""

import asyncio
import json
import textwrap

import asyncpg
import websockets

from service import protocol
from service.db.engine import plain_url
from tests.procs import wait_for

GPU = {"pools": {"gpu": {"slots": {"default": 2}}, "idle": {"slots": {"default": 1}}}}


def attached(s, name: str) -> bool:
    return any(w["name"] == name and w["attached"] for w in s.api("GET", "/api/v1/workers").json())


SAVING_JOB = textwrap.dedent(
    """
    import json, os, subprocess
    from berth_runtime import RelayError, save_artifact

    def save(name, size):
        with open(name, "wb") as f:
            f.write(os.urandom(size))
        try:
            return {"ref": save_artifact(name)}
        except RelayError as exc:
            return {"error": str(exc)}

    said = {"first": save("a.bin", 6000), "second": save("b.bin", 6000), "third": save("c.bin", 3000)}
    children = [
        subprocess.run(["berth", "job", "submit", "--pool", "idle", "--", "true"],
                       capture_output=True, text=True)
        for _ in range(2)
    ]
    said["children"] = [[c.returncode, c.stdout.strip(), c.stderr.strip()] for c in children]
    print(json.dumps(said))
    """
)


class TestRelayBounds:
    def test_a_job_saving_past_its_bound_is_told_and_its_worker_goes_on(
        self, server_factory, worker_factory, tmp_path
    ):
        """With relay_max_save_gb at 10 000 bytes, a job's second save of 6 000 bytes is refused
        naming executor.relay_max_save_gb while a smaller one still fits; its second child job
        past tenants.ml.max_queued is refused by name; the worker stays attached and runs the
        next job."""
        s = server_factory(
            {
                **GPU,
                "executor": {"relay_max_save_gb": 0.00001},
                "tenants": {"ml": {"max_queued": 1}},
            },
            builtin_worker=False,
        )
        worker_factory(
            s, s.worker_token("gpu1"), "gpu", "--python", "/usr/bin/python3", name="gpu1"
        )
        wait_for(lambda: attached(s, "gpu1"), 20, "gpu1 attached")
        script = tmp_path / "job.py"
        script.write_text(SAVING_JOB)
        r = s.cli(
            "job", "submit", "--wait", "--pool", "gpu", "--tenant", "ml", "--python", str(script),
            timeout=120,
        )  # fmt: skip
        assert r.code == 0, r.err
        said = json.loads(r.out.strip().splitlines()[-1])
        assert "ref" in said["first"] and "ref" in said["third"], said
        assert "executor.relay_max_save_gb" in said["second"]["error"], said
        assert "nothing was saved" in said["second"]["error"]
        for key in ("first", "third"):
            ref = said[key]["ref"]
            assert s.api("HEAD", f"/api/v1/cas/{ref}", params={"tenant": "ml"}).status_code == 200
        (first_code, child, _), (second_code, _, second_err) = said["children"]
        assert first_code == 0 and child.isdigit()
        assert second_code != 0 and "tenants.ml.max_queued = 1" in second_err, said
        queued = s.api("GET", "/api/v1/jobs", params={"state": "queued"}).json()
        assert [j["id"] for j in queued] == [int(child)]
        # The worker was never cut off: still attached, it runs the next job.
        assert attached(s, "gpu1")
        assert s.cli("job", "cancel", child).code == 0
        r = s.cli("job", "submit", "--wait", "--pool", "gpu", "--tenant", "ml", "--", "true")
        assert r.code == 0, r.err


class Reader:
    """Every frame the server sends one raw worker, kept in order; waits on conditions."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.frames: list[protocol.Frame] = []
        self._new = asyncio.Event()

    async def run(self) -> None:
        async for raw in self.ws:
            self.frames.append(protocol.decode_to_worker(raw))
            self._new.set()

    async def until(self, found, what: str, timeout: float = 20.0):
        async with asyncio.timeout(timeout):
            while not (got := found(self.frames)):
                self._new.clear()
                await self._new.wait()
        return got

    def answers(self) -> dict[int, protocol.RelayResponse]:
        return {f.id: f for f in self.frames if isinstance(f, protocol.RelayResponse)}

    def acks(self) -> set[int]:
        return {f.seq for f in self.frames if isinstance(f, protocol.Ack)}


class TestRelayInFlight:
    async def test_calls_past_the_bound_get_429_at_once_while_beats_go_on(
        self, server_factory, sync_db_url
    ):
        """With relay_max_in_flight = 2 and the database holding every relayed call, a worker's
        five calls: two wait, three are answered 429 at once naming the bound; its beats are
        acked meanwhile; once the two are answered, the session takes calls again."""
        s = server_factory({**GPU, "executor": {"relay_max_in_flight": 2}}, builtin_worker=False)
        token = s.worker_token("raw")
        job = int(s.cli("job", "submit", "--pool", "gpu", "--tenant", "ml", "--", "true").out)
        url = s.url.replace("http", "ws") + protocol.WORKER_PATH
        async with websockets.connect(
            url, additional_headers={"Authorization": f"Bearer {token}"}
        ) as ws:
            hello = protocol.Hello(
                protocol=protocol.PROTOCOL_VERSION, berth_version="t", pool="gpu", instance="i1"
            )
            await ws.send(protocol.encode(hello).decode())
            assert isinstance(protocol.decode_to_worker(await ws.recv()), protocol.Welcome)
            reader = Reader(ws)
            reading = asyncio.create_task(reader.run())

            async def beat() -> None:  # as a worker does, more often than FAST's heartbeat
                seq = 0
                while True:
                    seq += 1
                    frame = protocol.Beat(seq=seq, host=protocol.Host())
                    await ws.send(protocol.encode(frame).decode())
                    await asyncio.sleep(0.25)

            beating = asyncio.create_task(beat())

            async def beats_acked(n: int) -> None:
                """`n` more beats acked from now."""
                start = max(reader.acks(), default=0)
                await reader.until(
                    lambda _: len(reader.acks() - set(range(start + 1))) >= n, "acks"
                )

            def lease_of(frames):
                for f in frames:
                    for lease in f.leases if isinstance(f, protocol.Leases) else (f,):
                        if isinstance(lease, protocol.Lease) and lease.job == job:
                            return lease
                return None

            lease = await reader.until(lease_of, "the job's lease")
            db = await asyncpg.connect(plain_url(sync_db_url))
            held = db.transaction()
            await held.start()
            # Every relayed call reads the job: with the table locked, each waits in flight.
            await db.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
            try:
                for n in range(1, 6):
                    ask = protocol.RelayRequest(
                        id=n, job=job, epoch=lease.epoch, method="GET", path=f"/api/v1/jobs/{job}"
                    )
                    await ws.send(protocol.encode(ask).decode())
                refused = await reader.until(
                    lambda _: len(reader.answers()) >= 3 and reader.answers(), "three refusals"
                )
                await beats_acked(3)
                assert sorted(refused) == [3, 4, 5]
                for n in (3, 4, 5):
                    assert refused[n].status == 429
                    assert b"executor.relay_max_in_flight = 2" in refused[n].body
                assert sorted(reader.answers()) == [3, 4, 5]  # the first two still wait
            finally:
                await held.rollback()
                await db.close()
            answered = await reader.until(
                lambda _: {1, 2} <= set(reader.answers()) and reader.answers(), "the two calls"
            )
            assert answered[1].status == answered[2].status == 200
            assert json.loads(answered[1].body)["id"] == job
            again = protocol.RelayRequest(
                id=6, job=job, epoch=lease.epoch, method="GET", path=f"/api/v1/jobs/{job}"
            )
            await ws.send(protocol.encode(again).decode())
            after = await reader.until(lambda _: reader.answers().get(6), "call 6")
            assert after.status == 200
            await beats_acked(1)
            beating.cancel()
            reading.cancel()
