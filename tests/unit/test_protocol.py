"""Worker websocket frames: each one round-trips, unknown, misdirected or out-of-bounds frames
are refused with a message naming the field."""

import json

import msgspec
import pytest

from service import protocol as p

TO_SERVER = [
    p.Hello(
        protocol=p.PROTOCOL_VERSION,
        berth_version="1.2.3",
        pool="gpu",
        instance="i-1",
        labels=("a100", "tpu", "zone=eu"),
        parallel=3,
        host=p.Host(cpus=8, load=0.5, free_memory_gb=12.5, free_disk_gb=99.0, gpus=("A100",)),
        python="3.11.9",
        env_digest="sha256:abc",
        cas="cas-1",
        held=((7, 2), (8, 1)),
    ),
    p.Hello(protocol=2, berth_version="0", pool="serve", instance="i-2"),
    p.Beat(seq=42, host=p.Host(cpus=2, load=1.25)),
    p.Started(seq=1, job=1, epoch=2),
    p.Output(seq=2, job=1, epoch=2, stream="stderr", data="line ✓\n".encode()),
    p.Output(seq=3, job=1, epoch=2, stream="stdout", data=b"\x00\xff binary \x80"),
    p.Finished(seq=4, job=1, epoch=2, state="succeeded", exit_code=0),
    p.Finished(seq=5, job=1, epoch=2, state="timed_out"),
    p.GaveBack(seq=6, job=1, epoch=2, reason="no ack"),
    p.Finished(
        seq=7,
        job=3,
        epoch=1,
        state="failed",
        exit_code=1,
        outputs=(p.Artifact(path="a/b.txt", sha256="0" * 64, size=5),),
    ),
    p.Metrics(seq=8, job=3, epoch=1, values={"loss": 0.5, "step": 10.0}),
    p.Saved(seq=9, job=3, epoch=1, sha256="f" * 64, size=12),
    p.RelayRequest(id=1, job=3, epoch=1, method="POST", path="/api/v1/jobs", body=b"{}"),
    p.CredentialStored(),
    p.Bye(released=((4, 2), (5, 1))),
    p.Bye(),
    p.ExecOutput(exec=1, stream="stdout", data=b"\x00\xff \x1b[1m"),
    p.ExecExit(exec=1, exit_code=130),
    p.ExecExit(exec=2, error="job 3 (attempt 1) is not running on this worker"),
    p.ExecTaken(exec=1),
]

TO_WORKER = [
    p.Welcome(
        name="w-1",
        heartbeat_seconds=0.5,
        unreachable_seconds=2.0,
        evict_seconds=4.0,
        kill_grace_seconds=0.25,
        drop=((3, 1),),
    ),
    p.Welcome(
        name="w-2",
        heartbeat_seconds=10,
        unreachable_seconds=30,
        evict_seconds=60,
        kill_grace_seconds=5,
    ),
    p.Refused(reason="unknown pool gpu2"),
    p.Ack(seq=42),
    p.Received(upto=17),
    p.Lease(
        job=5,
        epoch=1,
        kind="agent",
        tenant="ml",
        command=("bash", "-c", "echo hi"),
        env={"A": "1"},
        secrets={"TOKEN": "s3cret"},
        timeout_seconds=1.5,
    ),
    p.Lease(job=6, epoch=2, kind="default", tenant="default", python="print('hi')"),
    p.Leases(
        leases=(
            p.Lease(job=7, epoch=1, kind="default", tenant="a", command=("true",)),
            p.Lease(job=8, epoch=3, kind="eval", tenant="b", command=("false",)),
        )
    ),
    p.Lease(
        job=9,
        epoch=1,
        kind="default",
        tenant="ml",
        python_sha256="a" * 64,
        inputs=(p.Input(name="data", sha256="b" * 64, kind="dir"),),
        repo="https://example.com/r.git@main",
    ),
    p.Credential(token="brt_x"),
    p.RelayResponse(id=1, status=201, body=b'{"id": 4}'),
    p.Cancel(job=5, epoch=1),
    p.Stale(job=5, epoch=1),
    p.Exit(reason="token revoked", code=3),
    p.Exit(reason="bye"),
    p.ExecStart(exec=1, job=3, epoch=1, command=("cat", "mine.txt")),
    p.ExecStart(exec=2, job=3, epoch=1, command=(), tty=True, rows=33, cols=101),
    p.ExecInput(exec=1, data=b"\x03"),
    p.ExecInput(exec=1, eof=True, rows=40, cols=120, signal="INT"),
    p.ExecDelivered(exec=1),
]


