"""The benchmark in one command: berth, its peers and the ceilings, side by side, in one run.

    python bench/run.py                 # full: every measurement, 3 interleaved runs, medians
    python bench/run.py --runs 5
    python bench/run.py --quick         # CI smoke: tiny sizes, one run (about a minute or two)
    python bench/run.py --only berth/   # substrings of measurement names
    python bench/run.py --no-peers      # berth alone (no peer venvs needed)

Run it with the interpreter berth is installed in (``pip install -e '.[server]'``): berth's
scenarios (``bench/berth/berth_bench.py``) run under it, each peer and the ceilings in their own
venv under ``bench/.venvs`` (created on first use by ``bench/peers/setup.py``). Every
measurement is a subprocess in its own process group with a hard timeout whose last stdout line
is one JSON object (``bench/PEERS.md``). Runs are interleaved (run 1 of everything, then run 2)
so drift spreads over all systems; numeric fields are medians over the runs without an error.

Prints one table, with ratios against the best peer measured in the same run, and writes it to
``bench/RESULTS.md`` with the machine, the versions, the date and the exact command. Raw runs go
to ``bench/results/run-<timestamp>.jsonl``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR / "peers"))

import benchlib  # noqa: E402
import run_peers  # noqa: E402
import setup  # noqa: E402
from run_peers import Measurement  # noqa: E402

BERTH = "berth"  # "venv" of berth's measurements: this interpreter
KILL_AFTER_S = 150.0
FLEET_SIZES = (1000, 5000, 10000)
PEERS = run_peers.PEERS
BERTH_PACKAGES = (
    "berth",
    "litestar",
    "uvicorn",
    "sqlalchemy",
    "asyncpg",
    "websockets",
    "msgspec",
    "httpx",
)


def berth_plan(quick: bool) -> list[Measurement]:
    script = str(BENCH_DIR / "berth" / "berth_bench.py")

    def m(name: str, *argv: str) -> Measurement:
        return Measurement(f"berth/{name}", BERTH, [script, *argv])

    if quick:
        return [
            m("dispatch", "--scenario", "dispatch", "--seconds", "2"),
            m("dispatch-real", "--scenario", "dispatch-real", "--seconds", "2", "--rate", "20"),
            m("drain", "--scenario", "drain", "--jobs", "500"),
            m("submit", "--scenario", "submit", "--seconds", "1", "--jobs", "1000"),
            m("real", "--scenario", "real", "--jobs", "50"),
            m(
                "fleet-100",
                "--scenario",
                "fleet",
                "--workers",
                "100",
                "--heartbeat",
                "1",
                "--window",
                "3",
            ),
            m("failover", "--scenario", "failover"),
        ]
    out = [
        m("dispatch", "--scenario", "dispatch", "--seconds", "20"),
        # 20 jobs/s, not the peers' 50: one real worker with 4 slots starts about 27 jobs/s
        # (each job is a process of its own uid, namespaces and cleanup; see `real`), so at 50/s
        # the figure would be the length of a queue, not the time to reach a worker.
        m("dispatch-real", "--scenario", "dispatch-real", "--seconds", "20", "--rate", "20"),
        m("drain", "--scenario", "drain", "--jobs", "20000"),
        m("submit", "--scenario", "submit", "--seconds", "10", "--jobs", "20000"),
        m("real", "--scenario", "real", "--jobs", "500"),
    ]
    out += [
        m(f"fleet-{n}", "--scenario", "fleet", "--workers", str(n), "--window", "20")
        for n in FLEET_SIZES
    ]
    out.append(m("failover", "--scenario", "failover"))
    # `berth serve --processes N`, one server process per core (the fleet's CPU and memory
    # figures are one process's, so it stays on one)
    cores = str(os.cpu_count() or 1)
    out += [
        m(f"dispatch-{cores}p", "--scenario", "dispatch", "--seconds", "20", "--processes", cores),
        m(f"drain-{cores}p", "--scenario", "drain", "--jobs", "20000", "--processes", cores),
        m(
            f"submit-{cores}p",
            "--scenario",
            "submit",
            "--seconds",
            "10",
            "--jobs",
            "20000",
            "--processes",
            cores,
        ),
    ]
    return out


def run_one(m: Measurement) -> dict[str, Any]:
    """Run one measurement; always a dict (with ``error`` on any failure)."""
    python = sys.executable if m.venv == BERTH else str(setup.venv_python(m.venv))
    proc = benchlib.spawn([python, *m.argv], capture=True)
    started = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        benchlib.stop(proc, grace=2.0)
        return {"error": f"killed after {KILL_AFTER_S:.0f} s"}
    finally:
        benchlib.stop(proc, grace=2.0)
    lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = " | ".join(lines[-5:])
        return {"error": f"exit {proc.returncode}, no JSON result line: {tail[-400:]}"}
    result["wall_s"] = round(time.monotonic() - started, 2)
    return result


# ---------------------------------------------------------------------------------------------
# The table


def _num(s: dict[str, Any] | None, key: str) -> float | None:
    if not s or not s.get("ok"):
        return None
    v = s.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _fmt(v: float | None, digits: int = 1) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "-"
    return f"{a / b:.2f}x"


def _best(summaries: dict[str, dict[str, Any]], scenario: str, key: str, *, low: bool) -> Any:
    found = [
        (v, peer)
        for peer in PEERS
        if (v := _num(summaries.get(f"{peer}/{scenario}"), key)) is not None
    ]
    if not found:
        return None, "-"
    return min(found) if low else max(found)


def table(summaries: dict[str, dict[str, Any]]) -> str:
    """Markdown table: berth's medians, the best peer's, the ratio, and the issue's target."""
    s = summaries.get
    rows: list[tuple[str, str, str, str, str]] = []

    best50, peer50 = _best(summaries, "dispatch", "p50_ms", low=True)
    best99, peer99 = _best(summaries, "dispatch", "p99_ms", low=True)
    for q, best, peer in (("p50", best50, peer50), ("p99", best99, peer99)):
        b = _num(s("berth/dispatch"), f"{q}_ms")
        rows.append(
            (
                f"dispatch {q} ms: submit → lease received (simulated worker)",
                _fmt(b),
                f"{_fmt(best)} ({peer})",
                _ratio(b, best),
                f"≤ best peer ({q})",
            )
        )
        b = _num(s("berth/dispatch-real"), f"{q}_ms")
        rows.append(
            (
                f"dispatch {q} ms: submit → process started (real worker)",
                _fmt(b),
                f"{_fmt(best)} ({peer})",
                _ratio(b, best),
                "≤ 2x best peer's task started" if q == "p50" else "",
            )
        )
    best, peer = _best(summaries, "drain", "jobs_per_s", low=False)
    b = _num(s("berth/drain"), "jobs_per_s")
    rows.append(
        ("drain jobs/s (control plane)", _fmt(b), f"{_fmt(best)} ({peer})", _ratio(b, best), "2x")
    )
    for batch in ("50", "1"):
        ceiling = _num(s(f"ceiling/claim-batch{batch}"), "jobs_per_s")
        rows.append(
            (
                f"drain vs claim ceiling, {batch} row(s)/statement",
                _fmt(b),
                f"{_fmt(ceiling)} (ceiling)",
                _ratio(b, ceiling),
                "",
            )
        )
    enq, enq_peer = _best(summaries, "drain", "enqueue_jobs_per_s", low=False)
    single = _num(s("berth/submit"), "single_jobs_per_s")
    hello = max(
        (
            v
            for name in run_peers.HTTP_SERVERS
            if (v := _num(s(f"ceiling/hello-{name}"), "req_per_s"))
        ),
        default=None,
    )
    rows.append(
        (
            "submit jobs/s, one per request",
            _fmt(single),
            f"{_fmt(hello)} (hello-world req/s ceiling)",
            _ratio(single, hello),
            "2,500",
        )
    )
    batch_rate = _num(s("berth/submit"), "batch_jobs_per_s")
    rows.append(
        (
            "submit jobs/s, batches of 500",
            _fmt(batch_rate),
            f"{_fmt(enq)} ({enq_peer} bulk enqueue)",
            _ratio(batch_rate, enq),
            "20,000",
        )
    )
    cores = os.cpu_count() or 1
    for key, label, name in (
        ("p50_ms", "dispatch p50 ms", "dispatch"),
        ("p99_ms", "dispatch p99 ms", "dispatch"),
        ("jobs_per_s", "drain jobs/s", "drain"),
        ("single_jobs_per_s", "submit jobs/s, one per request", "submit"),
        ("batch_jobs_per_s", "submit jobs/s, batches of 500", "submit"),
    ):
        if (f := s(f"berth/{name}-{cores}p")) is not None:
            one = _num(s(f"berth/{name}"), key)
            rows.append(
                (
                    f"{label}, `serve --processes {cores}`",
                    _fmt(_num(f, key)),
                    f"{_fmt(one)} (1 process)",
                    _ratio(_num(f, key), one),
                    "",
                )
            )
    rows.append(
        (
            "real jobs/s (`true` on 2 real workers)",
            _fmt(_num(s("berth/real"), "jobs_per_s")),
            "-",
            "-",
            "",
        )
    )
    for name in sorted(
        (k for k in summaries if k.startswith("berth/fleet-")), key=lambda k: int(k.split("-")[-1])
    ):
        f = s(name)
        n = name.split("-")[-1]
        got = _num(f, "attached")
        if got is not None and got < int(n):
            n = f"{n} ({got:,.0f} attached)"
        rows.append(
            (f"fleet {n}: heartbeat ack p99 ms", _fmt(_num(f, "ack_p99_ms")), "-", "-", "< 50")
        )
        rows.append(
            (f"fleet {n}: server CPU, cores", _fmt(_num(f, "server_cpu_cores"), 2), "-", "-", "< 1")
        )
        rows.append(
            (f"fleet {n}: server KB per worker", _fmt(_num(f, "kb_per_worker")), "-", "-", "< 50")
        )
        rows.append((f"fleet {n}: attach all, s", _fmt(_num(f, "attach_s")), "-", "-", "< 20"))
    fo = s("berth/failover")
    rows.append(
        (
            "failover s, restarted worker (fast path)",
            _fmt(_num(fo, "fast_s"), 2),
            "-",
            "-",
            f"≤ {_fmt(_num(fo, 'fast_target_s'))}",
        )
    )
    rows.append(
        (
            "failover s, silent worker (window)",
            _fmt(_num(fo, "silent_s"), 2),
            "-",
            "-",
            f"≤ {_fmt(_num(fo, 'silent_target_s'))}",
        )
    )
    lines = [
        "| measurement | berth | compared with | ratio | target |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
    failed = [
        f"- `{k}`: {v.get('ok', 0)}/{v.get('runs', 0)} ok: {'; '.join(v.get('errors', []))[:300]}"
        for k, v in summaries.items()
        if v.get("ok") != v.get("runs")
    ]
    if failed:
        lines += ["", "Failed runs:", *failed]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The record


def machine() -> dict[str, str]:
    info = {"nproc": str(os.cpu_count()), "kernel": platform.release()}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory"] = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    try:
        info["postgres"] = benchlib.psql("postgres", "SHOW server_version", timeout=10)
    except (subprocess.SubprocessError, OSError):
        info["postgres"] = "unknown"
    info["python"] = platform.python_version()
    return info


def berth_versions() -> dict[str, str]:
    out = {}
    for name in BERTH_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    return out


def _recorded(venv: str) -> dict[str, str]:
    """The versions ``setup.py`` recorded in the venv when it built it."""
    with contextlib.suppress(OSError, ValueError):
        data = json.loads((setup.VENVS_DIR / venv / "versions.json").read_text())
        if isinstance(data, dict):
            return {str(k): str(v) for k, v in data.items()}
    return {}


def write_results(
    path: Path,
    *,
    command: str,
    runs: int,
    table_md: str,
    summaries: list[dict[str, Any]],
    versions: dict[str, dict[str, str]],
    raw_path: Path,
) -> None:
    m = machine()
    lines = [
        "# Benchmark results",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"- command: `{command}`",
        f"- runs: {runs} (interleaved; medians of the runs without an error)",
        (
            f"- machine: {m.get('nproc')} cores ({m.get('cpu', '?')}), {m.get('memory', '?')}, "
            f"Linux {m.get('kernel')}, Python {m.get('python')}"
        ),
        f"- Postgres {m.get('postgres')} on 127.0.0.1 (shared by every system, one at a time)",
        "- versions: "
        + "; ".join(
            f"{venv}: " + ", ".join(f"{k} {v}" for k, v in sorted(vs.items()))
            for venv, vs in sorted(versions.items())
        ),
        f"- raw runs: `{os.path.relpath(raw_path, BENCH_DIR.parent)}` (not committed)",
        "",
        "Ratios are berth ÷ the other column: below 1 is better for latencies, above 1 for rates.",
        "See `bench/README.md` for what each measurement does.",
        "",
        table_md,
        "",
        "## Medians per measurement",
        "",
        "```",
        *(json.dumps(s) for s in summaries),
        "```",
        "",
    ]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="CI smoke: tiny sizes, one run")
    p.add_argument("--only", nargs="*", default=None, help="substrings of measurement names")
    p.add_argument("--no-peers", action="store_true", help="berth's scenarios only")
    p.add_argument("--skip-setup", action="store_true", help="assume the peer venvs exist")
    p.add_argument(
        "--results",
        type=Path,
        default=None,
        help="default bench/RESULTS.md (--quick: bench/results/RESULTS-quick.md)",
    )
    args = p.parse_args(argv)
    if args.results is None:
        quick_path = BENCH_DIR / "results" / "RESULTS-quick.md"
        args.results = quick_path if args.quick else BENCH_DIR / "RESULTS.md"
        args.results.parent.mkdir(exist_ok=True)
    runs = 1 if args.quick else args.runs
    command = shlex.join(["python", os.path.relpath(__file__), *(argv or sys.argv[1:])])

    measurements = [] if args.no_peers else run_peers.plan(args.quick)
    measurements += berth_plan(args.quick)
    if args.only:
        measurements = [m for m in measurements if any(x in m.name for x in args.only)]

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    versions: dict[str, dict[str, str]] = {BERTH: berth_versions()}
    for venv in sorted({m.venv for m in measurements} - {BERTH}):
        versions[venv] = setup.ensure_venv(venv) if not args.skip_setup else _recorded(venv)
        print(json.dumps({"venv": venv, "versions": versions[venv]}), file=sys.stderr)
    if any(m.venv == "celery" for m in measurements):
        benchlib.ensure_redis()

    raw, raw_path = run_peers.run_interleaved(measurements, runs, run_one, prefix="run")

    summaries = [run_peers.summarise(m.name, raw[m.name]) for m in measurements]
    by_name = {s["measurement"]: s for s in summaries}
    table_md = table(by_name)
    print(table_md, flush=True)
    write_results(
        args.results,
        command=command,
        runs=runs,
        table_md=table_md,
        summaries=summaries,
        versions=versions,
        raw_path=raw_path,
    )
    print(f"\nwritten: {os.path.relpath(args.results)}; raw: {os.path.relpath(raw_path)}")
    return 0 if all(s["ok"] == s["runs"] for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
