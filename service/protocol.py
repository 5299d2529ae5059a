"""Frames on the worker websocket. One version for the whole protocol; a mismatch is refused.

Shared by the server and the worker, so this module imports only msgspec. Every report about a
job names (job, epoch): the server accepts it only while that lease is the live one.

Every frame is bounded: integers fit the Postgres columns they land in, names and labels hold no
control characters, lists and texts have a length cap. A frame outside its bounds does not
decode, and the decoder's message names the field (`... at $.epoch`), which is what a refused
worker is told.

Reports (started, output, finished, gave_back) carry a sequence number, increasing over the life
of a worker process. The server answers `received(upto=N)` once every report up to N is applied
(or refused as stale), and the worker keeps and resends what is not yet received, so no report
is lost to a dropped connection or a server restart. Applying a report twice is harmless:
output is keyed by (job, epoch, seq), the rest is idempotent.

Worker -> server: hello, beat, started, output, finished, gave_back, credential_stored, bye.
Server -> worker: welcome, refused, ack, received, lease(s), cancel, stale, credential, exit.

Exec sessions (`berth job exec`, docs/api.md): the server asks with exec_start, then sends
exec_input (stdin, end of input, resize, a signal); the worker answers exec_output and, once,
exec_exit. Neither is a report: an exec belongs to the connection it came over and ends with
it. Each side lets at most EXEC_WINDOW frames of one exec travel unacknowledged (exec_taken for
input, exec_delivered for output), so a fast command or a fast typist never fills the worker's
socket queue.
"""

from typing import Annotated, Literal

import msgspec

from service.core.bounds import RELAY_MAX_SAVE_GB

PROTOCOL_VERSION = 2
WORKER_PATH = "/api/v1/workers/attach"