def ids(frames: list[p.Frame]) -> list[str]:
    return [f"{type(f).__name__}-{i}" for i, f in enumerate(frames)]


class TestRoundTrip:
    @pytest.mark.parametrize("frame", TO_SERVER, ids=ids(TO_SERVER))
    def test_to_server(self, frame):
        """A worker->server frame decodes back to an equal frame of the same type."""
        back = p.decode_to_server(p.encode(frame))
        assert type(back) is type(frame)
        assert back == frame

    @pytest.mark.parametrize("frame", TO_WORKER, ids=ids(TO_WORKER))
    def test_to_worker(self, frame):
        """A server->worker frame decodes back to an equal frame of the same type."""
        back = p.decode_to_worker(p.encode(frame))
        assert type(back) is type(frame)
        assert back == frame

    def test_every_frame_type_covered(self):
        """The tables above hold every frame type of both directions."""
        assert {type(f) for f in TO_SERVER} == set(p.ToServer.__args__)
        assert {type(f) for f in TO_WORKER} == set(p.ToWorker.__args__)

    @pytest.mark.parametrize(
        ("frame", "tag"),
        [
            (p.Hello(protocol=2, berth_version="0", pool="x", instance="i"), "hello.v2"),
            (p.Beat(seq=1, host=p.Host()), "beat.v2"),
            (p.Received(upto=1), "received.v2"),
            (p.GaveBack(seq=1, job=1, epoch=1), "gave_back.v2"),
            (p.Exit(reason="r"), "exit.v2"),
        ],
    )
    def test_tag_on_the_wire(self, frame, tag):
        """Each frame carries its versioned tag in the `type` field."""
        assert json.loads(p.encode(frame))["type"] == tag

    def test_welcome_carries_the_save_bound_and_reads_one_without_it(self):
        """The welcome carries relay_max_save_gb; a welcome without it (an older server) reads
        as berth.toml's default, 10 GB."""
        frame = p.Welcome(
            name="w",
            heartbeat_seconds=1,
            unreachable_seconds=3,
            evict_seconds=6,
            kill_grace_seconds=0.5,
            relay_max_save_gb=0.25,
        )
        raw = json.loads(p.encode(frame))
        assert raw["relay_max_save_gb"] == 0.25
        del raw["relay_max_save_gb"]
        older = p.decode_to_worker(json.dumps(raw).encode())
        assert isinstance(older, p.Welcome) and older.relay_max_save_gb == 10.0

    def test_output_is_bytes_on_the_wire(self):
        """Output travels as base64: a NUL or an invalid UTF-8 byte arrives as it was."""
        raw = p.encode(p.Output(seq=1, job=1, epoch=1, stream="stdout", data=b"\x00\xff"))
        assert json.loads(raw)["data"] == "AP8="
        back = p.decode_to_server(raw)
        assert isinstance(back, p.Output)
        assert back.data == b"\x00\xff"


class TestRefused:
    @pytest.mark.parametrize(
        "raw",
        [
            b'{"type": "bogus.v2"}',
            b'{"type": "hello.v1", "protocol": 1}',
            b'{"job": 1, "epoch": 1}',
            b'{"type": "started.v2", "seq": 1, "job": "one", "epoch": 1}',
            b'{"type": "started.v2", "seq": 1, "job": 1}',
        ],
    )
    def test_unknown_or_malformed(self, raw):
        """An unknown tag, a missing tag, a wrong type or a missing field is a ValidationError."""
        with pytest.raises(msgspec.ValidationError):
            p.decode_to_server(raw)
        with pytest.raises(msgspec.ValidationError):
            p.decode_to_worker(raw)

    @pytest.mark.parametrize("frame", TO_WORKER, ids=ids(TO_WORKER))
    def test_worker_frame_not_a_server_frame(self, frame):
        """A server->worker frame is refused by the server's decoder, even with the same fields."""
        with pytest.raises(msgspec.ValidationError):
            p.decode_to_server(p.encode(frame))

    @pytest.mark.parametrize("frame", TO_SERVER, ids=ids(TO_SERVER))
    def test_server_frame_not_a_worker_frame(self, frame):
        """A worker->server frame is refused by the worker's decoder."""
        with pytest.raises(msgspec.ValidationError):
            p.decode_to_worker(p.encode(frame))


