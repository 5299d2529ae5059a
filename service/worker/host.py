"""A sample of this host for hello and heartbeats: cpus, load, free memory and disk, GPUs."""

import hashlib
import os
import sys
from importlib import metadata
from pathlib import Path

import psutil

from service.protocol import Capacity, Gpu, Host

GB = 1024**3


def sample(home: Path, devices: tuple[Gpu, ...] = ()) -> Host:
    """The host now; `devices`: its GPUs as NVML last answered (worker/gpus.py)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else psutil.cpu_percent() / 100
    return Host(
        cpus=psutil.cpu_count() or 1,
        load=round(load, 2),
        free_memory_gb=round(psutil.virtual_memory().available / GB, 2),
        free_disk_gb=round(psutil.disk_usage(str(home)).free / GB, 2),
        gpus=tuple(d.name for d in devices),
        devices=devices,
    )


def capacity(
    *, cpus: float | None, memory_mb: int | None, gpus: int | None, devices: tuple[Gpu, ...]
) -> Capacity:
    """What this worker offers jobs: what it was told (--cpus --memory --gpus), else the host's.

    The host's: the cores this process may run on, its total memory, the GPUs NVML sees.
    """
    if cpus is None:
        cpus = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    if memory_mb is None:
        memory_mb = psutil.virtual_memory().total // (1024 * 1024)
    return Capacity(cpus=cpus, memory_mb=memory_mb, gpus=len(devices) if gpus is None else gpus)


def env_digest() -> str:
    """A short digest of this interpreter and its installed distributions."""
    names = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    h = hashlib.sha256(sys.version.encode())
    for n in names:
        h.update(n.encode())
    return h.hexdigest()[:16]
