"""Per-job resources (SPEC section 4, "Resources"): requests, capacities, sizes as people write.

Pure, shared by the server (placement, submit), the CLI and the worker (enforcement). A request
of 0 reserves nothing. Memory is counted in MiB everywhere (`memory_mb`); sizes take K, M, G (and
T) as powers of 1024, a bare number meaning MiB.
"""

import math
import re
from dataclasses import dataclass

MAX_CPUS = 1_000_000.0
MAX_MEMORY_MB = 2**40  # a mebibyte count Postgres' bigint holds with room; ~1 EiB
MAX_GPUS = 4096
_SIZE = re.compile(r"\A\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*\Z", re.IGNORECASE)
_UNIT_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2}


class BadSize(ValueError):
    """A size that does not read as one; the message says how to write it."""


@dataclass(frozen=True, slots=True)
class Resources:
    """CPUs (fractional), memory in MiB, GPUs: a request, a capacity, or what is left of one."""

    cpus: float = 0.0
    memory_mb: int = 0
    gpus: int = 0

    def __bool__(self) -> bool:
        return self.cpus > 0 or self.memory_mb > 0 or self.gpus > 0

    def __add__(self, other: "Resources") -> "Resources":
        return Resources(
            self.cpus + other.cpus, self.memory_mb + other.memory_mb, self.gpus + other.gpus
        )

    def __sub__(self, other: "Resources") -> "Resources":
        return Resources(
            self.cpus - other.cpus, self.memory_mb - other.memory_mb, self.gpus - other.gpus
        )

    def short_of(self, want: "Resources") -> str | None:
        """The first resource `want` asks more of than this has: cpus, memory or gpus; else None.

        CPUs compare with a little slack, so that 0.1 + 0.2 fits in 0.3.
        """
        if want.cpus > 0 and want.cpus > self.cpus + 1e-9:
            return "cpus"
        if want.memory_mb > 0 and want.memory_mb > self.memory_mb:
            return "memory"
        if want.gpus > 0 and want.gpus > self.gpus:
            return "gpus"
        return None

    def as_dict(self) -> dict[str, float | int]:
        return {"cpus": self.cpus, "memory_mb": self.memory_mb, "gpus": self.gpus}


NOTHING = Resources()


def of(raw: object) -> Resources:
    """Resources from a mapping with cpus/memory_mb/gpus (a capacity column); {} is none."""
    if not isinstance(raw, dict):
        return Resources()
    return Resources(
        float(raw.get("cpus", 0) or 0),
        int(raw.get("memory_mb", 0) or 0),
        int(raw.get("gpus", 0) or 0),
    )


def parse_size(text: str | int) -> int:
    """A size (`512M`, `2G`, `1.5G`, `256`: MiB) in MiB, rounded up; BadSize when it is none."""
    if isinstance(text, int) and not isinstance(text, bool):
        if not 0 <= text <= MAX_MEMORY_MB:
            raise BadSize(f"memory {text} is out of range (0 to {MAX_MEMORY_MB} MiB)")
        return text
    m = _SIZE.match(str(text))
    if m is None:
        raise BadSize(
            f"memory {str(text)[:40]!r} is not a size: a number with K, M or G (powers of 1024), "
            "e.g. 512M or 2G; a bare number is MiB"
        )
    mb = math.ceil(float(m.group(1)) * _UNIT_MB[m.group(2).upper()])
    if mb > MAX_MEMORY_MB:
        raise BadSize(f"memory {text!r} is more than {MAX_MEMORY_MB} MiB")
    return mb


def check_cpus(x: float, *, what: str = "cpus") -> float:
    if not (math.isfinite(x) and 0 <= x <= MAX_CPUS):
        raise BadSize(f"{what} must be a finite number >= 0 (at most {MAX_CPUS:.0f}); got {x!r}")
    return float(x)


def check_gpus(n: int, *, what: str = "gpus") -> int:
    if isinstance(n, bool) or not 0 <= n <= MAX_GPUS:
        raise BadSize(f"{what} must be a whole number >= 0 (at most {MAX_GPUS}); got {n!r}")
    return n


def shown_memory(mb: int) -> str:
    """MiB as people read a limit: "2 GiB", "256 MiB", "1.5 GiB"."""
    if mb >= 1024 and mb % 1024 == 0:
        return f"{mb // 1024} GiB"
    if mb >= 1024:
        return f"{mb / 1024:.3g} GiB"
    return f"{mb} MiB"


def shown_cpus(x: float) -> str:
    return f"{x:g}"
