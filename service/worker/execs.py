"""`berth job exec` on the worker: a command beside a running job, as the job (docs/api.md).

The command runs in the job's working directory, under its uid, with its built environment,
inside its mount and IPC namespaces (so it sees the job's private /tmp), in a process group of
its own: a signal from the client reaches the command and never the job. Its output is masked
of the job's secrets as the job's own is. With a terminal it gets a PTY as its controlling
terminal, so Ctrl-C (a byte on the PTY) interrupts only its foreground process group.

An exec lives no longer than the job's lease (the job's end kills it before the uid is given
back, so the uid is never another job's while an exec'd process lives) nor the connection it
came over (its client is behind that connection). Nothing here is a thread: one process, two
or three tasks and a few buffers per exec.
"""

import asyncio
import contextlib
import ctypes
import fcntl
import logging
import os
import pty
import shutil
import signal
import struct
import subprocess
import termios
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from service import protocol
from service.worker import isolation, jobusers
from service.worker.isolation import Step
from service.worker.redaction import Redactor
from service.worker.runner import Run, utf8_boundary

log = logging.getLogger("berth.worker")

Send = Callable[[protocol.Frame], Awaitable[None]]
SIGNALS = {
    "INT": signal.SIGINT,
    "TERM": signal.SIGTERM,
    "HUP": signal.SIGHUP,
    "QUIT": signal.SIGQUIT,
    "KILL": signal.SIGKILL,
}
DRAIN_SECONDS = 2.0  # after the command exits: what a child it left still writes is not waited on
MAX_EXECS = 256  # at once on one worker: bounds what the server's queue to it holds (EXEC_WINDOW)
NOT_RUNNING = "job {job} (attempt {epoch}) is not running on this worker"


def shell_of(env: dict[str, str]) -> list[str]:
    """`berth job shell`'s command: the job's $SHELL, else bash, else sh, interactive.

    Not a login shell: its profile would reset the job's PATH.
    """
    shell = env.get("SHELL") or shutil.which("bash", path=env.get("PATH")) or "/bin/sh"
    return [shell, "-i"]


@dataclass(eq=False)
class Exec:
    """One exec'd command, its pipes (or PTY), and the window of its output frames."""

    id: int
    key: tuple[int, int]
    send: Send
    tty: bool
    proc: asyncio.subprocess.Process | None = None
    master: int = -1  # the PTY's master side, with --tty
    credit: asyncio.BoundedSemaphore = field(
        default_factory=lambda: asyncio.BoundedSemaphore(protocol.EXEC_WINDOW)
    )
    inputs: asyncio.Queue[protocol.ExecInput] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    ended: str = ""  # why it was ended from outside (lease, connection), or ""


