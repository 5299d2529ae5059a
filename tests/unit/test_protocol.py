"""Worker websocket frames: each one round-trips, unknown or misdirected frames are refused."""

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
        labels=("a100", "tpu"),
        parallel=3,
        host=p.Host(cpus=8, load=0.5, free_memory_gb=12.5, free_disk_gb=99.0, gpus=("A100",)),
        python="3.11.9",
        env_digest="sha256:abc",
        cas="cas-1",
        held=((7, 2), (8, 1)),
        results=(p.Finished(job=9, epoch=1, state="failed", exit_code=3, error="boom"),),
    ),
    p.Hello(protocol=1, berth_version="0", pool="serve", instance="i-2"),
    p.Beat(seq=42, host=p.Host(cpus=2, load=1.25)),
    p.Started(job=1, epoch=2),
    p.Output(job=1, epoch=2, stream="stderr", data="line ✓\n"),
    p.Finished(job=1, epoch=2, state="succeeded", exit_code=0),
    p.Finished(job=1, epoch=2, state="timed_out"),
    p.Bye(released=((4, 2), (5, 1))),
    p.Bye(),
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
        unreachable_seconds=40,
        evict_seconds=300,
        kill_grace_seconds=5,
    ),
    p.Refused(reason="unknown pool gpu2"),
    p.Ack(seq=42),
    p.Lease(
        job=5,
        epoch=1,
        kind="agent",
        command=("bash", "-c", "echo hi"),
        env={"A": "1"},
        secrets={"TOKEN": "s3cret"},
        timeout_seconds=1.5,
    ),
    p.Lease(job=6, epoch=2, kind="default", python="print('hi')"),
    p.Leases(
        leases=(
            p.Lease(job=7, epoch=1, kind="default", command=("true",)),
            p.Lease(job=8, epoch=3, kind="eval", command=("false",)),
        )
    ),
    p.Cancel(job=5, epoch=1),
    p.Stale(job=5, epoch=1),
    p.ResultAck(job=5, epoch=1),
    p.Exit(reason="token revoked", code=3),
    p.Exit(reason="bye"),
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
            (p.Hello(protocol=1, berth_version="0", pool="x", instance="i"), "hello.v1"),
            (p.Beat(seq=1, host=p.Host()), "beat.v1"),
            (p.ResultAck(job=1, epoch=1), "result_ack.v1"),
            (p.Exit(reason="r"), "exit.v1"),
        ],
    )
    def test_tag_on_the_wire(self, frame, tag):
        """Each frame carries its versioned tag in the `type` field."""
        assert json.loads(p.encode(frame))["type"] == tag


class TestRefused:
    @pytest.mark.parametrize(
        "raw",
        [
            b'{"type": "bogus.v1"}',
            b'{"type": "hello.v2", "protocol": 2}',
            b'{"job": 1, "epoch": 1}',
            b'{"type": "started.v1", "job": "one", "epoch": 1}',
            b'{"type": "started.v1", "job": 1}',
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

    def test_same_shape_different_tag(self):
        """Started and Cancel share fields, yet each decodes only on its own side."""
        started, cancel = p.encode(p.Started(job=1, epoch=1)), p.encode(p.Cancel(job=1, epoch=1))
        assert isinstance(p.decode_to_server(started), p.Started)
        assert isinstance(p.decode_to_worker(cancel), p.Cancel)
        with pytest.raises(msgspec.ValidationError):
            p.decode_to_server(cancel)
        with pytest.raises(msgspec.ValidationError):
            p.decode_to_worker(started)
