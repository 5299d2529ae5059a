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
