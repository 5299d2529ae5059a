"""A sample of this host for hello and heartbeats: cpus, load, free memory and disk, GPUs."""

import hashlib
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import psutil

from service.protocol import Host

GB = 1024**3


def gpus() -> tuple[str, ...]:
    """GPU names from nvidia-smi when it is installed; () otherwise."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in out.splitlines() if line.strip())


def sample(home: Path, gpu_names: tuple[str, ...] = ()) -> Host:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else psutil.cpu_percent() / 100
    return Host(
        cpus=psutil.cpu_count() or 1,
        load=round(load, 2),
        free_memory_gb=round(psutil.virtual_memory().available / GB, 2),
        free_disk_gb=round(psutil.disk_usage(str(home)).free / GB, 2),
        gpus=gpu_names,
    )


def env_digest() -> str:
    """A short digest of this interpreter and its installed distributions."""
    names = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    h = hashlib.sha256(sys.version.encode())
    for n in names:
        h.update(n.encode())
    return h.hexdigest()[:16]
