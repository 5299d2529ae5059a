"""Placement rules: who may take a job, which job goes where, and the words explaining why not."""

import pytest

from service.core.placement import (
    HostSample,
    JobWant,
    PoolSpec,
    WorkerView,
    assign,
    blocked_by,
    free_slots,
    no_lease_reason,
    waiting_for,
)
from service.core.states import DevicePolicy, Liveness, WorkerState

GPU = PoolSpec("gpu", {"agent": 2, "eval": 1}, max_load=4.0, min_memory_gb=8.0, min_disk_gb=20.0)
CPU = PoolSpec("cpu", {"default": 2})
POOLS = {"gpu": GPU, "cpu": CPU}
HEALTHY = HostSample(cpus=8, load=1.0, free_memory_gb=32.0, free_disk_gb=100.0)


def worker(
    name: str = "w1",
    pool: str = "gpu",
    *,
    state: WorkerState = WorkerState.ACTIVE,
    liveness: Liveness = Liveness.OK,
    attached: bool = True,
    labels: tuple[str, ...] = (),
    parallel: int = 0,
    host: HostSample | None = HEALTHY,
    used: dict[str, int] | None = None,
) -> WorkerView:
    return WorkerView(
        id=name,
        name=name,
        pool=pool,
        state=state,
        liveness=liveness,
        attached=attached,
        labels=frozenset(labels),
        parallel=parallel,
        host=host,
        used=dict(used or {}),
    )


def job(
    n: int = 1,
    kind: str = "agent",
    pool: str | None = "gpu",
    labels: tuple[str, ...] = (),
    policy: DevicePolicy = DevicePolicy.REQUIRE,
) -> JobWant:
    return JobWant(n, "t", kind, pool, frozenset(labels), policy)


def host(load: float = 1.0, mem: float = 32.0, disk: float = 100.0) -> HostSample:
    return HostSample(cpus=8, load=load, free_memory_gb=mem, free_disk_gb=disk)


def placed(pairs: list[tuple[JobWant, WorkerView]]) -> list[tuple[int, str]]:
    return [(j.id, w.id) for j, w in pairs]


class TestBlockedBy:
    @pytest.mark.parametrize(
        ("kwargs", "reason"),
        [
            ({}, None),
            ({"attached": False}, "offline"),
            ({"liveness": Liveness.GONE}, "offline"),
            ({"liveness": Liveness.UNREACHABLE}, "unreachable"),
            ({"liveness": Liveness.LOST}, "unreachable"),
            ({"state": WorkerState.DRAINING}, "draining"),
            ({"state": WorkerState.DISABLED}, "disabled"),
            ({"host": host(load=4.5)}, "load"),
            ({"host": host(load=4.0)}, None),
            ({"host": host(mem=7.9)}, "memory"),
            ({"host": host(mem=8.0)}, None),
            ({"host": host(disk=19.0)}, "disk"),
            ({"host": host(disk=20.0)}, None),
            ({"host": None}, None),
        ],
    )
    def test_reason(self, kwargs, reason):
        """A worker is blocked by its state, liveness or its pool's host thresholds, else free."""
        assert blocked_by(worker(**kwargs), GPU) == reason

    def test_zero_thresholds_mean_none(self):
        """A threshold of 0 is no threshold, however bad the host sample."""
        assert blocked_by(worker(host=host(load=99.0, mem=0.0, disk=0.0)), CPU) is None


class TestFreeSlots:
    @pytest.mark.parametrize(
        ("parallel", "used", "free"),
        [
            (0, {}, {"agent": 2, "eval": 1}),
            (0, {"agent": 1}, {"agent": 1, "eval": 1}),
            (0, {"agent": 3}, {"agent": 0, "eval": 1}),
            (1, {}, {"agent": 1, "eval": 1}),
            (2, {"agent": 1}, {"agent": 1, "eval": 1}),
            (2, {"agent": 1, "eval": 1}, {"agent": 0, "eval": 0}),
            (5, {"agent": 2}, {"agent": 0, "eval": 1}),
        ],
    )
    def test_free(self, parallel, used, free):
        """Free slots are the pool's slots less live leases, each capped by --parallel's room."""
        assert free_slots(worker(parallel=parallel, used=used), GPU) == free


