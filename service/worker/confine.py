"""Each job's CPU and memory limits (SPEC section 4): a cgroup per job, else rlimits and affinity.

`detect` chooses once, at start, and the worker logs the choice (`describe`):
- **cgroup v2** when a cgroup2 hierarchy with the memory and cpu controllers is mounted and the
  worker may make cgroups below its own: `memory.max` (and `memory.swap.max` 0), `cpu.max`.
- **cgroup v1** else, when the memory and cpu hierarchies are mounted and writable (root):
  `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes`, so swap does not stretch it),
  `cpu.cfs_quota_us` = cpus x `cpu.cfs_period_us`.
- **rlimits** otherwise: RLIMIT_AS at the job's memory (an allocation past it fails with ENOMEM)
  and CPU affinity to as many of the worker's cores as the job asked for, rounded up.

A job's cgroups sit below the worker's own (`<own>/berth-<instance>/job-<id>-<epoch>`), so any
bound on the worker holds for its jobs too; the child joins them between fork and exec, before
it drops to the job's uid (runner.py), so the job and everything it starts are in them. A job
the kernel killed for its memory is reported as such ("killed: over its 2 GiB memory limit");
the OOM killer acts inside the job's cgroup only, so neighbours and the worker are untouched.
A job that asks for neither CPUs nor memory gets no cgroup and no rlimit (as before).
"""

import contextlib
import math
import os
import resource
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from service.core.resources import shown_memory

MIB = 1024 * 1024
PERIOD_US = 100_000  # cpu.cfs_period_us / cpu.max period: 100 ms, the kernel's default
MIN_QUOTA_US = 1000  # the kernel's smallest quota
ROOT = Path("/sys/fs/cgroup")

Step = Callable[[], None]


@dataclass(frozen=True)
class Cgroups:
    """Where jobs' cgroups go: v1 one parent per controller, v2 one parent for both."""

    version: int
    memory: Path  # the parent of jobs' memory cgroups (v2: of their cgroups)
    cpu: Path  # the parent of jobs' cpu cgroups (v2: the same as memory)

    def job(self, name: str, *, cpus: float, memory_mb: int) -> "JobCgroup":
        dirs: dict[str, Path] = {}
        if self.version == 2:
            dirs["both"] = self.memory / name
        else:
            if memory_mb > 0:
                dirs["memory"] = self.memory / name
            if cpus > 0:
                dirs["cpu"] = self.cpu / name
        return JobCgroup(self.version, dirs, cpus=cpus, memory_mb=memory_mb)

    def close(self) -> None:
        """Remove the worker's parents (its jobs' cgroups are gone by now)."""
        for parent in {self.memory, self.cpu}:
            with contextlib.suppress(OSError):
                parent.rmdir()


@dataclass
class JobCgroup:
    version: int
    dirs: dict[str, Path]
    cpus: float
    memory_mb: int

    def create(self) -> None:
        """Make the job's cgroups and write its limits; OSError when the kernel refuses."""
        quota = max(MIN_QUOTA_US, round(self.cpus * PERIOD_US))
        for kind, path in self.dirs.items():
            path.mkdir(exist_ok=True)
            if self.version == 2:
                if self.memory_mb > 0:
                    _write(path / "memory.max", self.memory_mb * MIB)
                    _write_if(path / "memory.swap.max", 0)
                if self.cpus > 0:
                    _write(path / "cpu.max", f"{quota} {PERIOD_US}")
            elif kind == "memory":
                _write(path / "memory.limit_in_bytes", self.memory_mb * MIB)
                _write_if(path / "memory.memsw.limit_in_bytes", self.memory_mb * MIB)
            else:
                _write(path / "cpu.cfs_period_us", PERIOD_US)
                _write(path / "cpu.cfs_quota_us", quota)

    def enter(self) -> Step:
        """The child's step into the job's cgroups (system calls only, paths made before)."""
        procs = tuple(str(p / "cgroup.procs").encode() for p in self.dirs.values())

        def join() -> None:
            me = str(os.getpid()).encode()
            for path in procs:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.write(fd, me)
                finally:
                    os.close(fd)

        return join

    def oom_killed(self) -> bool:
        """The kernel killed a process of the job for its memory limit."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        path = self.dirs.get("both" if self.version == 2 else "memory")
        if path is None:
            return False
        try:
            text = (path / name).read_text()
        except OSError:
            return False
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value or 0) > 0
        return False

    def close(self) -> None:
        """Kill what is left in the job's cgroups, then remove them."""
        for path in self.dirs.values():
            for _ in range(50):
                try:
                    pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                os.sched_yield()
            with contextlib.suppress(OSError):
                path.rmdir()


