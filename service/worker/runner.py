"""The process runner: one job in its own process group and working directory.

stdout/stderr are streamed to `emit` as they come. Cancel and timeout kill the whole group
(TERM, then KILL after the grace period) and touch no other job. The group leader is SHIM, a
few lines of POSIX sh that kill the whole group when this worker process dies, even by kill -9.
"""

import asyncio
import codecs
import contextlib
import os
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from service import protocol
from service.worker.redaction import Redactor

Emit = Callable[[str, str], None]  # (stream, text)

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


@dataclass
class Outcome:
    state: str  # succeeded | failed | timed_out | cancelled
    exit_code: int | None
    error: str = ""


@dataclass
class Run:
    lease: protocol.Lease
    workdir: Path
    python: str
    grace: float
    emit: Emit
    env: dict[str, str] = field(default_factory=dict)
    _proc: asyncio.subprocess.Process | None = None
    _stop_reason: str = ""  # cancelled | timed_out | fenced
    _started: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def key(self) -> tuple[int, int]:
        return (self.lease.job, self.lease.epoch)

    def argv(self) -> list[str]:
        if self.lease.python:
            script = self.workdir / "main.py"
            script.write_text(self.lease.python)
            return [self.python, str(script)]
        return list(self.lease.command)

    async def run(self, on_started: Callable[[], None]) -> Outcome:
        """Start, stream, wait; the outcome says how it ended."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, **self.lease.env, **self.lease.secrets}
        env["BERTH_JOB_ID"] = str(self.lease.job)
        env["BERTH_ATTEMPT"] = str(self.lease.epoch)
        read_end, write_end = os.pipe()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                SHIM,
                "berth-job",
                *self.argv(),
                cwd=self.workdir,
                env=env,
                stdin=read_end,  # the shim's lifeline to this worker (see SHIM)
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group: cancel kills exactly this job
            )
        except OSError as exc:
            os.close(write_end)
            return Outcome("failed", None, f"cannot start the job: {exc}")
        finally:
            os.close(read_end)
        # The write end stays open in this process only (close-on-exec): its closing, when this
        # worker dies, is the shim's signal to kill the group.
        self._started.set()
        on_started()
        try:
            return await self._wait()
        finally:
            os.close(write_end)

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
        """Stream output, decoded incrementally (a character may straddle reads), secrets masked."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        redactor = Redactor(self.lease.secrets.values())
        while chunk := await stream.read(65536):
            if text := redactor.feed(decoder.decode(chunk)):
                self.emit(name, text)
        if text := redactor.feed(decoder.decode(b"", final=True)) + redactor.flush():
            self.emit(name, text)

    async def stop(self, reason: str) -> None:
        """Kill the job's whole group (TERM, then KILL after the grace period)."""
        self._stop_reason = self._stop_reason or reason
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
        shutil.rmtree(self.workdir, ignore_errors=True)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
