"""berth's side of the benchmark: one scenario per run, one JSON object as the last stdout line.

This is the command line; each scenario lives in a module of ``bench/berth/scenarios/`` (what
several share in ``scenarios/shared.py``), the server and process plumbing in ``common.py``.

Runs with the project's interpreter (berth installed, server extra included). Every scenario
starts its own ``berth serve`` (no built-in worker) on a fresh, migrated database
``bench_berth_<scenario>``, on loopback, and stops everything it started on exit, on SIGTERM and
on the hard timeout (``--timeout``, default 115 s), as the peers' scripts do.

Scenarios (see ``bench/README.md``):

* ``dispatch``: simulated workers attached to an idle queue; jobs submitted open-loop at
  ``--rate`` for ``--seconds`` through ``POST /api/v1/jobs``; submit -> lease received;
* ``dispatch-real``: the same against a real ``berth worker``; submit -> job process started;
* ``drain``: ``--jobs`` queued (batched submit), then ``--workers`` simulated workers with
  ``--slots`` slots each drain them; jobs/s;
* ``submit``: one job per request (``--concurrency`` keep-alive connections, wrk when installed)
  and batches of ``--batch``; jobs/s;
* ``real``: ``true`` on two real ``berth worker`` processes; jobs/s;
* ``fleet``: ``--workers`` simulated workers attached at once, heartbeating every
  ``--heartbeat`` s; ack p99, server CPU and memory per worker over ``--window`` s;
* ``failover``: kill -9 of a real worker holding a job: seconds until the job starts again,
  for a restarted worker (fast path) and a silent one (the configured window).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from common import benchlib
from scenarios import dispatch, drain, failover, fleet, real, shared, submit

# Read by tests/bench/test_bench_smoke.py (as a literal: it parses, not imports, this file).
SCENARIOS = ("dispatch", "dispatch-real", "drain", "submit", "real", "fleet", "failover")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="berth benchmark scenarios")
    p.add_argument("--scenario", choices=SCENARIOS, required=True)
    p.add_argument("--seconds", type=float, default=20.0, help="dispatch/submit window")
    p.add_argument("--rate", type=float, default=50.0, help="dispatch: jobs per second")
    p.add_argument("--jobs", type=int, default=None, help="drain 20000, real 500, submit 20000")
    p.add_argument("--workers", type=int, default=None, help="simulated or real workers")
    p.add_argument("--slots", type=int, default=None, help="slots per worker")
    p.add_argument("--no-analyze", action="store_true", help="drain: skip ANALYZE")
    p.add_argument("--concurrency", type=int, default=16, help="submit: connections")
    p.add_argument("--batch", type=int, default=500, help="submit: jobs per batch")
    p.add_argument("--batch-concurrency", type=int, default=2)
    p.add_argument("--python-client", action="store_true", help="submit: httpx, not wrk")
    p.add_argument("--heartbeat", type=float, default=None, help="fleet 10, failover 1")
    p.add_argument("--window", type=float, default=20.0, help="fleet: measured seconds")
    p.add_argument("--connect-concurrency", type=int, default=100)
    p.add_argument("--no-compression", action="store_true", help="fleet: sims without deflate")
    p.add_argument("--unreachable", type=float, default=2.0)
    p.add_argument("--evict", type=float, default=3.0)
    p.add_argument("--loop", type=float, default=0.25, help="failover: leader loop cadence")
    p.add_argument("--timeout", type=float, default=115.0, help="hard limit, seconds")
    p.add_argument("--processes", type=int, default=1, help="berth serve --processes N")
    return p


DEFAULTS: dict[str, dict[str, Any]] = {
    "dispatch": {"workers": 2, "slots": 4},
    "dispatch-real": {"workers": 1, "slots": 4},
    "drain": {"jobs": 20_000, "workers": 4, "slots": 64},
    "submit": {"jobs": 20_000, "workers": 0, "slots": 1, "seconds": 10.0},
    "real": {"jobs": 500, "workers": 2, "slots": 4},
    "fleet": {"workers": 1000, "heartbeat": 10.0, "slots": 1},
    "failover": {"heartbeat": 1.0, "workers": 3, "slots": 1},
}


def main(argv: list[str] | None = None) -> int:
    raw = argv if argv is not None else sys.argv[1:]
    args = parser().parse_args(raw)
    for key, value in DEFAULTS[args.scenario].items():
        if getattr(args, key) is None or (key == "seconds" and "--seconds" not in raw):
            setattr(args, key, value)
    started_at = time.monotonic()
    common.PROCESSES = args.processes
    stub = shared.stub(args)
    benchlib.install_guards(args.timeout, stub)
    os.environ.setdefault("TMPDIR", tempfile.gettempdir())

    def go() -> int:
        match args.scenario:
            case "dispatch":
                result = dispatch.run(args)
            case "dispatch-real":
                result = dispatch.run_real(args)
            case "drain":
                result = drain.run(args, started_at)
            case "submit":
                result = submit.run(args)
            case "real":
                result = real.run(args)
            case "fleet":
                result = fleet.run(args, started_at)
            case _:
                result = failover.run(args)
        benchlib.emit(result)
        return 1 if "error" in result else 0

    return benchlib.main_guard(go, stub)


if __name__ == "__main__":
    sys.exit(main())