@dataclass
class Rlimits:
    """The fallback: RLIMIT_AS for memory, CPU affinity for CPUs."""

    cores: tuple[int, ...]  # the worker's own (its affinity at start)
    _held: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)

    def job(self, key: tuple[int, int], *, cpus: float, memory_mb: int) -> "JobRlimits":
        """The job's limits; its cores are the least used of the worker's, ceil(cpus) of them."""
        chosen: tuple[int, ...] = ()
        if cpus > 0 and self.cores:
            use = dict.fromkeys(self.cores, 0)
            for held in self._held.values():
                for c in held:
                    use[c] += 1
            n = min(len(self.cores), math.ceil(cpus))
            chosen = tuple(sorted(sorted(self.cores, key=lambda c: (use[c], c))[:n]))
            self._held[key] = chosen
        return JobRlimits(memory_mb=memory_mb, cores=chosen)

    def give_back(self, key: tuple[int, int]) -> None:
        self._held.pop(key, None)


@dataclass(frozen=True)
class JobRlimits:
    memory_mb: int
    cores: tuple[int, ...]

    def enter(self) -> Step:
        limit = self.memory_mb * MIB
        cores = set(self.cores)

        def apply() -> None:
            if limit:
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            if cores:
                os.sched_setaffinity(0, cores)

        return apply


def detect(instance: str, *, root: Path = ROOT) -> Cgroups | str:
    """Cgroups for jobs (v2 when mounted with memory and cpu, else v1), or why there are none."""
    reasons = []
    for make in (_v2, _v1):
        found = make(instance, root)
        if isinstance(found, Cgroups):
            return found
        reasons.append(found)
    return "; ".join(reasons)


def _own(controller: str) -> str:
    """This process's cgroup path in a hierarchy ("" for v2's), from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path
    return "/"


def _v1(instance: str, root: Path) -> Cgroups | str:
    memory, cpu = root / "memory", root / "cpu"
    if not (memory / "memory.limit_in_bytes").exists() or not (cpu / "cpu.cfs_quota_us").exists():
        return "v1: the memory and cpu controllers are not mounted"
    parents = (
        memory / _own("memory").lstrip("/") / f"berth-{instance[:12]}",
        cpu / _own("cpu").lstrip("/") / f"berth-{instance[:12]}",
    )
    try:
        for parent in parents:
            parent.mkdir(exist_ok=True)
        found = Cgroups(1, parents[0], parents[1])
        _probe(found)
    except OSError as exc:
        return f"v1: cannot make cgroups ({exc.strerror or exc})"
    return found


def _v2(instance: str, root: Path) -> Cgroups | str:
    mount = _v2_mount(root)
    if mount is None:
        return "v2: not mounted"
    controllers = (mount / "cgroup.controllers").read_text().split()
    if not {"memory", "cpu"} <= set(controllers):
        return f"v2: no memory and cpu controllers at {mount}"
    own = mount / _own("").lstrip("/")
    parent = own / f"berth-{instance[:12]}"
    try:
        _write(own / "cgroup.subtree_control", "+memory +cpu")
        parent.mkdir(exist_ok=True)
        _write(parent / "cgroup.subtree_control", "+memory +cpu")
        found = Cgroups(2, parent, parent)
        _probe(found)
    except OSError as exc:
        # e.g. EBUSY: the worker's own cgroup holds processes, so it may not delegate controllers
        with contextlib.suppress(OSError):
            parent.rmdir()
        return f"v2: cannot make cgroups below {own} ({exc.strerror or exc})"
    return found


def _v2_mount(root: Path) -> Path | None:
    if (root / "cgroup.controllers").exists():
        return root
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def _probe(found: Cgroups) -> None:
    """Make and remove a job's cgroups with both limits; raises OSError when it cannot."""
    probe = found.job("probe", cpus=1, memory_mb=64)
    try:
        probe.create()
    finally:
        probe.close()


def _write(path: Path, value: object) -> None:
    path.write_text(str(value))


def _write_if(path: Path, value: object) -> None:
    if path.exists():
        _write(path, value)


def describe(found: Cgroups | Rlimits, why: str = "") -> str:
    """What the worker enforces per job, for its start-up log line."""
    if isinstance(found, Cgroups):
        return (
            f"cgroup v{found.version} (a cgroup per job under {found.memory.parent}: memory "
            "limit, CPU quota)"
        )
    return (
        f"rlimits (no cgroups: {why}; memory by RLIMIT_AS, CPUs by affinity to "
        f"{len(found.cores)} core(s))"
    )


def memory_killed(memory_mb: int) -> str:
    """The error of a job the kernel killed for its memory."""
    return f"killed: over its {shown_memory(memory_mb)} memory limit"


def memory_failed(code: int | None, memory_mb: int) -> str:
    """The error of a job that failed under an address-space rlimit."""
    return (
        f"exited with {code} (its memory is limited to {shown_memory(memory_mb)} by RLIMIT_AS: "
        "an allocation past it fails with ENOMEM)"
    )