class TestAssign:
    def test_require_needs_labels(self):
        """A `require` job goes only to a worker carrying all its labels, or nowhere."""
        plain, tpu = worker("plain"), worker("tpu", labels=("tpu", "x"))
        assert placed(assign([job(labels=("tpu",))], [plain, tpu], POOLS)) == [(1, "tpu")]
        assert assign([job(labels=("tpu",))], [plain], POOLS) == []

    def test_prefer_falls_back_when_no_attached_worker_carries(self):
        """A `prefer` job runs on any fitting worker when no attached worker carries its labels."""
        want = job(labels=("tpu",), policy=DevicePolicy.PREFER)
        assert placed(assign([want], [worker("plain")], POOLS)) == [(1, "plain")]

    def test_prefer_waits_while_a_carrier_is_attached(self):
        """A `prefer` job waits while a carrier is attached, even a busy one or one elsewhere."""
        want = job(labels=("tpu",), policy=DevicePolicy.PREFER)
        busy_carrier = worker("tpu", labels=("tpu",), used={"agent": 2})
        elsewhere = worker("remote", labels=("tpu",))
        assert assign([want], [worker("plain"), busy_carrier], POOLS) == []
        assert assign([want], [worker("plain")], POOLS, attached=[elsewhere]) == []

    def test_prefer_ignores_detached_and_other_pool_carriers(self):
        """Carriers detached or in another pool than the job's do not stop the fallback."""
        want = job(labels=("tpu",), policy=DevicePolicy.PREFER)
        others = [
            worker("off", labels=("tpu",), attached=False),
            worker("c", "cpu", labels=("tpu",)),
        ]
        got = assign([want], [worker("plain")], POOLS, attached=[worker("plain"), *others])
        assert placed(got) == [(1, "plain")]

    def test_prefer_takes_carrier_when_free(self):
        """A `prefer` job whose labels are carried goes to the carrier, not a plain worker."""
        want = job(labels=("tpu",), policy=DevicePolicy.PREFER)
        got = assign([want], [worker("plain"), worker("tpu", labels=("tpu",))], POOLS)
        assert placed(got) == [(1, "tpu")]

    @pytest.mark.parametrize(("pool", "expected"), [("a", ["wa"]), ("b", ["wb"]), ("c", [])])
    def test_pool_restriction(self, pool, expected):
        """A job naming a pool goes only to a worker of that pool."""
        pools = {n: PoolSpec(n, {"default": 1}) for n in ("a", "b", "c")}
        got = assign(
            [job(kind="default", pool=pool)], [worker("wa", "a"), worker("wb", "b")], pools
        )
        assert [w.id for _, w in got] == expected

    def test_no_pool_means_any_pool(self):
        """A job naming no pool fits any pool that has slots of its kind."""
        got = assign([job(kind="default", pool=None)], [worker("g"), worker("c", "cpu")], POOLS)
        assert placed(got) == [(1, "c")]

    def test_kind_must_have_slots(self):
        """A job whose kind has no free slot on a worker is not placed there."""
        w = worker(used={"eval": 1})
        assert assign([job(kind="eval")], [w], POOLS) == []
        assert assign([job(kind="nope")], [w], POOLS) == []

    def test_parallel_caps_across_kinds(self):
        """--parallel bounds the jobs a worker takes in one pass, over all kinds together."""
        jobs = [job(1, "agent"), job(2, "eval"), job(3, "agent")]
        assert placed(assign(jobs, [worker(parallel=2)], POOLS)) == [(1, "w1"), (2, "w1")]

    def test_job_goes_to_at_most_one_worker(self):
        """Each job is placed once, however many workers have room for it."""
        got = assign([job(1)], [worker("a"), worker("b"), worker("c")], POOLS)
        assert len(got) == 1
        got = assign([job(i) for i in range(4)], [worker("a"), worker("b")], POOLS)
        assert sorted(j.id for j, _ in got) == [0, 1, 2, 3]

    def test_jobs_in_order_get_slots_in_order(self):
        """When slots run out, the jobs earlier in the given order are the ones placed."""
        jobs = [job(i, "eval") for i in (5, 3, 9)]
        got = assign(jobs, [worker("a"), worker("b")], POOLS)
        assert [j.id for j, _ in got] == [5, 3]

    def test_spreads_to_most_free(self):
        """A job goes to the fitting worker with the most free slots of its kind."""
        got = assign([job(1), job(2)], [worker("a", used={"agent": 1}), worker("b")], POOLS)
        assert placed(got) == [(1, "b"), (2, "a")]

    def test_spreading_counts_parallel_room(self):
        """Spreading compares free slots as --parallel caps them, also after earlier grants."""
        pools = {"gpu": PoolSpec("gpu", {"agent": 2, "eval": 2})}
        capped, roomy = worker("capped", parallel=2), worker("roomy")
        # After job 1, `capped` has room for one more job (free_slots says eval: 1), `roomy` 2.
        got = assign([job(1, "agent"), job(2, "eval")], [capped, roomy], pools)
        assert placed(got) == [(1, "capped"), (2, "roomy")]

    def test_blocked_and_unknown_pool_workers_get_nothing(self):
        """Blocked workers and workers of an unconfigured pool are never assigned."""
        ws = [
            worker("d", state=WorkerState.DRAINING),
            worker("x", "ghost"),
            worker("u", attached=False),
        ]
        assert assign([job()], ws, POOLS) == []