class Execs:
    """The exec sessions of this worker, by the server's id."""

    def __init__(self) -> None:
        self._by_id: dict[int, Exec] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def start(self, frame: protocol.ExecStart, run: Run | None, send: Send) -> None:
        """Start the command on a task of its own; its exit (or why not) goes back by `send`."""
        ex = Exec(frame.exec, (frame.job, frame.epoch), send, frame.tty)
        if frame.exec in self._by_id:
            return  # the server never reuses an id on one connection: a repeat is ignored
        self._by_id[ex.id] = ex
        ex.task = asyncio.create_task(self._run(ex, frame, run), name=f"exec-{ex.id}")

    def input(self, frame: protocol.ExecInput) -> None:
        ex = self._by_id.get(frame.exec)
        if ex is not None:
            ex.inputs.put_nowait(frame)  # bounded by the server's window (EXEC_WINDOW)

    def delivered(self, frame: protocol.ExecDelivered) -> None:
        ex = self._by_id.get(frame.exec)
        if ex is not None:
            with contextlib.suppress(ValueError):  # more acks than frames sent: nothing owed
                ex.credit.release()

    async def end_job(self, key: tuple[int, int], reason: str) -> None:
        """The job's lease ended: kill its execs and wait for them (before its uid goes back)."""
        await self._end([ex for ex in self._by_id.values() if ex.key == key], reason)

    async def end_all(self, reason: str) -> None:
        """The connection ended: its clients are gone with it."""
        await self._end(list(self._by_id.values()), reason)

    async def _end(self, execs: list[Exec], reason: str) -> None:
        for ex in execs:
            ex.ended = ex.ended or reason
            _kill_group(ex, signal.SIGKILL)
        tasks = [ex.task for ex in execs if ex.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, ex: Exec, frame: protocol.ExecStart, run: Run | None) -> None:
        code: int | None = None
        error = ""
        try:
            if run is None or run.stop_reason or run.user is None or not run.started:
                error = NOT_RUNNING.format(job=frame.job, epoch=frame.epoch)
            elif len(self._by_id) > MAX_EXECS:
                error = f"this worker runs {MAX_EXECS} exec sessions already; try again later"
            else:
                code, error = await self._command(ex, frame, run)
        except Exception as exc:  # a bug here must still end the client's session, and say so
            log.exception("exec %s failed", ex.id)
            error = f"worker error: {exc}"
        finally:
            self._by_id.pop(ex.id, None)
            if ex.master >= 0:
                os.close(ex.master)
        if ex.ended:
            error = error or ex.ended
        with contextlib.suppress(Exception):  # the connection may be gone: nobody to tell
            await ex.send(protocol.ExecExit(exec=ex.id, exit_code=code, error=error[:4000]))

    async def _command(
        self, ex: Exec, frame: protocol.ExecStart, run: Run
    ) -> tuple[int | None, str]:
        assert run.user is not None
        env = run.env()
        argv = list(frame.command) or shell_of(env)
        try:
            enter = _enter_job(run)
        except OSError:  # its namespaces went with its last process: it just ended
            return None, NOT_RUNNING.format(job=frame.job, epoch=frame.epoch)
        steps = [s for s in (enter, _cgroup_step(run)) if s is not None]
        if run.user.uid != os.geteuid():
            steps.append(jobusers.become(run.user.uid, run.user.gid))
        cwd = str(run.cwd)
        slave = -1
        if ex.tty:
            ex.master, slave = pty.openpty()
            os.fchown(slave, run.user.uid, run.user.gid)  # its terminal, as login would make it
            _resize(ex.master, frame.rows, frame.cols)
            os.set_blocking(ex.master, False)
        try:
            ex.proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=env,
                stdin=slave if ex.tty else asyncio.subprocess.PIPE,
                stdout=slave if ex.tty else asyncio.subprocess.PIPE,
                stderr=slave if ex.tty else asyncio.subprocess.PIPE,
                start_new_session=True,  # its own group: a signal from the client spares the job
                preexec_fn=_child(steps, cwd, tty=ex.tty),
            )
        except OSError as exc:
            return None, f"cannot run {argv[0]}: {exc.strerror or exc}"
        except subprocess.SubprocessError:
            return None, "cannot enter the job's namespaces or take its uid"
        finally:
            if slave >= 0:
                os.close(slave)
            if enter is not None:
                enter.close()
        if ex.ended:  # the job ended while this one started: it must not outlive it
            _kill_group(ex, signal.SIGKILL)
        log.info("exec %s: job %s, %s", ex.id, frame.job, argv[0])
        redact = list(run.lease.secrets.values())
        pumps = (
            [self._pump_pty(ex, Redactor(redact))]
            if ex.tty
            else [
                self._pump(ex, ex.proc.stdout, "stdout", Redactor(redact)),
                self._pump(ex, ex.proc.stderr, "stderr", Redactor(redact)),
            ]
        )
        output = asyncio.gather(*pumps)
        feeding = asyncio.create_task(self._feed(ex))
        try:
            code = await ex.proc.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(output), timeout=DRAIN_SECONDS)
        finally:
            output.cancel()
            feeding.cancel()
            await asyncio.gather(output, feeding, return_exceptions=True)
            _kill_group(ex, signal.SIGKILL)  # what it left in its group goes with it
        return (128 - code if code < 0 else code), ""

    async def _out(self, ex: Exec, stream: str, data: bytes) -> None:
        for at in range(0, len(data), protocol.EXEC_CHUNK):
            await ex.credit.acquire()  # the server acks each frame it delivered
            await ex.send(
                protocol.ExecOutput(
                    exec=ex.id,
                    stream=stream,  # type: ignore[arg-type]
                    data=data[at : at + protocol.EXEC_CHUNK],
                )
            )

    async def _pump(
        self, ex: Exec, reader: asyncio.StreamReader | None, stream: str, redactor: Redactor
    ) -> None:
        assert reader is not None
        rest = b""
        while chunk := await reader.read(protocol.EXEC_CHUNK):
            data = rest + redactor.feed(chunk)
            cut = utf8_boundary(data)
            data, rest = data[:cut], data[cut:]
            await self._out(ex, stream, data)
        await self._out(ex, stream, rest + redactor.flush())

    async def _pump_pty(self, ex: Exec, redactor: Redactor) -> None:
        rest = b""
        while chunk := await _read_fd(ex.master):
            # Only a tail that begins a secret is held (redaction.py): a prompt shows at once.
            data = rest + redactor.feed(chunk)
            cut = utf8_boundary(data)
            data, rest = data[:cut], data[cut:]
            await self._out(ex, "stdout", data)
        await self._out(ex, "stdout", rest + redactor.flush())

    async def _feed(self, ex: Exec) -> None:
        """Client input, in order: to stdin (or the PTY), resizes, signals; each one acked."""
        while True:
            frame = await ex.inputs.get()
            try:
                await self._apply(ex, frame)
            except (OSError, ConnectionError) as exc:  # the command closed its stdin: fine
                log.debug("exec %s input: %s", ex.id, exc)
            await ex.send(protocol.ExecTaken(exec=ex.id))

    async def _apply(self, ex: Exec, frame: protocol.ExecInput) -> None:
        proc = ex.proc
        assert proc is not None
        if frame.data:
            if ex.tty:
                await _write_fd(ex.master, frame.data)
            elif proc.stdin is not None:
                proc.stdin.write(frame.data)
                await proc.stdin.drain()
        if frame.eof:
            if ex.tty:
                await _write_fd(ex.master, b"\x04")  # ^D: end of input, as a terminal says it
            elif proc.stdin is not None:
                proc.stdin.close()
        if frame.rows and frame.cols and ex.tty:
            _resize(ex.master, frame.rows, frame.cols)  # the kernel sends SIGWINCH to its group
        if sig := SIGNALS.get(frame.signal):
            _kill_group(ex, sig)


