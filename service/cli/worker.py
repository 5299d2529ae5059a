"""`berth worker` (run one) and `berth worker list | drain | disable | enable | rm NAME`."""

import argparse
import asyncio
import os
import pwd
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from service import stdlog
from service.cli.client import (
    Client,
    CliError,
    add_server_arg,
    home,
    listing,
    print_json,
    server_url,
)
from service.cli.logflags import add_log_args, log_json
from service.core import durations, resources
from service.core.errors import BerthError
from service.core.exits import Exit

if TYPE_CHECKING:
    from service.config import Cas

WHO_RUNS_JOBS = """\
Who a job runs as: a worker started as root runs each job under a uid of its own from
--uid-range (default 61000-61999), in a working directory only that uid may enter, so a job
can read neither the worker's state nor another job's files or environment. --run-as USER
runs every job as one fixed user instead. A worker that is NOT root runs its jobs as its own
user: they can then read whatever that user can, the worker's state directory included. Jobs
get a clean environment (PATH the system's, HOME, LANG, LC_*, TZ, TMPDIR, USER, SHELL, the names
given with --pass-env, then their own env and secrets), never the worker's own settings or
credential. As root each job also gets private /tmp, /var/tmp, /dev/shm and IPC (or, where
namespaces cannot be made, what its uid leaves there is removed before the uid runs again).
"""


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser(
        "worker",
        help="run a worker, or list and steer workers",
        description="Run a worker (--pool), or list and steer workers.",
        epilog=WHO_RUNS_JOBS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_server_arg(p)
    p.add_argument(
        "action", nargs="?", choices=["list", "drain", "disable", "enable", "rm", "join-token"]
    )
    p.add_argument("name", nargs="?", help="the worker, for drain/disable/enable/rm")
    p.add_argument("--pool", help="the pool this worker serves (to run one)")
    p.add_argument(
        "--home",
        type=Path,
        metavar="DIR",
        help="this worker's state directory: its credential and caches (default $BERTH_HOME); "
        "two workers on one host each need their own",
    )
    p.add_argument(
        "--name",
        dest="worker_name",
        help="behind a proxy: this worker's name (with a token, the token's name is used)",
    )
    p.add_argument("--labels", default="", help="comma-separated: a,b,k=v")
    p.add_argument(
        "--parallel", type=int, default=0, help="most jobs at once (0: the pool's slots)"
    )
    p.add_argument(
        "--cpus",
        type=float,
        metavar="N",
        help="CPUs it offers jobs, fractional (default: the cores it may run on)",
    )
    p.add_argument(
        "--memory",
        metavar="SIZE",
        help="memory it offers jobs: 16G, 512M (powers of 1024; default: the host's)",
    )
    p.add_argument(
        "--gpus", type=int, metavar="N", help="GPUs it offers jobs (default: those NVML finds)"
    )
    p.add_argument(
        "--python",
        default="",
        help="interpreter for Python jobs (default: this one, or python3 when jobs cannot run it)",
    )
    p.add_argument(
        "--pass-env",
        action="append",
        default=[],
        metavar="NAME",
        help="pass this variable of the worker's environment to jobs (never BERTH_*)",
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument(
        "--uid-range", default="61000-61999", metavar="A-B", help="as root: a uid per job"
    )
    who.add_argument("--run-as", default="", metavar="USER", help="as root: every job as USER")
    p.add_argument(
        "--work-dir",
        type=Path,
        metavar="DIR",
        help="where jobs' working directories go (default /var/lib/berth/work as root)",
    )
    p.add_argument(
        "--orphan-exit-seconds",
        type=float,
        default=0.0,
        metavar="S",
        help="exit after S seconds without reaching a server, when holding no job (0: never)",
    )
    p.add_argument("--provisioned", default="", help=argparse.SUPPRESS)  # labels, for `list`
    p.add_argument(
        "--allow-local-repos",
        action="store_true",
        help="let --repo name a path on this machine (only for tenants you trust with it)",
    )
    add_log_args(p)
    j = p.add_argument_group("join-token (a one-time token for a new node)")
    j.add_argument("--tenant", action="append", default=[], dest="tenants", metavar="T")
    j.add_argument("--expires", default="1h", metavar="DURATION", help="90s, 15m, 1h, 30d")
    p.set_defaults(func=dispatch)


def dispatch(args: argparse.Namespace) -> int:
    if args.action is None:
        return run(args)
    if args.action == "list":
        return list_workers(args)
    if args.action == "join-token":
        return join_token(args)
    if not args.name:
        raise CliError(f"berth worker {args.action} NAME: which worker?")
    client = Client(args.server)
    if args.action == "rm":
        out = client.call("DELETE", f"/api/v1/workers/{quote(args.name, safe='')}")
        if args.json:
            print_json(out)
        else:
            print(f"removed {out['name']}")
        return 0
    out = client.call("POST", f"/api/v1/workers/{quote(args.name, safe='')}/{args.action}")
    if args.json:
        print_json(out)
    elif out["state"] == out["set"]:
        print(f"{out['name']}: {out['state']}")
    else:  # e.g. enabled, but it exited: it takes jobs once it attaches again
        print(f"{out['name']}: {out['state']} ({VERB[args.action]})")
    return 0


VERB = {"drain": "drained", "disable": "disabled", "enable": "enabled"}


def run(args: argparse.Namespace) -> int:
    # The worker's modules load only to run one: `list` and the rest stay light.
    from service.worker import credential, environment, hardening, jobusers  # noqa: PLC0415
    from service.worker import main as worker_main  # noqa: PLC0415

    worker_home = (args.home or home()).expanduser().absolute()
    given_as = "BERTH_TOKEN" if os.environ.get("BERTH_TOKEN", "").strip() else "BERTH_JOIN_TOKEN"
    given = os.environ.get(given_as, "").strip()
    try:
        # A stored credential and a different one given is an error naming both, never a
        # silent choice: a second worker on this host must not attach as the first.
        token, origin = credential.choose(worker_home, given, given_as=given_as)
    except credential.Disagree as exc:
        raise CliError(str(exc)) from None
    if not token:
        raise CliError(
            "no credential: set BERTH_TOKEN (berth token create NAME --kind worker, or a join "
            "token from berth worker join-token --pool POOL)",
            Exit.REFUSED,
        )
    # A join token, or the credential one was traded for, binds the pool: the server knows it.
    bound = credential.load(worker_home) is not None or token.startswith(credential.JOIN_PREFIX)
    if not args.pool and not bound:
        raise CliError("--pool is required to run a worker")
    if args.orphan_exit_seconds < 0:
        raise CliError("--orphan-exit-seconds must be >= 0")
    server, _ = server_url(args.server)
    if args.parallel < 0:
        raise CliError("--parallel must be >= 0")
    python = args.python or jobusers.job_python(sys.executable)
    if not Path(python).exists():
        raise CliError(f"--python {python}: no such interpreter")
    try:
        pass_env = environment.check_pass_env(args.pass_env)
    except environment.BadPassEnv as exc:
        raise CliError(str(exc)) from None
    uid_range = _uid_range(args.uid_range)
    if args.run_as:
        try:
            pwd.getpwnam(args.run_as)
        except KeyError:
            raise CliError(f"--run-as {args.run_as}: no such user") from None
    labels = tuple(_labels(args.labels))
    cpus, memory_mb, gpus = _capacity(args)
    stdlog.configure(args.log_level, json_lines=log_json(args))
    worker_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    worker_home.chmod(0o700)  # its credential and state: the worker's alone
    opts = worker_main.Options(
        server=server,
        token=token,
        pool=args.pool,
        home=worker_home,
        labels=labels,
        parallel=args.parallel,
        python=python,
        name=args.worker_name or "",
        pass_env=pass_env,
        uid_range=uid_range,
        run_as=args.run_as,
        work_dir=args.work_dir,
        orphan_exit_seconds=args.orphan_exit_seconds,
        allow_local_repos=args.allow_local_repos,
        cas=_own_cas(),
        origin=origin,
        cpus=cpus,
        memory_mb=memory_mb,
        gpus=gpus,
    )
    # Jobs may run as this user: they must not read this process's environment (its token).
    hardening.undumpable()
    try:
        return asyncio.run(worker_main.run(opts))
    except KeyboardInterrupt:
        return Exit.INTERRUPTED


def join_token(args: argparse.Namespace) -> int:
    """A one-time join token, and the command that runs the node with it."""
    if not args.pool:
        raise CliError("berth worker join-token --pool POOL: which pool will the node serve?")
    try:
        expires = durations.seconds(args.expires)
    except ValueError as exc:
        raise CliError(f"--expires: {exc}") from None
    client = Client(args.server)
    labels = _labels(args.labels)
    body: dict[str, Any] = {
        "pool": args.pool,
        "labels": labels,
        "tenants": args.tenants,
        "expires_seconds": expires,
    }
    if args.worker_name:
        body["name"] = args.worker_name
    out = client.call("POST", "/api/v1/workers/join-tokens", body)
    if args.json:
        print_json(out)
        return 0
    print(out["token"])
    print(
        f"node {out['name']} (pool {out['pool']}); on it, within {args.expires}:\n"
        f"  {out['command']}",
        file=sys.stderr,
    )
    return 0


def _own_cas() -> "Cas | None":
    """The worker's own `[cas]`, when its berth.toml has one (its id must be the server's).

    None: it uses the store the server hands out in its welcome.
    """
    from service import config  # noqa: PLC0415

    try:
        cas = config.load_cas()
    except BerthError as exc:
        raise CliError(exc.message) from None
    return cas if cas != config.Cas() else None


def _uid_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    if not (sep and lo.isdigit() and hi.isdigit()) or not 0 < int(lo) <= int(hi) < 2**31:
        raise CliError(f"--uid-range {text!r} must be A-B with 0 < A <= B (e.g. 61000-61999)")
    return int(lo), int(hi)


def _capacity(args: argparse.Namespace) -> tuple[float | None, int | None, int | None]:
    """--cpus, --memory, --gpus checked (None: the host's)."""
    try:
        cpus = None if args.cpus is None else resources.check_cpus(args.cpus, what="--cpus")
        memory = None if args.memory is None else resources.parse_size(args.memory)
        gpus = None if args.gpus is None else resources.check_gpus(args.gpus, what="--gpus")
    except resources.BadSize as exc:
        raise CliError(str(exc).replace("memory ", "--memory ", 1)) from None
    return cpus, memory, gpus


def _gb(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}G"


def list_workers(args: argparse.Namespace) -> int:
    workers = Client(args.server).call("GET", "/api/v1/workers")
    rows = []
    for w in workers:
        load = "-" if w["load"] is None else f"{w['load']:.1f}/{w['cpus']}"
        slots = " ".join(f"{k}:{v['used']}/{v['total']}" for k, v in w["slots"].items()) or "-"
        rows.append(
            [
                w["name"],
                w["pool"],
                w["state"],
                f"{w['seen_seconds_ago']:.0f}s ago",
                load,
                _gb(w["free_memory_gb"]),
                _gb(w["free_disk_gb"]),
                slots,
                _offers(w),
                _gpus(w),
                ",".join(w["labels"]) or "-",
                w["no_lease"],
            ]
        )
    header = [
        "NAME",
        "POOL",
        "STATE",
        "SEEN",
        "LOAD",
        "MEM",
        "DISK",
        "SLOTS",
        "FREE/OFFERS",
        "GPUS",
        "LABELS",
        "NO LEASE",
    ]
    return listing(args, workers, rows, header)


def _offers(w: dict[str, Any]) -> str:
    """What is left of what it offers: "1/3 cpu 2G/8G 1/2 gpu"."""
    cap, used = w.get("capacity") or {}, w.get("reserved") or {}
    if not any(cap.values()):
        return "-"
    cpus = f"{resources.shown_cpus(cap['cpus'] - used.get('cpus', 0))}/{cap['cpus']:g} cpu"
    mem = resources.shown_memory(cap["memory_mb"] - used.get("memory_mb", 0)).replace(" ", "")
    gpus = f" {cap['gpus'] - used.get('gpus', 0)}/{cap['gpus']} gpu" if cap["gpus"] else ""
    return f"{cpus} {mem}/{resources.shown_memory(cap['memory_mb']).replace(' ', '')}{gpus}"


def _gpus(w: dict[str, Any]) -> str:
    """Its GPUs as NVML reported them: "0:A100 12%,1:A100 0%"."""
    devices = w.get("devices") or []
    return ",".join(f"{d['index']}:{d['name']} {d['utilization']}%" for d in devices) or "-"


def _labels(given: str) -> list[str]:
    """`--labels a,b`: sorted, without blanks or repeats."""
    return sorted({x.strip() for x in given.split(",") if x.strip()})
