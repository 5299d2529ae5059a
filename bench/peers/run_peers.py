"""Run every peer and ceiling measurement ``--runs`` times and print the medians as JSON lines.

Standard library only, any Python 3.11: each measurement runs in its own venv (created or reused
by ``setup.py``) as a subprocess in its own process group, with a hard timeout after which the
whole group is killed. A measurement is a script whose last stdout line is one JSON object (see
``bench/PEERS.md``); the berth half of the suite can add its own entries to :func:`plan` or run
its scripts under the same contract.

Runs are interleaved (run 1 of everything, then run 2, ...) so slow drift on the machine spreads
over all systems instead of penalising whichever ran last. Raw results go to
``bench/results/peers-<timestamp>.jsonl``; the summary lines (one per measurement, numeric fields
replaced by their median over successful runs) go to stdout and to ``--out`` if given.

``--quick`` is the CI smoke: 2 s of dispatch, 500-job drains, short HTTP runs, one run each.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR / "peers"))

import benchlib  # noqa: E402
import setup  # noqa: E402

PEERS = ("procrastinate", "pgqueuer", "celery")
HTTP_SERVERS = ("uvicorn", "uvicorn-h11", "granian")
# Above every script's own hard timeout (115 s), so the script normally reports its own failure.
KILL_AFTER_S = 150.0


@dataclass(frozen=True)
class Measurement:
    name: str  # unique key, e.g. "pgqueuer/drain"
    venv: str
    argv: list[str]  # script path and its arguments


def plan(quick: bool) -> list[Measurement]:
    peers_dir = BENCH_DIR / "peers"
    ceilings_dir = BENCH_DIR / "ceilings"
    dispatch = ["--seconds", "2"] if quick else ["--seconds", "20"]
    drain = ["--jobs", "500"] if quick else ["--jobs", "20000"]
    claim = ["--jobs", "2000"] if quick else ["--jobs", "20000"]
    hello = ["--seconds", "1"] if quick else ["--seconds", "10"]
    out: list[Measurement] = []
    for peer in PEERS:
        script = str(peers_dir / f"{peer}_bench.py")
        out.append(
            Measurement(
                f"{peer}/dispatch",
                peer,
                [script, "--scenario", "dispatch", "--rate", "50", *dispatch],
            )
        )
        out.append(Measurement(f"{peer}/drain", peer, [script, "--scenario", "drain", *drain]))
    out.extend(
        Measurement(
            f"ceiling/claim-batch{batch}",
            "ceilings",
            [str(ceilings_dir / "claim_loop.py"), "--batch", batch, *claim],
        )
        for batch in ("1", "50")
    )
    out.extend(
        Measurement(
            f"ceiling/hello-{server}",
            "ceilings",
            [str(ceilings_dir / "hello_bench.py"), "--server", server, *hello],
        )
        for server in HTTP_SERVERS
    )
    return out


def run_interleaved(
    measurements: list[Any],
    runs: int,
    run_one: Callable[[Any], dict[str, Any]],
    *,
    prefix: str,
) -> tuple[dict[str, list[dict[str, Any]]], Path]:
    """Run 1 of each measurement, then run 2, ...; each result also to results/<prefix>-*.jsonl."""
    results_dir = BENCH_DIR / "results"
    results_dir.mkdir(exist_ok=True)
    raw_path = results_dir / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    raw: dict[str, list[dict[str, Any]]] = {m.name: [] for m in measurements}
    try:
        with raw_path.open("w") as raw_file:
            for run in range(runs):
                for m in measurements:
                    result = run_one(m)
                    raw[m.name].append(result)
                    line = {"measurement": m.name, "run": run + 1, **result}
                    raw_file.write(json.dumps(line) + "\n")
                    raw_file.flush()
                    print(json.dumps(line), file=sys.stderr, flush=True)
    finally:
        benchlib.stop_all()
    return raw, raw_path


def run_one(m: Measurement) -> dict[str, Any]:
    """Run one measurement; always return a dict (with ``error`` on any failure)."""
    cmd = [str(setup.venv_python(m.venv)), *m.argv]
    proc = benchlib.spawn(cmd, capture=True)
    started = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        benchlib.stop(proc, grace=2.0)
        return {"error": f"killed after {KILL_AFTER_S:.0f} s"}
    finally:
        benchlib.stop(proc, grace=2.0)
    text = out.decode(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = " | ".join(lines[-5:])
        return {"error": f"exit {proc.returncode}, no JSON result line: {tail[-400:]}"}
    result["wall_s"] = round(time.monotonic() - started, 2)
    return result


def summarise(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of each numeric field over the runs without an error; keep the rest from run 1."""
    good = [r for r in runs if "error" not in r]
    summary: dict[str, Any] = {"measurement": name, "runs": len(runs), "ok": len(good)}
    if good:
        for key, value in good[0].items():
            numbers = [
                r[key]
                for r in good
                if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)
            ]
            if isinstance(value, int | float) and not isinstance(value, bool) and numbers:
                summary[key] = round(statistics.median(numbers), 3)
            else:
                summary[key] = value
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        summary["errors"] = errors
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="CI smoke: short scenarios, one run")
    p.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="substrings of measurement names to keep, e.g. drain pgqueuer",
    )
    p.add_argument("--skip-setup", action="store_true", help="assume the venvs exist")
    p.add_argument("--out", type=Path, default=None, help="also write the summary lines here")
    args = p.parse_args(argv)
    runs = 1 if args.quick else args.runs

    measurements = plan(args.quick)
    if args.only:
        measurements = [m for m in measurements if any(s in m.name for s in args.only)]

    # A signal to the runner must take the children's process groups down with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not args.skip_setup:
        for venv in sorted({m.venv for m in measurements}):
            versions = setup.ensure_venv(venv)
            print(json.dumps({"venv": venv, "versions": versions}), flush=True)
    if any(m.venv == "celery" for m in measurements):
        benchlib.ensure_redis()

    raw, raw_path = run_interleaved(measurements, runs, run_one, prefix="peers")

    summaries = [summarise(m.name, raw[m.name]) for m in measurements]
    lines = [json.dumps(s) for s in summaries]
    print("\n".join(lines), flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    print(f"raw results: {os.path.relpath(raw_path)}", file=sys.stderr)
    return 0 if all(s["ok"] == s["runs"] for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
