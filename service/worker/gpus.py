"""The worker's GPUs: found through NVML, and handed to jobs by index (SPEC section 4).

`discover()` is the one boundary to the driver: it asks NVML (`nvidia-ml-py`, imported as
`pynvml`) for every device's index, name, memory and utilisation, and answers () where there is
no driver, no library or no GPU. It runs at start (hello) and with every heartbeat (utilisation
changes). Tests put a module named `pynvml` of their own first on the worker's PYTHONPATH to
stand in for a driver: everything past the import is the code a GPU box runs.

`Gpus` gives each job the GPUs it asked for, by index, never one another running job holds; the
job sees them as CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES. A job that asks for none gets
neither variable (as before per-job GPUs existed).
"""

import contextlib
import logging
from collections.abc import Sequence

from service.protocol import Gpu

log = logging.getLogger("berth.worker")
MB = 1024 * 1024


class NoFreeGpu(Exception):
    """Fewer free GPUs than the job asked for (the server placed it on a stale count)."""


def discover() -> tuple[Gpu, ...]:
    """Every GPU NVML sees now; () without a driver, its library, or any device."""
    try:
        import pynvml  # noqa: PLC0415  (the driver's library loads only when asked)
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver (libnvidia-ml.so) here: not a GPU box
        return ()
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                busy = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except pynvml.NVMLError:  # some devices (MIG, vGPU) do not report it
                busy = 0
            found.append(
                Gpu(
                    index=index,
                    name=(name.decode() if isinstance(name, bytes) else str(name))[:128],
                    memory_mb=int(memory.total) // MB,
                    utilization=max(0, min(100, busy)),
                )
            )
        return tuple(found)
    except pynvml.NVMLError as exc:
        log.warning("cannot read the GPUs through NVML: %s", exc)
        return ()
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


class Gpus:
    """Which job holds which GPU index on this worker."""

    def __init__(self, indices: Sequence[int]) -> None:
        self.indices = tuple(indices)
        self._held: dict[int, tuple[int, int]] = {}  # index -> (job, epoch)

    def take(self, key: tuple[int, int], n: int) -> tuple[int, ...]:
        """`n` free indices for the job `key`, lowest first; NoFreeGpu when there are fewer."""
        if n <= 0:
            return ()
        free = [i for i in self.indices if i not in self._held]
        if len(free) < n:
            raise NoFreeGpu(
                f"it asks for {n} GPUs and {len(free)} of this worker's {len(self.indices)} "
                "are free"
            )
        for i in free[:n]:
            self._held[i] = key
        return tuple(free[:n])

    def give_back(self, key: tuple[int, int]) -> None:
        for i in [i for i, k in self._held.items() if k == key]:
            del self._held[i]


def visible(indices: Sequence[int]) -> dict[str, str]:
    """The variables that give a job these GPUs (and no other)."""
    if not indices:
        return {}
    shown = ",".join(str(i) for i in indices)
    return {"CUDA_VISIBLE_DEVICES": shown, "NVIDIA_VISIBLE_DEVICES": shown}
