"""The process runner: one job in its own process group, working directory and user.

The job's working directory is made 0700 for the job's user, with `tmp/` and `output/` in it;
its environment is built (worker/environment.py), never inherited. stdout/stderr are bytes,
streamed to `emit` as they come, secrets masked. Cancel and timeout kill the whole group (TERM,
then KILL after the grace period) and touch no other job; a job with a uid of its own has every
process of that uid killed when it ends (worker/jobusers.py). Its CPU and memory limits are a
cgroup it joins before it starts, or rlimits (worker/confine.py); its GPUs, CUDA_VISIBLE_DEVICES.
As root it starts in namespaces of its own, with private /tmp, /var/tmp, /dev/shm and IPC
(worker/isolation.py). The group leader is SHIM, a few lines of POSIX sh that kill the whole
group when this worker process dies, even by kill -9.
"""

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from service import protocol
from service.cas.base import CasError, Store, get_file
from service.worker import artifacts, confine, environment, jobusers, repos
from service.worker.confine import JobCgroup, JobRlimits
from service.worker.isolation import Namespaces, Step
from service.worker.jobusers import JobUser
from service.worker.redaction import Redactor
from service.worker.relay import Relay

Emit = Callable[[str, bytes], Awaitable[None]]  # (stream, data); may wait (backpressure)
READ_SIZE = 65536

# The job's group leader. Its stdin is the read end of a pipe whose write end only the worker
# holds: when the worker dies for any reason the kernel closes it, `read` sees EOF, and the
# watcher kills the whole group. The pipe moves to fd 3 (sh takes one-digit fds only) and the
# job gets /dev/null. TERM is ignored by the shell (set after the job started, since exec keeps
# ignored signals) so it stays to report the job's exit; the job itself takes TERM.
# sh, not Python: it starts in about a millisecond, and it starts for every job.
SHIM = """
exec 3<&0 0</dev/null
"$@" 3<&- &
job=$!
trap '' TERM
( read -r _ <&3; kill -KILL 0 ) &
watcher=$!
exec 3<&-
wait "$job"
code=$?
kill -KILL "$watcher" 2>/dev/null
exit "$code"
"""


class FetchError(Exception):
    """The job's inputs cannot be had (no store)."""


@dataclass
class Outcome:
    state: str  # succeeded | failed | timed_out | cancelled
    exit_code: int | None
    error: str = ""
    outputs: list[protocol.Artifact] = field(default_factory=list)


