"""`berth job exec ID [--tty] -- COMMAND...` and `berth job shell ID`: a command beside a job.

The session is one websocket to the server (docs/api.md, "The exec stream"), which relays it
to the job's worker. Exits with the command's exit code. With --tty the local terminal is raw
for the session: every key (Ctrl-C too) goes to the remote terminal, whose line discipline
interrupts the command only; a resize of the local terminal is sent along. Without --tty,
Ctrl-C sends SIGINT to the command's process group (never to the job).
"""

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import termios
import threading
import tty
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI

from service.cli.client import CliError, add_server_arg, credential, server_url
from service.core.exits import Exit, for_status

STDOUT, STDERR = 1, 2
READ = 32768


def add(jsub: Any) -> None:  # noqa: ANN401  (argparse's subparsers)
    """Register `job exec` and `job shell` beside the other job commands."""
    e = jsub.add_parser(
        "exec",
        help="run a command beside a running job (its folder, user, environment, /tmp): "
        "berth job exec ID [--tty] -- COMMAND...",
    )
    add_server_arg(e, json=False)
    e.add_argument("id", type=int)
    e.add_argument(
        "--tty", "-t", action="store_true", help="give the command a terminal (raw mode here)"
    )
    e.add_argument("command", nargs=argparse.REMAINDER)
    e.set_defaults(func=exec_command)
    sh = jsub.add_parser("shell", help="an interactive shell beside a running job (a terminal)")
    add_server_arg(sh, json=False)
    sh.add_argument("id", type=int)
    sh.set_defaults(func=shell)


def exec_command(args: argparse.Namespace) -> int:
    command = list(args.command)
    tty_mode = bool(args.tty)
    # argparse hands over everything after ID, options written there included: take them
    # up to `--`, where the command begins.
    while command and command[0] in ("--tty", "-t"):
        tty_mode, command = True, command[1:]
    if command[:1] == ["--"]:
        command = command[1:]
    elif command[:1] and command[0].startswith("-"):
        raise CliError(f"unknown option {command[0]}: berth job exec ID [--tty] -- COMMAND...")
    if not command:
        raise CliError("say what to run: berth job exec ID [--tty] -- COMMAND...")
    return _session(args.server, args.id, command, tty_mode=tty_mode)


def shell(args: argparse.Namespace) -> int:
    return _session(args.server, args.id, [], tty_mode=True)


def _session(server: str | None, job_id: int, command: list[str], *, tty_mode: bool) -> int:
    if tty_mode and not os.isatty(0):
        raise CliError("--tty needs a terminal on stdin")
    base, _ = server_url(server)
    token, _ = credential()
    url = "ws" + base.removeprefix("http") + f"/api/v1/jobs/{job_id}/exec"
    saved = termios.tcgetattr(0) if tty_mode else None
    try:
        return asyncio.run(_run(url, token, command, tty_mode=tty_mode))
    except InvalidStatus as exc:  # refused before berth answered (a proxy, a bad path)
        status = exc.response.status_code
        raise CliError(f"{_said(exc.response.body) or exc}", for_status(status)) from None
    except (OSError, InvalidURI) as exc:
        raise CliError(f"cannot reach the server at {base}: {exc}", Exit.UNREACHABLE) from None
    finally:
        if saved is not None:
            termios.tcsetattr(0, termios.TCSADRAIN, saved)


async def _run(url: str, token: str, command: list[str], *, tty_mode: bool) -> int:
    async with connect(
        url,
        additional_headers={"Authorization": f"Bearer {token}"},
        open_timeout=30,
        max_size=4 * 1024 * 1024,
        compression=None,
    ) as ws:
        rows, cols = _size() if tty_mode else (0, 0)
        ask = {"command": command, "tty": tty_mode, "rows": rows, "cols": cols}
        try:
            await ws.send(json.dumps(ask))
            first = json.loads(await ws.recv())
        except ConnectionClosed as exc:  # refused before our ask was read: the close says why
            raise _refusal(exc) from None
        if first.get("type") == "error":
            raise CliError(str(first.get("error")), for_status(int(first.get("status", 400))))
        if tty_mode:
            tty.setraw(0, termios.TCSANOW)  # not TCSAFLUSH: keys typed ahead go along
        sending = asyncio.create_task(_stdin(ws, tty_mode=tty_mode))
        try:
            return await _output(ws)
        finally:
            sending.cancel()
            await asyncio.gather(sending, return_exceptions=True)


async def _output(ws: ClientConnection) -> int:
    """Write what comes back; the command's exit code when it ends."""
    try:
        async for message in ws:
            if isinstance(message, bytes):
                out = sys.stdout.buffer if message[:1] == bytes([STDOUT]) else sys.stderr.buffer
                out.write(message[1:])
                out.flush()
                continue
            said = json.loads(message)
            if said.get("type") == "exit":
                if said.get("error"):
                    sys.stderr.write(f"berth: {said['error']}\r\n")
                code = said.get("exit_code")
                return int(code) if code is not None else int(Exit.UNREACHABLE)
            if said.get("type") == "warning":
                sys.stderr.write(f"berth: {said.get('error')}\r\n")
    except ConnectionClosed:
        pass
    raise CliError("the server closed the exec session before the command ended", Exit.UNREACHABLE)


async def _stdin(ws: ClientConnection, *, tty_mode: bool) -> None:
    """Local stdin to the command; resizes and (without a terminal) Ctrl-C as controls."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes] = asyncio.Queue(maxsize=4)

    def read() -> None:  # a thread: stdin may be a file, a pipe or a terminal
        while True:
            try:
                data = os.read(0, READ)
            except OSError:
                data = b""
            asyncio.run_coroutine_threadsafe(chunks.put(data), loop).result()
            if not data:
                return

    def control(message: dict[str, Any]) -> None:
        loop.create_task(ws.send(json.dumps(message)))  # noqa: RUF006  (ends with the socket)

    if tty_mode:
        loop.add_signal_handler(
            signal.SIGWINCH, lambda: control(dict(zip(("rows", "cols"), _size(), strict=True)))
        )
    else:
        loop.add_signal_handler(signal.SIGINT, lambda: control({"signal": "INT"}))
    threading.Thread(target=read, daemon=True, name="stdin").start()
    try:
        while data := await chunks.get():
            await ws.send(data)
        await ws.send(json.dumps({"eof": True}))
        await asyncio.Future()  # the session ends from the other side
    finally:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(signal.SIGWINCH if tty_mode else signal.SIGINT)


def _refusal(exc: ConnectionClosed) -> CliError:
    """The server's refusal, from its close frame (code 4000 + the HTTP status it stands for)."""
    code, reason = (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd is not None else (0, "")
    if code >= 4000 and reason:
        return CliError(reason, for_status(code - 4000))
    return CliError(f"the server closed the exec session: {exc}", Exit.UNREACHABLE)


def _said(body: bytes | bytearray | None) -> str:
    """The `error` of a JSON error body, or ""."""
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(body or b"{}").get("error") or "")
    return ""


def _size() -> tuple[int, int]:
    size = os.get_terminal_size(0)
    return size.lines, size.columns
