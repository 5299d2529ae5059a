"""`berth job submit | list | show | logs | cancel | wait`."""

import argparse
import base64
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import msgspec
from msgspec import UNSET

from service import views
from service.cli import exec as exec_cli
from service.cli import progress, transfer
from service.cli.client import CliError, add_server_arg, connect, listing, print_json
from service.client import BerthClient, InputRequest, JobRequest
from service.core import resources
from service.core.exits import Exit
from service.core.states import JobState, exit_status
from service.events import EndEvent, OutputEvent, StateEvent


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser("job", help="submit and follow jobs")
    jsub = p.add_subparsers(dest="job_command", required=True, parser_class=type(p))

    s = jsub.add_parser("submit", help="queue a job: berth job submit [options] -- COMMAND...")
    add_server_arg(s)
    s.add_argument("--tenant")
    s.add_argument("--kind", default="default")
    s.add_argument("--pool")
    s.add_argument("--label", action="append", default=[], dest="labels")
    s.add_argument("--device-policy", choices=["require", "prefer"], default="require")
    s.add_argument("--env", action="append", default=[], metavar="K=V")
    s.add_argument("--secret", action="append", default=[], metavar="NAME|VAR=NAME")
    s.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="PATH",
        help="a file or directory, uploaded (unless the store has it) and fetched into the job",
    )
    s.add_argument("--repo", metavar="URL[@REV]", help="a git repository cloned for the job")
    s.add_argument("--timeout", type=float, default=0.0, metavar="SECONDS")
    s.add_argument("--max-attempts", type=int, default=3)
    s.add_argument("--priority", type=int, default=0)
    s.add_argument(
        "--cpus", type=float, metavar="N", help="CPUs it reserves, fractional (default: its pool's)"
    )
    s.add_argument(
        "--memory",
        metavar="SIZE",
        help="memory it reserves and may use: 512M, 2G (powers of 1024; default: its pool's)",
    )
    s.add_argument("--gpus", type=int, metavar="N", help="GPUs it gets (default: its pool's)")
    s.add_argument("--python", metavar="FILE", help="Python source that travels with the job")
    s.add_argument(
        "--wait",
        action="store_true",
        help="stream output; exit with the job's code (with --json: print the job when it ends)",
    )
    s.add_argument(
        "--cancel-on-interrupt",
        action="store_true",
        help="with --wait: Ctrl-C cancels the job (without it, the job goes on)",
    )
    s.add_argument("command", nargs=argparse.REMAINDER)
    s.set_defaults(func=submit)

    ls = jsub.add_parser("list", help="list jobs")
    add_server_arg(ls)
    ls.add_argument("--state")
    ls.add_argument("--tenant")
    ls.add_argument("--limit", type=int, default=100)
    ls.set_defaults(func=list_jobs)

    for name, func, helptext in (
        ("show", show, "one job, and what it waits for"),
        ("cancel", cancel, "cancel a job"),
        ("wait", wait, "wait for a job; exit with its code"),
    ):
        c = jsub.add_parser(name, help=helptext)
        add_server_arg(c)
        c.add_argument("id", type=int)
        if name == "wait":
            c.add_argument(
                "--cancel-on-interrupt",
                action="store_true",
                help="Ctrl-C cancels the job (without it, the job goes on)",
            )
        c.set_defaults(func=func)

    fe = jsub.add_parser("fetch", help="download a job's outputs ($BERTH_OUTPUT) into DIR")
    add_server_arg(fe)
    fe.add_argument("id", type=int)
    fe.add_argument("dir", nargs="?", type=Path, default=Path())
    fe.set_defaults(func=fetch)

    lg = jsub.add_parser(
        "logs",
        help="a job's output (--json: its chunks as text; with -f one JSON object a line)",
    )
    add_server_arg(lg)
    lg.add_argument("id", type=int)
    lg.add_argument(
        "--follow", "-f", action="store_true", help="until the job ends; exit with its code"
    )
    lg.set_defaults(func=logs)

    exec_cli.add(jsub)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{what} {item!r} must be KEY=VALUE")
        out[key] = value
    return out