def frame(kind: str, **fields: object) -> bytes:
    return json.dumps({"type": kind, **fields}).encode()


class TestBounds:
    """A hostile worker's frames: every integer fits its column, text has no control characters,
    lists and blobs are capped; the error names the field."""

    @pytest.mark.parametrize(
        ("raw", "field"),
        [
            (frame("started.v2", seq=1, job=2**63, epoch=1), "$.job"),
            (frame("started.v2", seq=1, job=0, epoch=1), "$.job"),
            (frame("started.v2", seq=1, job=1, epoch=2**31), "$.epoch"),
            (frame("started.v2", seq=-1, job=1, epoch=1), "$.seq"),
            (
                frame("finished.v2", seq=1, job=1, epoch=1, state="succeeded", exit_code=2**40),
                "$.exit_code",
            ),
            (frame("finished.v2", seq=1, job=1, epoch=1, state="won"), "$.state"),
            (
                frame("finished.v2", seq=1, job=1, epoch=1, state="failed", error="x" * 5000),
                "$.error",
            ),
            (frame("output.v2", seq=1, job=1, epoch=1, stream="stdin", data=""), "$.stream"),
            (
                frame("output.v2", seq=1, job=1, epoch=1, stream="stdout", data="!!not-base64"),
                "$.data",
            ),
            (
                frame("hello.v2", protocol=2, berth_version="0", pool="a\x00b", instance="i"),
                "$.pool",
            ),
            (
                frame(
                    "hello.v2",
                    protocol=2,
                    berth_version="0",
                    pool="gpu",
                    instance="i",
                    labels=["a,b"],
                ),
                "$.labels[0]",
            ),
            (
                frame("hello.v2", protocol=2, berth_version="0", pool="gpu", instance="i\x00"),
                "$.instance",
            ),
            (
                frame(
                    "hello.v2",
                    protocol=2,
                    berth_version="0",
                    pool="gpu",
                    instance="i",
                    parallel=2**40,
                ),
                "$.parallel",
            ),
            (
                frame(
                    "hello.v2",
                    protocol=2,
                    berth_version="0",
                    pool="gpu",
                    instance="i",
                    held=[[1, 0]],
                ),
                "$.held[0][1]",
            ),
            (b'{"type": "beat.v2", "seq": 1, "host": {"load": 1e400}}', "$.host.load"),
            (frame("beat.v2", seq=1, host={"cpus": -1}), "$.host.cpus"),
            (frame("beat.v2", seq=1, host={"gpus": ["x"] * 300}), "$.host.gpus"),
            (frame("beat.v2", seq=1, host={"extra": 1}), "$.host"),
        ],
    )
    def test_out_of_bounds_is_refused_naming_the_field(self, raw, field):
        """The decoder refuses the frame, and its message names where."""
        with pytest.raises(msgspec.ValidationError) as err:
            p.decode_to_server(raw)
        assert field in str(err.value)

    def test_output_size_is_capped(self):
        """One output frame holds at most MAX_OUTPUT bytes."""
        big = p.encode(
            p.Output(seq=1, job=1, epoch=1, stream="stdout", data=b"x" * (p.MAX_OUTPUT + 1))
        )
        with pytest.raises(msgspec.ValidationError, match=r"\$\.data"):
            p.decode_to_server(big)


class TestExecBounds:
    def test_an_exec_output_frame_is_bounded(self):
        """A worker's exec output over EXEC_CHUNK, or for exec id 0, does not decode."""
        too_big = p.ExecOutput(exec=1, stream="stdout", data=b"x" * (p.EXEC_CHUNK + 1))
        assert "data" in (p.refusal(too_big) or "")
        assert "exec" in (p.refusal(p.ExecTaken(exec=0)) or "")
