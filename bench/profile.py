"""Profile berth's server under one benchmark scenario with py-spy; save a flame graph.

    python bench/profile.py                       # drain of 20,000 jobs
    python bench/profile.py --scenario fleet --workers 5000
    python bench/profile.py --scenario submit     # or dispatch
    python bench/profile.py --scenario drain -- --jobs 5000 --workers 8   # extra scenario args

Needs py-spy (a sampling profiler, https://github.com/benfred/py-spy): when it is not next to
this interpreter or on PATH, this script installs it with ``pip install py-spy`` into the
interpreter running it. Attaching to another process needs ptrace rights (root, or
``kernel.yama.ptrace_scope=0``).

The scenario (``bench/berth/berth_bench.py``) runs as usual; with ``BENCH_PROFILE_DIR`` set it
attaches ``py-spy record --pid <server> --format raw`` for exactly its measured phase (not the
set-up). py-spy skips idle samples, so the profile is where the server's CPU goes. This script
then writes, under ``--out`` (default ``bench/results``):

* ``flame-<scenario>.svg``: a flame graph (hover a frame for its samples);
* ``flame-<scenario>.collapsed.txt``: the raw stacks (flamegraph.pl / speedscope input);
* ``profile-<scenario>.txt``: the scenario's result and the top functions by own and by total
  samples, also printed.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import html
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
SCENARIO_ARGS = {
    "drain": ["--jobs", "20000"],
    "fleet": ["--workers", "5000", "--window", "20"],
    "submit": ["--seconds", "10", "--jobs", "10000"],
    "dispatch": ["--seconds", "20"],
}


def ensure_py_spy() -> str:
    local = Path(sys.executable).parent / "py-spy"
    if local.exists():
        return str(local)
    found = shutil.which("py-spy")
    if found:
        return found
    print("installing py-spy with pip ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "py-spy"], check=True)
    if local.exists():
        return str(local)
    found = shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy was installed but cannot be found")
    return found


def short(frame: str) -> str:
    """``func (path/to/module.py:123)`` -> ``func (module.py)``: aggregate over lines."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    tail = "/".join(parts[-2:]) if parts else path
    return f"{name} ({tail})" if where else name


# Leaves that are waits py-spy cannot tell from work (a C call that released the GIL): an idle
# thread-pool thread blocked in its queue, the event loop blocked in epoll.
IDLE_LEAVES = ("_worker (concurrent/futures/thread.py:81)", "EpollSelector.select (selectors.py")


def read_stacks(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = stack.split(";")
            if not frames[-1].startswith(IDLE_LEAVES):
                stacks.append((frames, int(count)))
    return stacks


def top(stacks: list[tuple[list[str], int]], n: int = 25) -> str:
    total = sum(c for _, c in stacks) or 1
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        names = [short(f) for f in frames]
        own[names[-1]] += count
        for name in set(names):
            incl[name] += count
    lines = [f"{total} samples"]
    lines.append(f"\ntop {n} by own samples (where the CPU is):")
    lines += [f"{100 * c / total:6.1f}%  {name}" for name, c in own.most_common(n)]
    lines.append(f"\ntop {n} by total samples (own + callees):")
    lines += [f"{100 * c / total:6.1f}%  {name}" for name, c in incl.most_common(n)]
    return "\n".join(lines)


def flame_svg(stacks: list[tuple[list[str], int]], title: str, width: int = 1400) -> str:
    """A minimal flame graph: root at the bottom, one row per stack depth."""
    tree = _Node()
    for frames, count in stacks:
        node = tree
        node.n += count
        for f in frames:
            node = node.kids.setdefault(f, _Node())
            node.n += count
    total = tree.n or 1
    boxes: list[tuple[str, int, float, int, float]] = []  # name, samples, x, depth, width

    def walk(node: _Node, x: float, depth: int) -> None:
        for name, kid in sorted(node.kids.items()):
            w = width * kid.n / total
            if w >= 0.3:
                boxes.append((name, kid.n, x, depth, w))
                walk(kid, x, depth + 1)
            x += w

    walk(tree, 0.0, 0)
    row = 16
    depth_max = max((b[3] for b in boxes), default=0)
    height = (depth_max + 1) * row + 30
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            'font-family="monospace" font-size="11">'
        ),
        '<rect width="100%" height="100%" fill="#fff"/>',
        f'<text x="4" y="16" font-size="14">{html.escape(title)} ({total} samples)</text>',
    ]
    for name, n, x, depth, w in boxes:
        y = height - (depth + 1) * row
        hue = int(hashlib.md5(short(name).encode()).hexdigest()[:4], 16) % 60
        label = html.escape(short(name)[: max(0, int(w / 7))]) if w > 30 else ""
        tip = html.escape(f"{name} ({n} samples, {100 * n / total:.2f}%)")
        parts.append(
            f'<g><title>{tip}</title><rect x="{x:.2f}" y="{y}" width="{w:.2f}" '
            f'height="{row - 1}" fill="hsl({hue},80%,60%)"/>'
            f'<text x="{x + 2:.2f}" y="{y + row - 4}">{label}</text></g>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


class _Node:
    __slots__ = ("kids", "n")

    def __init__(self) -> None:
        self.n = 0
        self.kids: dict[str, _Node] = {}


def main() -> int:
    p = argparse.ArgumentParser(description="run a berth scenario under py-spy")
    p.add_argument("--scenario", choices=sorted(SCENARIO_ARGS), default="drain")
    p.add_argument("--workers", type=int, default=None, help="fleet: simulated workers")
    p.add_argument("--out", type=Path, default=BENCH_DIR / "results")
    p.add_argument("extra", nargs="*", help="more berth_bench.py arguments (after --)")
    args = p.parse_args()
    py_spy = ensure_py_spy()
    args.out.mkdir(parents=True, exist_ok=True)
    scenario_args = list(SCENARIO_ARGS[args.scenario])
    if args.workers is not None:
        scenario_args += ["--workers", str(args.workers)]
    tmp = Path(tempfile.mkdtemp(prefix="berth-profile-"))
    env = {"BENCH_PROFILE_DIR": str(tmp), "PATH": f"{Path(py_spy).parent}:{_path()}"}
    cmd = [
        sys.executable,
        str(BENCH_DIR / "berth" / "berth_bench.py"),
        "--scenario",
        args.scenario,
        *scenario_args,
        *args.extra,
    ]
    print("running:", " ".join(cmd), file=sys.stderr)
    proc = subprocess.run(
        cmd, env={**_environ(), **env}, capture_output=True, text=True, timeout=200, check=False
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    result = lines[-1] if lines else json.dumps({"error": proc.stderr[-500:]})
    collapsed = sorted(tmp.glob("*.collapsed.txt"))
    if not collapsed:
        print(result)
        print(f"py-spy wrote nothing; see {tmp}", file=sys.stderr)
        return 1
    raw = args.out / f"flame-{args.scenario}.collapsed.txt"
    shutil.copyfile(collapsed[0], raw)
    stacks = read_stacks(raw)
    svg = args.out / f"flame-{args.scenario}.svg"
    svg.write_text(flame_svg(stacks, f"berth serve, scenario {args.scenario}"))
    report = f"scenario result: {result}\n\n{top(stacks)}\n"
    (args.out / f"profile-{args.scenario}.txt").write_text(report)
    shutil.rmtree(tmp, ignore_errors=True)
    print(report)
    print(f"flame graph: {svg}", file=sys.stderr)
    return 0


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


def _path() -> str:
    import os

    return os.environ.get("PATH", "")


if __name__ == "__main__":
    sys.exit(main())