# Bounds: what Postgres columns hold (bigint ids, int epochs and exit codes), and sizes that no
# honest worker comes near.
JobId = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]
Epoch = Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
Seq = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
ExitCode = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
Name = Annotated[
    str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
Label = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=r"^[^,\x00-\x1f\x7f]+$")]
Word = Annotated[str, msgspec.Meta(max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$")]
Text = Annotated[str, msgspec.Meta(max_length=4000)]  # free text; NULs are replaced server-side
Amount = Annotated[float, msgspec.Meta(ge=0, le=1e12)]  # finite: NaN and inf fail the bounds
Key = tuple[JobId, Epoch]
MAX_OUTPUT = 1 << 20  # bytes in one output frame; the worker reads far less at a time
MAX_LEASES = 10_000
MAX_OUTPUTS = 10_000  # files one result lists


class Frame(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    pass


class Gpu(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One GPU as NVML sees it (worker/gpus.py): its index is what CUDA_VISIBLE_DEVICES names."""

    index: Annotated[int, msgspec.Meta(ge=0, le=4095)]
    name: Word = ""
    memory_mb: Annotated[int, msgspec.Meta(ge=0, le=2**40)] = 0
    utilization: Annotated[int, msgspec.Meta(ge=0, le=100)] = 0  # percent busy, last sample


class Host(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    cpus: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0
    load: Amount = 0.0
    free_memory_gb: Amount = 0.0
    free_disk_gb: Amount = 0.0
    gpus: Annotated[tuple[Word, ...], msgspec.Meta(max_length=256)] = ()  # names
    devices: Annotated[tuple[Gpu, ...], msgspec.Meta(max_length=256)] = ()  # NVML, when present


class Capacity(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a worker offers jobs (berth worker --cpus --memory --gpus; default: the host's)."""

    cpus: Annotated[float, msgspec.Meta(ge=0, le=1_000_000)] = 0.0
    memory_mb: Annotated[int, msgspec.Meta(ge=0, le=2**40)] = 0
    gpus: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 0


# -- worker -> server ------------------------------------------------------------------------


class Hello(Frame, tag="hello.v2", frozen=True, forbid_unknown_fields=True):
    protocol: int
    berth_version: Word
    # None: the credential decides (a joined worker's pool is bound by its join token)
    pool: Name | None
    instance: Word  # new for every worker process: tells a restart from a reconnect
    labels: Annotated[tuple[Label, ...], msgspec.Meta(max_length=256)] = ()
    parallel: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 0
    host: Host = msgspec.field(default_factory=Host)
    # Absent (an older worker): it offers nothing, so it takes only jobs that ask for nothing.
    capacity: Capacity = msgspec.field(default_factory=Capacity)
    python: Word = ""
    env_digest: Word = ""
    cas: Word = ""
    # (job, epoch) it still holds after a reconnect: running, or finished with the result not
    # yet received by a server.
    held: Annotated[tuple[Key, ...], msgspec.Meta(max_length=MAX_LEASES)] = ()


class Beat(Frame, tag="beat.v2", frozen=True, forbid_unknown_fields=True):
    seq: Seq
    host: Host


class Started(Frame, tag="started.v2", frozen=True, forbid_unknown_fields=True):
    seq: Seq
    job: JobId
    epoch: Epoch


class Output(Frame, tag="output.v2", frozen=True, forbid_unknown_fields=True):
    """Bytes as the job wrote them (base64 in JSON): nothing is decoded or lost on the way."""

    seq: Seq
    job: JobId
    epoch: Epoch
    stream: Literal["stdout", "stderr"]
    data: Annotated[bytes, msgspec.Meta(max_length=MAX_OUTPUT)]


Sha256 = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]
Path = Annotated[str, msgspec.Meta(min_length=1, max_length=1024, pattern=r"^[^\x00]+$")]


class Artifact(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A file a job left (under $BERTH_OUTPUT, or its repository's bundle and patch)."""

    path: Path  # relative to $BERTH_OUTPUT
    sha256: Sha256
    size: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class Finished(Frame, tag="finished.v2", frozen=True, forbid_unknown_fields=True):
    seq: Seq
    job: JobId
    epoch: Epoch
    state: Literal["succeeded", "failed", "timed_out", "cancelled"]
    exit_code: ExitCode | None = None
    error: Text = ""
    # Uploaded to the store before this report: the job's outputs, kept for `job fetch`.
    outputs: Annotated[tuple[Artifact, ...], msgspec.Meta(max_length=MAX_OUTPUTS)] = ()


class Metrics(Frame, tag="metrics.v2", frozen=True, forbid_unknown_fields=True):
    """Numbers a job emitted (`emit(loss=0.5)`): kept per job, shown by `job show`."""

    seq: Seq
    job: JobId
    epoch: Epoch
    values: Annotated[dict[Word, float], msgspec.Meta(max_length=256)]


class GaveBack(Frame, tag="gave_back.v2", frozen=True, forbid_unknown_fields=True):
    """The worker stopped this copy itself (no ack for too long): re-queue the job now."""

    seq: Seq
    job: JobId
    epoch: Epoch
    reason: Word = ""


class CredentialStored(Frame, tag="credential_stored.v2", frozen=True, forbid_unknown_fields=True):
    """The credential last sent is safely stored: the server may retire the one before it."""


class Bye(Frame, tag="bye.v2", frozen=True, forbid_unknown_fields=True):
    """The worker is stopping: it killed these copies, so their leases are free at once."""

    released: Annotated[tuple[Key, ...], msgspec.Meta(max_length=MAX_LEASES)] = ()


class Saved(Frame, tag="saved.v2", frozen=True, forbid_unknown_fields=True):
    """A job saved an artifact (`save_artifact`), which the worker stored.

    Referenced for the job's tenant, only while that lease is live.
    """

    seq: Seq
    job: JobId
    epoch: Epoch
    sha256: Sha256
    size: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class RelayRequest(Frame, tag="relay.v2", frozen=True, forbid_unknown_fields=True):
    """A job's own `berth` call, relayed by its worker while its lease is live."""

    id: Seq
    job: JobId
    epoch: Epoch
    method: Literal["GET", "POST", "PUT", "DELETE", "HEAD"]
    path: Annotated[str, msgspec.Meta(max_length=2048, pattern=r"^/api/v1/[^\x00]*$")]
    body: Annotated[bytes, msgspec.Meta(max_length=MAX_OUTPUT)] = b""


ExecId = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]
EXEC_CHUNK = 32768  # bytes of one exec_output or exec_input frame at most
EXEC_WINDOW = 4  # frames of one exec in flight, each way, before the sender waits for an ack
Signal = Literal["INT", "TERM", "HUP", "QUIT", "KILL"]


class ExecOutput(Frame, tag="exec_output.v2", frozen=True, forbid_unknown_fields=True):
    """What the exec'd command wrote, secrets masked as in the job's own output."""

    exec: ExecId
    stream: Literal["stdout", "stderr"]
    data: Annotated[bytes, msgspec.Meta(max_length=EXEC_CHUNK)]


class ExecExit(Frame, tag="exec_exit.v2", frozen=True, forbid_unknown_fields=True):
    """The exec ended: its exit code (128 + N for signal N), or why it could not run."""

    exec: ExecId
    exit_code: ExitCode | None = None
    error: Text = ""


class ExecTaken(Frame, tag="exec_taken.v2", frozen=True, forbid_unknown_fields=True):
    """One exec_input was applied (written to the command, or acted on): send more."""

    exec: ExecId


Report = Started | Output | Finished | GaveBack | Metrics | Saved


# -- server -> worker ------------------------------------------------------------------------


class CasAccess(msgspec.Struct, frozen=True, kw_only=True):
    """How this worker reaches the installation's artifact store (the server's `[cas]`).

    A worker with a `[cas]` of its own keeps it, but its store's id must be `id` (else it is
    refused at hello). `http`: `url` is the store's base (`berth cas serve`, or this server's
    `/api/v1/workers/cas`), with `token` as the bearer ("" means the worker's own credential).
    `s3`: the bucket, credentials as the AWS SDKs find them on the worker.
    """

    id: str
    provider: Literal["http", "s3"]
    url: str = ""
    token: str = ""
    bucket: str = ""
    prefix: str = ""
    endpoint_url: str = ""
    region: str = ""


class Welcome(Frame, tag="welcome.v2", frozen=True):
    name: str
    heartbeat_seconds: float
    unreachable_seconds: float
    evict_seconds: float
    kill_grace_seconds: float
    drop: tuple[tuple[int, int], ...] = ()  # held leases that are no longer live: kill them
    pool: str = ""  # as the server placed it (a joined worker learns its pool here)
    labels: tuple[str, ...] = ()
    cas: CasAccess | None = None  # None: this server offers no artifact store
    # What one job may save through its relay ([executor] relay_max_save_gb); the default is
    # berth.toml's, for a server that does not say.
    relay_max_save_gb: Amount = RELAY_MAX_SAVE_GB


class Credential(Frame, tag="credential.v2", frozen=True):
    """This worker's credential from now on: store it (0600) and answer credential_stored.

    Sent after a join (the join token is spent) and on each rotation; until the worker confirms,
    the previous credential stays valid too.
    """

    token: str


class Refused(Frame, tag="refused.v2", frozen=True):
    reason: str  # shown to the operator by the worker before it exits non-zero


class Ack(Frame, tag="ack.v2", frozen=True):
    """The beat `seq` is in the database: what the worker's self-fencing counts on."""

    seq: int


class Received(Frame, tag="received.v2", frozen=True):
    """Every report up to `upto` is applied (or refused as stale): stop resending them."""

    upto: int


class Input(msgspec.Struct, frozen=True, kw_only=True):
    """A file or directory (one deterministic tar) fetched into the job's folder as `name`."""

    name: str
    sha256: str
    kind: Literal["file", "dir"] = "file"


class Lease(Frame, tag="lease.v2", frozen=True):
    job: int
    epoch: int
    kind: str
    tenant: str
    command: tuple[str, ...] = ()
    python: str = ""  # Python source, run with the worker's --python
    python_sha256: str = ""  # ... or the source's hash in the store (fetched as main.py)
    inputs: tuple[Input, ...] = ()
    repo: str = ""  # URL[@REV]: cloned into the job's folder as `repo`
    env: dict[str, str] = msgspec.field(default_factory=dict)
    secrets: dict[str, str] = msgspec.field(default_factory=dict)  # variable -> value
    timeout_seconds: float = 0.0  # 0: none
    # What it asked for (SPEC section 4, "Resources"); the worker enforces them. 0: nothing.
    cpus: float = 0.0
    memory_mb: int = 0
    gpus: int = 0


class Leases(Frame, tag="leases.v2", frozen=True):
    """Several leases at once (one dispatch pass gave this worker more than one slot)."""

    leases: tuple[Lease, ...]


class Cancel(Frame, tag="cancel.v2", frozen=True):
    job: int
    epoch: int


class RelayResponse(Frame, tag="relay_response.v2", frozen=True):
    id: int
    status: int
    body: bytes = b""


class ExecStart(Frame, tag="exec_start.v2", frozen=True):
    """Run `command` beside the job of lease (job, epoch): its cwd, uid, environment, /tmp."""

    exec: int
    job: int
    epoch: int
    command: tuple[str, ...]
    tty: bool = False
    rows: int = 0
    cols: int = 0


class ExecInput(Frame, tag="exec_input.v2", frozen=True):
    """For the exec'd command: stdin bytes, end of stdin, a new terminal size, or a signal."""

    exec: int
    data: bytes = b""
    eof: bool = False
    rows: int = 0  # with cols: the terminal's new size (--tty)
    cols: int = 0
    signal: str = ""  # INT, TERM, HUP, QUIT or KILL: to the command's process group


class ExecDelivered(Frame, tag="exec_delivered.v2", frozen=True):
    """One exec_output reached the client: send more."""

    exec: int


class Stale(Frame, tag="stale.v2", frozen=True):
    """A report under this (job, epoch) was refused: the lease moved on, kill the copy."""

    job: int
    epoch: int


class Exit(Frame, tag="exit.v2", frozen=True):
    reason: str
    code: int = 0


ToServer = (
    Hello
    | Beat
    | Started
    | Output
    | Finished
    | GaveBack
    | Metrics
    | Saved
    | RelayRequest
    | CredentialStored
    | Bye
    | ExecOutput
    | ExecExit
    | ExecTaken
)
ToWorker = (
    Welcome
    | Refused
    | Ack
    | Received
    | Lease
    | Leases
    | Cancel
    | Stale
    | Credential
    | RelayResponse
    | Exit
    | ExecStart
    | ExecInput
    | ExecDelivered
)

encode = msgspec.json.Encoder().encode
decode_to_server = msgspec.json.Decoder(ToServer).decode
decode_to_worker = msgspec.json.Decoder(ToWorker).decode


def refusal(frame: ToServer) -> str | None:
    """Why the server would refuse `frame` (its decoder's reason), or None when it is fine.

    A worker checks what a job put into a frame before sending it: the server refuses a worker
    whose frame does not decode, so a job's bad value must stop at its worker.
    """
    try:
        decode_to_server(encode(frame))
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return str(exc)
    return None
