"""Per-job resources: sizes, the capacity rule in placement, and the words for why a job waits."""

import pytest

from service.core.placement import (
    JobWant,
    PoolSpec,
    Quota,
    WorkerView,
    assign,
    no_lease_reason,
    over_quota,
    waiting_for,
)
from service.core.resources import NOTHING, BadSize, Resources, parse_size, shown_memory
from service.core.states import DevicePolicy, Liveness, WorkerState

POOLS = {"gpu": PoolSpec("gpu", {"default": 4})}


def worker(name: str, capacity: Resources, reserved: Resources = NOTHING) -> WorkerView:
    return WorkerView(
        id=name,
        name=name,
        pool="gpu",
        state=WorkerState.ACTIVE,
        liveness=Liveness.OK,
        attached=True,
        labels=frozenset(),
        parallel=0,
        host=None,
        capacity=capacity,
        reserved=reserved,
    )


def job(n: int, request: Resources = NOTHING, tenant: str = "t") -> JobWant:
    return JobWant(n, tenant, "default", "gpu", frozenset(), DevicePolicy.REQUIRE, request=request)


class TestSizes:
    @pytest.mark.parametrize(
        ("text", "mb"),
        [
            ("256M", 256),
            ("2G", 2048),
            ("1.5G", 1536),
            ("512", 512),
            ("1024K", 1),
            ("2GiB", 2048),
            ("1k", 1),
            (300, 300),
        ],
    )
    def test_powers_of_1024(self, text, mb):
        assert parse_size(text) == mb

    @pytest.mark.parametrize("text", ["", "lots", "-1G", "2X", "1e3M", True])
    def test_not_a_size(self, text):
        with pytest.raises(BadSize):
            parse_size(text)

    def test_shown(self):
        assert shown_memory(2048) == "2 GiB"
        assert shown_memory(256) == "256 MiB"


class TestCapacity:
    def test_two_jobs_of_two_cpus_on_three(self):
        """A worker declaring 3 CPUs takes one 2-CPU job at a time, though slots are free."""
        w = worker("w", Resources(cpus=3))
        placed = assign([job(1, Resources(cpus=2)), job(2, Resources(cpus=2))], [w], POOLS)
        assert [j.id for j, _ in placed] == [1]

    def test_a_job_that_asks_nothing_places_as_before(self):
        """Requests of 0 ignore capacity, even on a worker that declared none."""
        w = worker("w", Resources())
        assert len(assign([job(1), job(2)], [w], POOLS)) == 2

    def test_reserved_by_running_leases_counts(self):
        w = worker("w", Resources(gpus=2), reserved=Resources(gpus=1))
        placed = assign([job(1, Resources(gpus=2)), job(2, Resources(gpus=1))], [w], POOLS)
        assert [j.id for j, _ in placed] == [2]

    def test_goes_where_it_fits(self):
        small = worker("small", Resources(memory_mb=1024))
        big = worker("big", Resources(memory_mb=8192))
        [(_, where)] = assign([job(1, Resources(memory_mb=4096))], [small, big], POOLS)
        assert where.name == "big"


class TestWords:
    def test_waits_for_free_gpus(self):
        w = worker("w", Resources(gpus=2), reserved=Resources(gpus=2))
        said = waiting_for(job(3, Resources(gpus=1)), [w], POOLS)
        assert said == "no worker of pool gpu has 1 free GPU"

    def test_no_worker_has_that_many(self):
        w = worker("w", Resources(gpus=1))
        assert waiting_for(job(3, Resources(gpus=2)), [w], POOLS) == (
            "no worker of pool gpu has 2 GPUs"
        )

    def test_quota_is_said_first(self):
        quota = Quota(max_running=2, running_key="tenants.t.max_running")
        held = over_quota(Resources(), "t", running=2, gpus=0, quota=quota)
        said = waiting_for(job(3), [worker("w", Resources())], POOLS, quota=held)
        assert said == "tenant t runs 2 jobs, its quota tenants.t.max_running = 2"

    def test_gpu_quota(self):
        quota = Quota(max_gpus=2, gpus_key="tenants.t.max_gpus")
        assert over_quota(Resources(gpus=1), "t", running=5, gpus=1, quota=quota) == ""
        assert "tenants.t.max_gpus = 2" in over_quota(
            Resources(gpus=2), "t", running=1, gpus=1, quota=quota
        )

    def test_no_lease_reasons(self):
        w = worker("w", Resources(cpus=4, gpus=1), reserved=Resources(gpus=1))
        pool = POOLS["gpu"]
        wants = [job(1, Resources(gpus=1))]
        assert no_lease_reason(w, pool, True, waiting=wants) == "gpus_reserved"
        held = frozenset({"t"})
        assert no_lease_reason(w, pool, True, waiting=wants, held_back=held) == "quota"
        assert no_lease_reason(w, pool, True, waiting=[job(2, Resources(cpus=1))]) == "-"


class TestWorkerSide:
    def test_gpus_by_index_never_one_held(self):
        from service.worker.gpus import Gpus, NoFreeGpu, visible

        held = Gpus([0, 1, 2])
        assert held.take((1, 1), 2) == (0, 1)
        assert held.take((2, 1), 1) == (2,)
        with pytest.raises(NoFreeGpu, match="0 of this worker's 3 are free"):
            held.take((3, 1), 1)
        held.give_back((1, 1))
        assert held.take((3, 1), 1) == (0,)
        assert held.take((4, 1), 0) == ()
        assert visible((0, 2)) == {"CUDA_VISIBLE_DEVICES": "0,2", "NVIDIA_VISIBLE_DEVICES": "0,2"}
        assert visible(()) == {}

    def test_no_driver_no_gpu(self):
        """nvidia-ml-py is installed here but no driver is: NVML answers nothing, no error."""
        from service.worker.gpus import discover

        assert discover() == ()

    def test_discovery_reads_nvml(self, monkeypatch):
        import sys
        import types

        from service.worker.gpus import discover

        fake = types.ModuleType("pynvml")

        class NVMLError(Exception):
            pass

        def utilization(handle: int) -> object:
            if handle == 1:
                raise NVMLError("not supported")
            return types.SimpleNamespace(gpu=55)

        fake.__dict__.update(
            NVMLError=NVMLError,
            nvmlInit=lambda: None,
            nvmlShutdown=lambda: None,
            nvmlDeviceGetCount=lambda: 2,
            nvmlDeviceGetHandleByIndex=lambda i: i,
            nvmlDeviceGetName=lambda h: b"H100",
            nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=80 * 1024**3),
            nvmlDeviceGetUtilizationRates=utilization,
        )
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        found = discover()
        assert [(g.index, g.name, g.memory_mb, g.utilization) for g in found] == [
            (0, "H100", 80 * 1024, 55),
            (1, "H100", 80 * 1024, 0),
        ]

    def test_rlimit_cores_spread_over_the_least_used(self):
        from service.worker.confine import Rlimits

        cores = Rlimits((0, 1, 2, 3))
        assert cores.job((1, 1), cpus=2, memory_mb=0).cores == (0, 1)
        assert cores.job((2, 1), cpus=1.5, memory_mb=0).cores == (2, 3)
        assert cores.job((3, 1), cpus=0.5, memory_mb=0).cores == (0,)
        cores.give_back((1, 1))
        assert cores.job((4, 1), cpus=1, memory_mb=64).cores == (1,)
        assert cores.job((5, 1), cpus=0, memory_mb=64).cores == ()