class TestWaitingFor:
    def test_unknown_pool(self):
        """A job naming an unconfigured pool says so."""
        assert waiting_for(job(pool="ghost"), [worker()], POOLS) == "pool ghost is not configured"

    @pytest.mark.parametrize(
        ("pool", "text"),
        [
            ("gpu", "pool gpu has no slots of kind 'foo' (its kinds: agent, eval)"),
            (
                None,
                "no pool has slots of kind 'foo' (kinds by pool: cpu: default; gpu: agent, eval)",
            ),
        ],
    )
    def test_no_slots_of_kind(self, pool, text):
        """A kind no pool offers is named, with the kinds the pools (or the pool asked) have."""
        assert waiting_for(job(kind="foo", pool=pool), [worker()], POOLS) == text

    def test_no_worker_attached(self):
        """With no attached (or only gone) worker in the pool, the job says none is attached."""
        ws = [worker(attached=False), worker("g", liveness=Liveness.GONE), worker("c", "cpu")]
        assert waiting_for(job(), ws, POOLS) == "no worker of pool gpu with agent slots is attached"

    def test_missing_label_named(self):
        """A `require` job names the label no attached worker of its pool carries."""
        ws = [worker(labels=("a100",)), worker("c", "cpu", labels=("tpu",))]
        got = waiting_for(job(labels=("tpu", "a100")), ws, POOLS)
        assert got == "no attached worker of pool gpu has label tpu"

    def test_several_missing_labels_use_plural(self):
        """Labels each carried by some worker, but by none together, are listed under `labels`."""
        ws = [worker("a", labels=("a100",)), worker("b", labels=("tpu",))]
        got = waiting_for(job(labels=("tpu", "a100")), ws, POOLS)
        assert got == "no attached worker of pool gpu has labels a100, tpu"

    def test_all_slots_busy(self):
        """When every open worker's slots of the kind are used, the total is named."""
        ws = [worker("a", used={"agent": 2}), worker("b", used={"agent": 2})]
        assert waiting_for(job(), ws, POOLS) == "all 4 agent slots of pool gpu are busy"

    def test_all_over_max_load(self):
        """When every worker is over max_load, the threshold is named."""
        ws = [worker("a", host=host(load=9.0)), worker("b", host=host(load=5.0))]
        assert waiting_for(job(), ws, POOLS) == "pool gpu is over max_load (4.0) on every worker"

    def test_mixed_blocks(self):
        """Workers blocked for different reasons are summarised together."""
        ws = [worker("a", host=host(load=9.0)), worker("b", state=WorkerState.DRAINING)]
        got = waiting_for(job(), ws, POOLS)
        assert got == "every worker of pool gpu is unavailable (draining, over max_load)"

    def test_prefer_without_carrier_skips_label_words(self):
        """A `prefer` job with no carrier anywhere is not said to wait for its label."""
        got = waiting_for(job(labels=("tpu",), policy=DevicePolicy.PREFER), [worker()], POOLS)
        assert got.startswith("its turn")

    def test_its_turn(self):
        """With a free fitting slot, the job just waits its turn in the fairness order."""
        assert waiting_for(job(), [worker()], POOLS).startswith("its turn:")

    def test_worker_of_unconfigured_pool_ignored(self):
        """An attached worker of a pool this server does not know is ignored, as assign does."""
        ws = [worker("x", "ghost")]
        got = waiting_for(job(kind="default", pool=None), ws, POOLS)
        assert got == "no worker of any pool with default slots is attached"


class TestNoLeaseReason:
    @pytest.mark.parametrize(
        ("kwargs", "has_job", "reason"),
        [
            ({}, False, "nothing"),
            ({}, True, "-"),
            ({"used": {"agent": 2, "eval": 1}}, True, "slots"),
            ({"parallel": 1, "used": {"agent": 1}}, True, "slots"),
            ({"host": host(load=5.0)}, True, "load"),
            ({"host": host(mem=1.0)}, True, "memory"),
            ({"host": host(disk=1.0)}, True, "disk"),
            ({"state": WorkerState.DRAINING}, True, "draining"),
            ({"state": WorkerState.DISABLED}, True, "disabled"),
            ({"liveness": Liveness.UNREACHABLE}, True, "unreachable"),
            ({"attached": False}, True, "offline"),
        ],
    )
    def test_reason(self, kwargs, has_job, reason):
        """The one word says why a worker holds no new lease: block, slots, or nothing to run."""
        assert no_lease_reason(worker(**kwargs), GPU, has_job) == reason

    def test_unknown_pool(self):
        """A worker whose pool is not configured says `pool`."""
        assert no_lease_reason(worker(), None, True) == "pool"