def _secrets(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        var, sep, name = item.partition("=")
        out[var] = name if sep else var
    return out


def body_of(args: argparse.Namespace) -> JobRequest:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    body = JobRequest(
        kind=args.kind,
        labels=args.labels,
        device_policy=args.device_policy,
        env=_pairs(args.env, "--env"),
        secrets=_secrets(args.secret),
        timeout_seconds=args.timeout,
        max_attempts=args.max_attempts,
        priority=args.priority,
        repo=args.repo or UNSET,
        pool=args.pool or UNSET,
        tenant=args.tenant or UNSET,
    )
    _resources(args, body)
    if args.python:
        if command:
            raise CliError("give either --python FILE or a command, not both")
        try:
            body.python = Path(args.python).read_text()
        except OSError as exc:
            raise CliError(f"cannot read {args.python}: {exc.strerror}") from None
    elif not command:
        raise CliError("no command: berth job submit [options] -- COMMAND [ARG...]")
    else:
        body.command = command
    return body


def _resources(args: argparse.Namespace, body: JobRequest) -> None:
    """--cpus, --memory, --gpus onto the request (those not given: the pool's default)."""
    try:
        if args.cpus is not None:
            body.cpus = resources.check_cpus(args.cpus, what="--cpus")
        if args.memory is not None:
            body.memory_mb = resources.parse_size(args.memory)
        if args.gpus is not None:
            body.gpus = resources.check_gpus(args.gpus, what="--gpus")
    except resources.BadSize as exc:
        raise CliError(str(exc).replace("memory ", "--memory ", 1)) from None


def submit(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        return _submit(client, args)


def _submit(client: BerthClient, args: argparse.Namespace) -> int:
    body = body_of(args)
    inputs = [transfer.upload(client, Path(p), tenant=args.tenant) for p in args.input]
    if inputs:
        names = [i.name for i in inputs]
        if len(set(names)) != len(names):
            raise CliError("two inputs share a name: each lands in the job's folder by its name")
        body.inputs = [InputRequest(name=i.name, sha256=i.sha256, kind=i.kind) for i in inputs]
        sent = sum(i.sent for i in inputs)
        sys.stderr.write(f"inputs: {len(inputs)}, {sent} bytes sent\n")
    job = client.submit_job(body)
    if not args.wait:
        if args.json:
            print_json(job)
        else:
            print(job.id)
        return 0
    job_id = job.id
    # stdout is the job's: its id goes to stderr, so a job that never starts still has a name.
    sys.stderr.write(f"berth: job {job_id} submitted; waiting for it to end\n")
    sys.stderr.flush()
    if args.json:
        return interruptible(
            client, job_id, args.cancel_on_interrupt, lambda: _wait(client, job_id, as_json=True)
        )
    moves = progress.Moves(job_id)
    return interruptible(
        client, job_id, args.cancel_on_interrupt, lambda: follow(client, job_id, moves=moves)
    )


def interruptible(
    client: BerthClient, job_id: int, cancel: bool, waiting: Callable[[], int]
) -> int:
    """`waiting()`, and on Ctrl-C say that the job goes on (and how to cancel it), or cancel it."""
    try:
        return waiting()
    except KeyboardInterrupt:
        if cancel:
            job = client.cancel_job(job_id)
            sys.stderr.write(f"berth: job {job_id} {job.state}: cancelled on interrupt\n")
        else:
            sys.stderr.write(
                f"berth: job {job_id} goes on; only the waiting stopped. "
                f"Cancel it with: berth job cancel {job_id}\n"
            )
        return Exit.INTERRUPTED


def follow(
    client: BerthClient, job_id: int, *, as_json: bool = False, moves: progress.Moves | None = None
) -> int:
    """Stream a job's output to our stdout/stderr; return the exit status it ended with.

    Pushed by the server (GET /api/v1/jobs/{id}/events), resumed across dropped connections.
    `as_json`: each chunk as text, then the result, one JSON object a line. `moves`: the job's
    state changes, shown on stderr at a terminal.
    """
    encoding: Literal["text", "base64"] = "text" if as_json else "base64"
    for event in client.follow_events(job_id, encoding=encoding):
        if isinstance(event, OutputEvent):
            chunk = views.ChunkView(
                id=event.id, stream=event.stream, data=event.data, b64=event.b64
            )
            if as_json:
                sys.stdout.write(msgspec.json.encode(chunk).decode() + "\n")
                sys.stdout.flush()
            else:
                _write(chunk)
        elif isinstance(event, StateEvent):
            if moves is not None:
                moves.show(event)
        else:
            state = JobState(event.state)
            if as_json:
                end = views.LogEndView(
                    state=event.state, exit_code=event.exit_code, error=event.error
                )
                sys.stdout.write(msgspec.json.encode(end).decode() + "\n")
                sys.stdout.flush()
            elif state is not JobState.SUCCEEDED and event.error and not (moves and moves.ended):
                sys.stderr.write(f"berth: job {job_id} {state}: {event.error}\n")
            return exit_status(state, event.exit_code)
    raise CliError(f"the events of job {job_id} ended without its end", Exit.SERVER_ERROR)


def list_jobs(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        jobs = client.list_jobs(state=args.state, tenant=args.tenant, limit=args.limit)
    return listing(
        args,
        jobs,
        [
            [
                str(j.id),
                j.state,
                j.tenant,
                j.pool or "-",
                j.kind,
                j.worker or "-",
                str(j.attempt),
                "-" if j.exit_code is None else str(j.exit_code),
                " ".join(j.command)[:40] or "(python)",
            ]
            for j in jobs
        ],
        ["ID", "STATE", "TENANT", "POOL", "KIND", "WORKER", "ATTEMPT", "EXIT", "COMMAND"],
    )


def show(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        job = client.job(args.id)
    if args.json:
        print_json(job)
        return 0
    for key in (
        "id",
        "state",
        "tenant",
        "pool",
        "kind",
        "labels",
        "worker",
        "attempt",
        "max_attempts",
        "exit_code",
        "error",
        "created_by",
        "created_at",
        "started_at",
        "finished_at",
        "command",
    ):
        value = _shown(getattr(job, key))
        print(f"{key:13} {value if value not in (None, '') else '-'}")
    if job.cpus or job.memory_mb or job.gpus:
        asked = [
            f"{resources.shown_cpus(job.cpus)} CPUs" if job.cpus else "",
            resources.shown_memory(job.memory_mb) if job.memory_mb else "",
            f"{job.gpus} GPUs" if job.gpus else "",
        ]
        print(f"{'resources':13} {', '.join(a for a in asked if a)}")
    if job.waiting_for:
        print(f"{'waiting for':13} {job.waiting_for}")
    for name, number in sorted(job.metrics.items()):
        print(f"{'metric':13} {name} = {number:g}")
    for out in job.outputs:
        print(f"{'output':13} {out.path} ({out.size} bytes, {out.sha256[:12]})")
    return 0


def _shown(value: object) -> object:
    """A field of `job show` as the API's JSON has it: lists joined, times in ISO 8601."""
    if isinstance(value, list):
        return " ".join(value) if value else "-"
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def fetch(args: argparse.Namespace) -> int:
    """Download every output of a job into DIR, under the paths the job gave them."""
    root = args.dir.resolve()
    fetched = []
    with connect(args.server) as client:
        job = client.job(args.id)
        for out in job.outputs:
            target = (root / out.path).resolve()
            if not target.is_relative_to(root):  # a path the job chose: never outside DIR
                raise CliError(f"output {out.path!r} would land outside {root}")
            transfer.download(client, out.sha256, target, tenant=job.tenant)
            fetched.append({**msgspec.structs.asdict(out), "file": str(target)})
            if not args.json:
                print(target)
    if args.json:
        print_json(fetched)
    return 0


def cancel(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        job = client.cancel_job(args.id)
    if args.json:
        print_json(job)
    else:
        print(f"job {job.id}: {job.state}")
    return 0


def wait(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        return interruptible(
            client,
            args.id,
            args.cancel_on_interrupt,
            lambda: _wait(client, args.id, as_json=args.json),
        )


def _wait(client: BerthClient, job_id: int, *, as_json: bool) -> int:
    """Until the job ends (pushed, not polled), its moves on stderr at a terminal."""
    moves = progress.Moves(job_id)
    for event in client.follow_events(job_id, output=False):
        if isinstance(event, StateEvent):
            moves.show(event)
        elif isinstance(event, EndEvent):
            if as_json:
                print_json(client.job(job_id))
            return exit_status(JobState(event.state), event.exit_code)
    raise CliError(f"the events of job {job_id} ended without its end", Exit.SERVER_ERROR)


def logs(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        if args.follow:
            return follow(client, args.id, as_json=args.json)
        return _logs(client, args.id, as_json=args.json)


def _logs(client: BerthClient, job_id: int, *, as_json: bool) -> int:
    after = 0
    encoding: Literal["text", "base64"] = "text" if as_json else "base64"
    chunks: list[views.ChunkView] = []
    while True:
        got = client.logs(job_id, after=after, encoding=encoding)
        for c in got.chunks:
            if as_json:
                chunks.append(c)
            else:
                _write(c)
            after = c.id
        if not got.chunks:
            if as_json:
                print_json(
                    {"id": job_id, "state": got.state, "exit_code": got.exit_code, "chunks": chunks}
                )
            return 0


def _write(chunk: views.ChunkView) -> None:
    """Output is bytes: written as the job wrote them, to our stdout or stderr."""
    out = sys.stdout if chunk.stream == "stdout" else sys.stderr
    out.flush()
    out.buffer.write(base64.b64decode(chunk.b64 or ""))
    out.buffer.flush()
