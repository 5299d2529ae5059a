"""Frames on the worker websocket. One version for the whole protocol; a mismatch is refused.

Shared by the server and the worker, so this module imports only msgspec. Every report about a
job names (job, epoch): the server accepts it only while that lease is the live one.

Worker -> server: hello, beat, started, output, finished, bye.
Server -> worker: welcome, refused, ack, lease(s), cancel, stale, result_ack, exit.
"""

import msgspec

PROTOCOL_VERSION = 1
WORKER_PATH = "/api/v1/workers/attach"


class Frame(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    pass


class Host(msgspec.Struct, frozen=True, kw_only=True):
    cpus: int = 0
    load: float = 0.0
    free_memory_gb: float = 0.0
    free_disk_gb: float = 0.0
    gpus: tuple[str, ...] = ()


class Finished(Frame, tag="finished.v1", frozen=True):
    job: int
    epoch: int
    state: str  # succeeded | failed | timed_out | cancelled
    exit_code: int | None = None
    error: str = ""


class Hello(Frame, tag="hello.v1", frozen=True):
    protocol: int
    berth_version: str
    pool: str
    instance: str  # new for every worker process: tells a restart from a reconnect
    labels: tuple[str, ...] = ()
    parallel: int = 0
    host: Host = msgspec.field(default_factory=Host)
    python: str = ""
    env_digest: str = ""
    cas: str = ""
    held: tuple[tuple[int, int], ...] = ()  # (job, epoch) still running after a reconnect
    results: tuple[Finished, ...] = ()  # results sent but never acknowledged


class Beat(Frame, tag="beat.v1", frozen=True):
    seq: int
    host: Host


class Started(Frame, tag="started.v1", frozen=True):
    job: int
    epoch: int


class Output(Frame, tag="output.v1", frozen=True):
    job: int
    epoch: int
    stream: str  # stdout | stderr
    data: str


class Bye(Frame, tag="bye.v1", frozen=True):
    """The worker is stopping: it killed these copies, so their leases are free at once."""

    released: tuple[tuple[int, int], ...] = ()


class Welcome(Frame, tag="welcome.v1", frozen=True):
    name: str
    heartbeat_seconds: float
    unreachable_seconds: float
    evict_seconds: float
    kill_grace_seconds: float
    drop: tuple[tuple[int, int], ...] = ()  # held leases that are no longer live: kill them


class Refused(Frame, tag="refused.v1", frozen=True):
    reason: str  # shown to the operator by the worker before it exits non-zero


class Ack(Frame, tag="ack.v1", frozen=True):
    seq: int


class Lease(Frame, tag="lease.v1", frozen=True):
    job: int
    epoch: int
    kind: str
    command: tuple[str, ...] = ()
    python: str = ""  # Python source, run with the worker's --python
    env: dict[str, str] = msgspec.field(default_factory=dict)
    secrets: dict[str, str] = msgspec.field(default_factory=dict)  # variable -> value
    timeout_seconds: float = 0.0  # 0: none


class Leases(Frame, tag="leases.v1", frozen=True):
    """Several leases at once (one dispatch pass gave this worker more than one slot)."""

    leases: tuple[Lease, ...]


class Cancel(Frame, tag="cancel.v1", frozen=True):
    job: int
    epoch: int


class Stale(Frame, tag="stale.v1", frozen=True):
    """A report under this (job, epoch) was refused: the lease moved on, kill the copy."""

    job: int
    epoch: int


class ResultAck(Frame, tag="result_ack.v1", frozen=True):
    job: int
    epoch: int


class Exit(Frame, tag="exit.v1", frozen=True):
    reason: str
    code: int = 0


ToServer = Hello | Beat | Started | Output | Finished | Bye
ToWorker = Welcome | Refused | Ack | Lease | Leases | Cancel | Stale | ResultAck | Exit

encode = msgspec.json.Encoder().encode
decode_to_server = msgspec.json.Decoder(ToServer).decode
decode_to_worker = msgspec.json.Decoder(ToWorker).decode
