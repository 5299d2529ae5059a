"""What one server process exports at GET /metrics (Prometheus text format).

Each server process owns its registry (`Metrics()`), so servers in one test process do not
share counters. Counters and histograms count what happened in this process; the gauges that
describe the whole installation (queue depths, jobs and workers by state, provisioned workers,
stored bytes) are read from Postgres at scrape time (`Snapshot`), so every server reports the
same queue depths.

Labels are bounded: pool and kind (names from berth.toml), state (a fixed set), route (the
route's template, never its path), method and status. Never a job id, a worker name, a tenant
or anything a job emits.
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from service.domain.gauges import Snapshot

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

# A queued job with no pool goes to any pool that has its kind.
ANY_POOL: Final = "*"

# Seconds from submit to start: from a warm worker (milliseconds) to a provisioned cold start.
LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
ACK_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class _SnapshotCollector(Collector):
    """Yields the last snapshot's gauges; the route refreshes it before each scrape."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()
        self.limits = 0

    def collect(self) -> Iterable[Metric]:
        s = self.snapshot
        yield _family(
            "berth_queue_depth_jobs", "Queued jobs per pool and kind.", ["pool", "kind"], s.queued
        )
        yield _family("berth_jobs", "Jobs per state.", ["state"], s.jobs)
        yield _family("berth_workers", "Workers per pool and state.", ["pool", "state"], s.workers)
        yield _family(
            "berth_provisioned_workers",
            "Provisioned workers alive per pool and state.",
            ["pool", "state"],
            s.provisioned,
        )
        yield _family(
            "berth_provider_failures",
            "Failed starts in a row per provisioned pool.",
            ["pool"],
            s.provider_failures,
        )
        store = GaugeMetricFamily(
            "berth_store_bytes", "Bytes of the blobs the artifact store holds references to."
        )
        store.add_metric([], s.store_bytes)
        yield store
        limits = GaugeMetricFamily("berth_limits_in_force", "Operator limits in force.")
        limits.add_metric([], self.limits)
        yield limits


def _family(
    name: str, doc: str, labels: list[str], values: Mapping[tuple[str, ...], int]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


class Metrics:
    """This process's registry and the instruments the server updates as things happen."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.transitions = Counter(
            "berth_job_transitions",
            "Jobs that entered a state through this server (submitted, leased, or finished).",
            ["state"],
            registry=r,
        )
        self.start_latency = Histogram(
            "berth_job_start_latency_seconds",
            "Seconds from a job's submit to its lease, for leases granted by this server.",
            ["pool", "kind"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ack_latency = Histogram(
            "berth_heartbeat_ack_latency_seconds",
            "Seconds from a heartbeat's arrival to its ack (after it is written).",
            buckets=ACK_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "berth_http_requests",
            "HTTP requests answered, by route template and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self.statements = Counter(
            "berth_db_statements",
            "SQL statements this server's engine sent to Postgres.",
            registry=r,
        )
        self.leader = Gauge(
            "berth_leader", "1 while this server runs the leader's loops.", registry=r
        )
        self.sessions = Gauge(
            "berth_worker_sessions", "Worker websockets attached to this server.", registry=r
        )
        self.relay_sessions = Gauge(
            "berth_relay_sessions", "Job calls being relayed through this server now.", registry=r
        )
        self._snapshot = _SnapshotCollector()
        r.register(self._snapshot)

    def refresh(self, snapshot: Snapshot, *, limits: int) -> None:
        """The gauges the next render shows: `snapshot`, and `limits` operator limits in force."""
        self._snapshot.snapshot = snapshot
        self._snapshot.limits = limits

    def watch(
        self, *, leader: Callable[[], bool] | None = None, sessions: Callable[[], int] | None = None
    ) -> None:
        """Read these at scrape time: whether this server leads, and its attached workers."""
        if leader is not None:
            self.leader.set_function(lambda: float(leader()))
        if sessions is not None:
            self.sessions.set_function(lambda: float(sessions()))

    def count_statements(self, engine: AsyncEngine) -> None:
        """Count every statement `engine` sends (what a poll costs the database shows here)."""
        event.listen(engine.sync_engine, "before_cursor_execute", self._statement)

    def _statement(self, *_: object) -> None:
        self.statements.inc()

    def started(self, pool: str | None, kind: str, waited: float) -> None:
        self.transitions.labels("leased").inc()
        self.start_latency.labels(pool or ANY_POOL, kind).observe(max(waited, 0.0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