def _kill_group(ex: Exec, sig: int) -> None:
    if ex.proc is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(ex.proc.pid, sig)


def _resize(fd: int, rows: int, cols: int) -> None:
    if rows > 0 and cols > 0:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


async def _ready(fd: int, *, write: bool) -> None:
    """Until `fd` may be read (or written) without blocking."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await ready
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def _read_fd(fd: int) -> bytes:
    """Some bytes from a non-blocking fd; b"" at its end (a PTY says EIO once no one holds it)."""
    while True:
        try:
            return os.read(fd, protocol.EXEC_CHUNK)
        except BlockingIOError:
            await _ready(fd, write=False)
        except OSError:  # EIO: every process holding the terminal closed it
            return b""


async def _write_fd(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:
            await _ready(fd, write=True)


class _Enter:
    """The job's namespaces, held open in this process until the child has joined them."""

    def __init__(self, fds: list[tuple[int, int]]) -> None:
        self.fds = fds
        self._libc = isolation.libc_setns()

    def __call__(self) -> None:
        for fd, kind in self.fds:
            if self._libc.setns(fd, kind) != 0:
                raise OSError(ctypes.get_errno(), "setns")

    def close(self) -> None:
        for fd, _ in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _enter_job(run: Run) -> _Enter | None:
    """The step into the job's mount and IPC namespaces (its private /tmp), when it has them."""
    if run.namespaces is None or run.pid is None:
        return None
    fds = []
    for name, kind in (("mnt", isolation.CLONE_NEWNS), ("ipc", isolation.CLONE_NEWIPC)):
        fds.append((os.open(Path("/proc", str(run.pid), "ns", name), os.O_RDONLY), kind))
    return _Enter(fds)


def _cgroup_step(run: Run) -> Step | None:
    """The step into the job's limits: its cgroups, else the same rlimits and affinity.

    In the job's cgroup the exec is counted and bounded with the job.
    """
    return run.limits.enter() if run.limits is not None else None


def _child(steps: list[Step], cwd: str, *, tty: bool) -> Step:
    """Between fork and exec: join the job (namespaces, cgroup), take its uid, its terminal."""

    def child() -> None:
        for step in steps:
            step()
        os.chdir(cwd)  # joining a mount namespace moves the cwd to its root
        if tty:  # a session leader already (start_new_session): take the PTY as its terminal
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    return child
