"""Jobs that leave their own start/tick/end records, and checks over those records.

A job's copy writes `start`, a `tick` every 50 ms and `end` to `<dir>/<job>.<epoch>`, each with
a wall-clock time. A killed copy's last tick is within 50 ms of its death, so two copies of one
job overlap exactly when one starts before the other's last record.
"""

import itertools
from dataclasses import dataclass
from pathlib import Path

TICK = 0.05


def script(marks: Path, seconds: float) -> list[str]:
    ticks = max(1, int(seconds / TICK))
    body = (
        f'f="{marks}/$BERTH_JOB_ID.$BERTH_ATTEMPT"; echo "start $(date +%s.%N)" >> "$f"; '
        f'i=0; while [ $i -lt {ticks} ]; do echo "tick $(date +%s.%N)" >> "$f"; '
        f'sleep {TICK}; i=$((i+1)); done; echo "end $(date +%s.%N)" >> "$f"'
    )
    return ["sh", "-c", body]


@dataclass(frozen=True)
class Copy:
    job: int
    epoch: int
    start: float
    last: float
    ended: bool


def copies(marks: Path) -> dict[int, list[Copy]]:
    out: dict[int, list[Copy]] = {}
    for path in marks.iterdir():
        job, epoch = (int(x) for x in path.name.split("."))
        times = []
        ended = False
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                times.append(float(parts[1]))
                ended = ended or parts[0] == "end"
        if times:
            out.setdefault(job, []).append(Copy(job, epoch, times[0], max(times), ended))
    for runs in out.values():
        runs.sort(key=lambda c: c.start)
    return out


def overlaps(marks: Path) -> list[tuple[Copy, Copy]]:
    """Pairs of copies of one job that ran at the same time."""
    bad = []
    for runs in copies(marks).values():
        for a, b in itertools.pairwise(runs):
            if b.start <= a.last:
                bad.append((a, b))
    return bad
