"""The worker channel under faults: a frozen server, a worker that stops reading, reports resent.

Real `berth serve` and `berth worker` processes, and protocol-level workers written here with
the websockets client where a test needs a worker to misbehave.
"""

import asyncio
import signal
import time
import uuid

import psutil
import websockets

from service import protocol
from tests import marks
from tests.procs import wait_for

HEARTBEAT = 0.5
FROZEN = {
    "executor": {
        "heartbeat_seconds": HEARTBEAT,
        "unreachable_seconds": 3.0,
        "evict_seconds": 6.0,
        "kill_grace_seconds": 0.5,
    },
    "pools": {"gpu": {"slots": {"default": 1}}},
}
WINDOW = 3.0 + 6.0  # unreachable + evict: a silent worker's leases expire after this


def job_state(s, j: int) -> dict:
    return s.api("GET", f"/api/v1/jobs/{j}").json()


def attached(s, name: str) -> bool:
    return any(w["name"] == name and w["attached"] for w in s.api("GET", "/api/v1/workers").json())


def copies_alive(job: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("BERTH_JOB_ID") == str(job) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


class TestFrozenServer:
    def test_self_stopped_copy_is_given_back_and_runs_again(
        self, server_factory, worker_factory, shared_dir
    ):
        """The only server freezes past the silence window; its worker stops the job itself.
        Resumed, the server hears the copy was given back and the job runs again at once."""
        s = server_factory(FROZEN, builtin_worker=False)
        worker_factory(s, s.worker_token("w1"), "gpu", name="w1")
        wait_for(lambda: attached(s, "w1"), 20, "w1 attached")
        long, short = marks.script(shared_dir, 120)[2], marks.script(shared_dir, 0.5)[2]
        command = f'if [ "$BERTH_ATTEMPT" = 1 ]; then {long}; else {short}; fi'
        r = s.api("POST", "/api/v1/jobs", json={"command": ["sh", "-c", command], "pool": "gpu"})
        j = r.json()["id"]
        wait_for(lambda: copies_alive(j), 20, "the first copy to run")
        assert s.proc is not None
        s.proc.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            # The worker hears no ack and stops its copy two heartbeats before the window ends.
            wait_for(lambda: not copies_alive(j), WINDOW + 5, "the worker to stop its copy")
            stopped_after = time.monotonic() - frozen_at
            wait_for(lambda: time.monotonic() - frozen_at > WINDOW + 1, WINDOW + 2, "the window")
        finally:
            s.proc.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        worker_factory(s, s.worker_token("w2"), "gpu", name="w2")
        done = wait_for(
            lambda: (x := job_state(s, j))["state"] == "succeeded" and x, 30, "the job to succeed"
        )
        took = time.monotonic() - resumed
        assert stopped_after < WINDOW  # before the lease could expire
        assert took < 10 * HEARTBEAT, f"took {took:.1f}s after the resume"  # window is 18 beats
        assert done["attempt"] == 2
        runs = marks.copies(shared_dir)[j]
        assert len(runs) == 2 and not runs[0].ended and runs[1].ended
        assert marks.overlaps(shared_dir) == []


class SimWorker:
    """A protocol-level worker that reads everything, beats, and finishes each lease at once."""

    def __init__(self, url: str, token: str, pool: str) -> None:
        self.url, self.token, self.pool = url, token, pool
        self.acks: set[int] = set()
        self.finished: set[int] = set()
        self.received_upto = 0
        self._seq = 0
        self._results: dict[int, int] = {}  # report seq -> job

    async def run(self, beats: int, stop: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with websockets.connect(self.url, additional_headers=headers) as ws:
            hello = protocol.Hello(
                protocol=protocol.PROTOCOL_VERSION,
                berth_version="t",
                pool=self.pool,
                instance=uuid.uuid4().hex,
            )
            await ws.send(protocol.encode(hello).decode())
            assert isinstance(protocol.decode_to_worker(await ws.recv()), protocol.Welcome)
            reader = asyncio.create_task(self._read(ws))
            for seq in range(1, beats + 1):
                await ws.send(
                    protocol.encode(protocol.Beat(seq=seq, host=protocol.Host())).decode()
                )
                await asyncio.sleep(HEARTBEAT)
            await stop.wait()
            reader.cancel()

    async def _read(self, ws) -> None:
        async for raw in ws:
            frame = protocol.decode_to_worker(raw)
            match frame:
                case protocol.Ack():
                    self.acks.add(frame.seq)
                case protocol.Lease() | protocol.Leases():
                    for lease in frame.leases if isinstance(frame, protocol.Leases) else (frame,):
                        self._seq += 1
                        done = protocol.Finished(
                            seq=self._seq, job=lease.job, epoch=lease.epoch, state="succeeded"
                        )
                        self._results[self._seq] = lease.job
                        await ws.send(protocol.encode(done).decode())
                case protocol.Received():
                    self.received_upto = frame.upto
                    self.finished |= {j for s, j in self._results.items() if s <= frame.upto}


class TestSlowSocket:
    async def test_a_worker_that_stops_reading_delays_no_one(self, server_factory):
        """One worker stops reading while megabytes of leases queue for it; the others' beats are
        all acknowledged and their jobs all finish."""
        pools = {"pools": {"gpu": {"slots": {"default": 4}}, "slow": {"slots": {"default": 32}}}}
        s = server_factory(pools, builtin_worker=False)
        url = s.url.replace("http", "ws") + protocol.WORKER_PATH
        slow_token = await asyncio.to_thread(s.worker_token, "slow")
        good = [
            SimWorker(url, await asyncio.to_thread(s.worker_token, f"good{i}"), "gpu")
            for i in range(2)
        ]
        # max_queue=1: the client library stops reading from the socket after one frame that
        # nobody consumes, so the server's writes to it block once the TCP buffers are full.
        async with websockets.connect(
            url,
            additional_headers={"Authorization": f"Bearer {slow_token}"},
            max_queue=1,
            max_size=64 << 20,  # as `berth worker` sets it
        ) as slow:
            hello = protocol.Hello(
                protocol=protocol.PROTOCOL_VERSION,
                berth_version="t",
                pool="slow",
                instance=uuid.uuid4().hex,
            )
            await slow.send(protocol.encode(hello).decode())
            assert isinstance(protocol.decode_to_worker(await slow.recv()), protocol.Welcome)

            async def beat_but_never_read() -> None:  # writing works; it stays "reachable"
                for seq in range(1, 10_000):
                    beat = protocol.Beat(seq=seq, host=protocol.Host())
                    await slow.send(protocol.encode(beat).decode())
                    await asyncio.sleep(HEARTBEAT)

            slow_beats = asyncio.create_task(beat_but_never_read())
            big = {f"V{i}": "x" * 120_000 for i in range(8)}  # ~960 KB per lease
            for _ in range(16):
                r = await asyncio.to_thread(
                    s.api,
                    "POST",
                    "/api/v1/jobs",
                    json=[{"command": ["true"], "pool": "slow", "env": big} for _ in range(2)],
                )
                assert r.status_code == 201, r.text
            await asyncio.to_thread(
                wait_for,
                lambda: (
                    sum(
                        j["state"] == "leased"
                        for j in s.api("GET", "/api/v1/jobs", params={"limit": 100}).json()
                    )
                    == 32
                ),
                20,
                "32 leases (~30 MB) sent to the slow worker",
            )
            stop = asyncio.Event()
            beats = 10
            runners = [asyncio.create_task(w.run(beats, stop)) for w in good]
            r = await asyncio.to_thread(
                s.api,
                "POST",
                "/api/v1/jobs",
                json=[{"command": ["true"], "pool": "gpu"} for _ in range(12)],
            )
            gpu_jobs = set(r.json()["ids"])
            deadline = time.monotonic() + beats * HEARTBEAT + 15
            while time.monotonic() < deadline:
                if all(len(w.acks) == beats for w in good) and gpu_jobs <= set().union(
                    *(w.finished for w in good)
                ):
                    break
                await asyncio.sleep(0.1)
            stop.set()
            await asyncio.gather(*runners)
            slow_beats.cancel()
            for w in good:
                assert w.acks == set(range(1, beats + 1)), f"acks {sorted(w.acks)}"
            assert gpu_jobs <= set().union(*(w.finished for w in good))
            states = await asyncio.to_thread(
                lambda: {
                    j["id"]: j["state"]
                    for j in s.api("GET", "/api/v1/jobs", params={"limit": 100}).json()
                }
            )
            assert all(states[j] == "succeeded" for j in gpu_jobs)


class TestReportsAreResent:
    def test_output_survives_a_server_kill_whole_and_once(self, server_factory, worker_factory):
        """kill -9 of the server while a job prints: after the restart its output is whole, in
        order, and no line is kept twice (reports are resent until received, and kept once)."""
        s = server_factory({"pools": {"gpu": {"slots": {"default": 1}}}}, builtin_worker=False)
        worker_factory(s, s.worker_token("w1"), "gpu", name="w1")
        wait_for(lambda: attached(s, "w1"), 20, "w1 attached")
        script = "for i in $(seq 1 150); do echo line-$i; sleep 0.02; done"
        r = s.api("POST", "/api/v1/jobs", json={"command": ["sh", "-c", script], "pool": "gpu"})
        j = r.json()["id"]

        def lines() -> list[str]:
            got = s.api("GET", f"/api/v1/jobs/{j}/logs").json()["chunks"]
            return "".join(c["data"] for c in got).splitlines()

        wait_for(lambda: len(lines()) >= 20, 20, "some output")
        s.kill(signal.SIGKILL)
        s.start()
        shown = wait_for(
            lambda: (x := job_state(s, j))["state"] == "succeeded" and x, 60, "the job to end"
        )
        assert shown["attempt"] == 1  # the worker kept its lease across the restart
        assert lines() == [f"line-{i}" for i in range(1, 151)]