@dataclass
class Run:
    lease: protocol.Lease
    workdir: Path
    python: str
    grace: float
    emit: Emit
    store: Store | None = None  # the installation's artifact store (inputs, outputs)
    runtime: Path | None = None  # the in-job runtime (PYTHONPATH) and its `berth` (PATH)
    relay: Relay | None = None  # the job's way to its worker (workers/relay.py)
    repo_cache: Path | None = None  # the worker's mirrors for --repo (worker/repos.py)
    allow_local_repos: bool = False
    _repo_base: str = ""  # the commit the job's clone started at
    user: JobUser | None = None  # set once a uid is free for it (worker/jobusers.py)
    worker_env: Mapping[str, str] = field(default_factory=dict)
    pass_env: Sequence[str] = ()
    namespaces: Namespaces | None = None  # as root: the job's private /tmp & co (isolation.py)
    # Called once the job's process ended, before anything of its uid is killed: its execs end
    # here (worker/execs.py), each told why.
    ending: Callable[[], Awaitable[None]] | None = None
    _enter: Step | None = None  # the child's step into them, made by prepare()
    # Its CPU and memory limits (worker/confine.py); None: it asked for neither.
    limits: JobCgroup | JobRlimits | None = None
    gpu_env: Mapping[str, str] = field(default_factory=dict)  # the GPUs it holds (gpus.py)
    refusal: str = ""  # why it cannot start at all (e.g. no free GPU): it fails saying so
    _proc: asyncio.subprocess.Process | None = None
    _stop_reason: str = ""  # cancelled | timed_out | fenced | released | gave_back
    _started: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def key(self) -> tuple[int, int]:
        return (self.lease.job, self.lease.epoch)

    @property
    def stop_reason(self) -> str:
        return self._stop_reason

    @property
    def started(self) -> bool:
        """Its process runs (or ran): an exec may join it."""
        return self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        """Its shim's pid: /proc/<pid>/ns holds the job's namespaces while it runs."""
        return self._proc.pid if self._proc is not None else None

    def prepare(self) -> None:
        """The job's own folder: 0700, owned by its user, with tmp/ and output/ inside.

        With namespaces, its private /tmp, /var/tmp and accounts go under .berth/ in it.
        """
        assert self.user is not None
        for path in (self.workdir, self.workdir / "tmp", self.workdir / "output"):
            path.mkdir(mode=0o700)
            os.chown(path, self.user.uid, self.user.gid)
        if self.namespaces is not None:
            self._enter = self.namespaces.prepare(
                self.workdir, uid=self.user.uid, gid=self.user.gid, name=self.user.name
            )

    @property
    def cwd(self) -> Path:
        """Where the job runs, its inputs and code beside it: its clone, with --repo."""
        return self.workdir / "repo" if self.lease.repo else self.workdir

    def _brought(self) -> list[str]:
        """What berth put in the job's folder: its inputs and its code (never its output)."""
        code = ["main.py"] if self.lease.python or self.lease.python_sha256 else []
        return [Path(i.name).name for i in self.lease.inputs] + code

    async def fetch(self) -> None:
        """Its clone, inputs and code, into its folder (the clone, with --repo), its user's."""
        assert self.user is not None
        lease = self.lease
        if lease.repo:
            if self.repo_cache is None:
                raise FetchError("this worker keeps no repository cache")
            self._repo_base = await repos.clone(
                self.repo_cache,
                lease.repo,
                self.workdir / "repo",
                self.user,
                allow_local=self.allow_local_repos,
            )
        if lease.python:
            script = self.cwd / "main.py"
            fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(lease.python)
            os.chown(script, self.user.uid, self.user.gid)
        if not (lease.inputs or lease.python_sha256):
            return
        if self.store is None:
            raise FetchError("this worker reaches no artifact store for the job's inputs")
        await artifacts.fetch_inputs(self.store, lease.inputs, self.cwd)
        if lease.python_sha256:
            await get_file(self.store, lease.python_sha256, self.cwd / "main.py")
        for name in [Path(i.name).name for i in lease.inputs] + (
            ["main.py"] if lease.python_sha256 else []
        ):
            artifacts.hand_over(self.cwd / name, self.user.uid, self.user.gid)

    def argv(self) -> list[str]:
        if self.lease.python or self.lease.python_sha256:
            return [self.python, str(self.cwd / "main.py")]
        return list(self.lease.command)

    def env(self) -> dict[str, str]:
        env = environment.build(
            self.worker_env,
            pass_env=self.pass_env,
            job_env=self.lease.env,
            secrets=self.lease.secrets,
            berth={
                "BERTH_JOB_ID": str(self.lease.job),
                "BERTH_ATTEMPT": str(self.lease.epoch),
                "BERTH_TENANT": self.lease.tenant,
                "BERTH_OUTPUT": str(self.workdir / "output"),
                **self.gpu_env,
            },
            workdir=self.workdir,
            user=self.user.name if self.user else "",
        )
        return env | self._runtime_env(env["PATH"])

    def _runtime_env(self, path: str) -> dict[str, str]:
        """The runtime on the job's paths, and its relay (berth's variables, so they win).

        Its `berth` comes first on PATH, before `path` (the job's own, or the system's).
        """
        if self.runtime is None:
            return {}
        own_pythonpath = self.lease.env.get("PYTHONPATH", "")
        env = {
            "PATH": f"{self.runtime / 'bin'}:{path}",
            "PYTHONPATH": f"{self.runtime}:{own_pythonpath}".rstrip(":"),
            "BERTH_PYTHON": self.python,
        }
        if self.relay is not None:
            env["BERTH_RELAY"] = str(self.relay.socket_path)
            env["BERTH_RELAY_SECRET"] = self.relay.secret
        return env

    async def run(self, on_started: Callable[[], None]) -> Outcome:
        """Start, stream, wait; the outcome says how it ended."""
        try:
            if self.refusal:
                return Outcome("failed", None, self.refusal)
            return self._limited(await self._start_and_wait(on_started))
        finally:
            self._started.set()  # a stop() waiting for a start that never came may go on
            if self.relay is not None:
                await self.relay.close()
            if isinstance(self.limits, JobCgroup):
                self.limits.close()

    def _child(self) -> Step | None:
        """What the child does before exec: cgroups (still root), namespaces, then its uid.

        Makes the job's cgroups first (OSError when the kernel refuses).
        """
        assert self.user is not None
        drop = None
        if self.user.uid != os.geteuid():
            drop = jobusers.become(self.user.uid, self.user.gid)
        return _child_steps(self._limits_step(), self._enter, drop)

    def _limits_step(self) -> Step | None:
        """Make the job's cgroups (OSError when the kernel refuses); the child's step into them."""
        if self.limits is None:
            return None
        if isinstance(self.limits, JobCgroup):
            self.limits.create()
        return self.limits.enter()

    def _limited(self, outcome: Outcome) -> Outcome:
        """The outcome, saying so when the job's memory limit is what ended it."""
        limits = self.limits
        if isinstance(limits, JobCgroup) and limits.memory_mb and limits.oom_killed():
            outcome.state = "failed"
            outcome.error = confine.memory_killed(limits.memory_mb)
        elif (
            isinstance(limits, JobRlimits)
            and limits.memory_mb
            and outcome.state == "failed"
            and outcome.exit_code not in (None, 0)
        ):
            outcome.error = confine.memory_failed(outcome.exit_code, limits.memory_mb)
        return outcome

    async def _start_and_wait(self, on_started: Callable[[], None]) -> Outcome:
        assert self.user is not None
        try:
            self.prepare()
        except OSError as exc:
            return Outcome("failed", None, f"cannot make the job's folder: {exc}")
        try:
            await self.fetch()
        except (OSError, ValueError, CasError, FetchError, repos.RepoError) as exc:
            return Outcome("failed", None, f"cannot fetch the job's inputs: {exc}")
        if self._stop_reason:  # stopped while it waited for a uid: never start it
            return Outcome("cancelled", None, self._stop_reason)
        if self.relay is not None:
            try:
                await self.relay.start(self.user.uid, self.user.gid)
            except OSError as exc:
                return Outcome("failed", None, f"cannot open the job's relay: {exc}")
        try:
            child = self._child()
        except OSError as exc:
            return Outcome("failed", None, f"cannot set the job's limits: {exc}")
        read_end, write_end = os.pipe()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                SHIM,
                "berth-job",
                *self.argv(),
                cwd=self.cwd,
                env=self.env(),
                stdin=read_end,  # the shim's lifeline to this worker (see SHIM)
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group: cancel kills exactly this job
                # A few system calls in the child: isolation._enter, then jobusers.become.
                preexec_fn=child,
            )
        except OSError as exc:
            os.close(write_end)
            return Outcome("failed", None, f"cannot start the job: {exc}")
        except subprocess.SubprocessError:  # a step in the child failed: it never ran the job
            os.close(write_end)
            return Outcome(
                "failed", None, "cannot start the job: its namespaces or its uid could not be set"
            )
        finally:
            os.close(read_end)
        # The write end stays open in this process only (close-on-exec): its closing, when this
        # worker dies, is the shim's signal to kill the group.
        self._started.set()
        on_started()
        try:
            outcome = await self._wait()
        finally:
            os.close(write_end)
            await self._ended()
        if self.user.isolated:
            # Nothing the job left running may change its outputs while they are read.
            await jobusers.kill_all(self.user.uid)
        await self._keep_outputs(outcome)
        return outcome

    async def _ended(self) -> None:
        """The job's process ended: its execs end, and the lease's relay with it."""
        if self.ending is not None:
            await self.ending()
        if self.relay is not None:
            await self.relay.close()

    async def _keep_outputs(self, outcome: Outcome) -> None:
        """Upload what it left under $BERTH_OUTPUT, whatever its outcome.

        A failed job's outputs are often what explains it. Nothing is kept for a copy whose
        lease is not ours any more.
        """
        if self.store is None or self._stop_reason in ("fenced", "released", "gave_back"):
            return
        assert self.user is not None
        if self._repo_base:
            try:
                await repos.collect(
                    self.workdir / "repo",
                    self._repo_base,
                    self.workdir / "output",
                    self.user,
                    self.workdir,
                    leave_out=self._brought(),
                )
            except repos.RepoError as exc:
                outcome.error = (outcome.error + "; " if outcome.error else "") + str(exc)
        try:
            outcome.outputs = await artifacts.upload_outputs(
                self.store, self.workdir / "output", self.user.uid
            )
        except (OSError, CasError) as exc:
            outcome.error = (outcome.error + "; " if outcome.error else "") + (
                f"its outputs could not be kept: {exc}"
            )
            if outcome.state == "succeeded":
                outcome.state = "failed"

    async def _wait(self) -> Outcome:
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        pumps = asyncio.gather(self._pump(proc.stdout, "stdout"), self._pump(proc.stderr, "stderr"))
        timeout = self.lease.timeout_seconds or None
        try:
            await asyncio.wait_for(proc.wait(), timeout=timeout)
        except TimeoutError:
            self._stop_reason = self._stop_reason or "timed_out"
            await self._kill_group()
        try:  # a process that left the group may hold the pipes open: don't wait on it forever
            await asyncio.wait_for(pumps, timeout=self.grace + 5)
        except TimeoutError:
            pumps.cancel()
        code = proc.returncode
        if code is not None and code < 0:  # the shim itself died of a signal: as a shell says it
            code = 128 - code
        if self._stop_reason == "timed_out":
            return Outcome("timed_out", code, f"timed out after {self.lease.timeout_seconds:g}s")
        if self._stop_reason:
            return Outcome("cancelled", code, self._stop_reason)
        if code == 0:
            return Outcome("succeeded", 0)
        return Outcome("failed", code, f"exited with {code}")

    async def _pump(self, stream: asyncio.StreamReader, name: str) -> None:
        """Stream output as bytes, secrets masked (even across reads).

        A chunk never ends inside a UTF-8 character (an incomplete one waits for the next read),
        so text output reads cleanly chunk by chunk; bytes that are not UTF-8 pass untouched.
        """
        redactor = Redactor(self.lease.secrets.values())
        rest = b""
        while chunk := await stream.read(READ_SIZE):
            data = rest + redactor.feed(chunk)
            cut = utf8_boundary(data)
            data, rest = data[:cut], data[cut:]
            if data:
                await self.emit(name, data)
        if data := rest + redactor.flush():
            await self.emit(name, data)

    async def stop(self, reason: str) -> None:
        """Kill the job's whole group (TERM, then KILL after the grace period)."""
        self._stop_reason = self._stop_reason or reason
        if self.relay is not None:
            self.relay.live = False  # the lease is over: a job still in its grace is refused
        await self._started.wait()
        await self._kill_group()

    async def _kill_group(self) -> None:
        proc = self._proc
        if proc is None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=self.grace)
        # KILL the group even after the leader exited: a grandchild may still hold it.
        _signal_group(proc.pid, signal.SIGKILL)

    def cleanup(self) -> None:
        """Remove the job's folder; a stop() still waiting for a start returns."""
        self._started.set()
        shutil.rmtree(self.workdir, ignore_errors=True)


def utf8_boundary(data: bytes) -> int:
    """Where `data` may be cut without splitting a UTF-8 character: before an incomplete tail."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:  # ASCII: nothing pending
            return len(data)
        if byte >= 0xC0:  # a lead byte: complete when its sequence fits
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)  # continuation bytes only: not UTF-8, pass it as it is


def _child_steps(*steps: Step | None) -> Step | None:
    """What the child does between fork and exec: `steps` in order, those that are not None.

    Root's steps first (joining cgroups, mounting), then the drop to the job's uid.
    """
    todo = [s for s in steps if s is not None]
    if len(todo) <= 1:
        return todo[0] if todo else None

    def each() -> None:
        for step in todo:
            step()

    return each


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
