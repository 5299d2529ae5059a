"""When a submit may skip counting its tenant's queue (service/domain/queued.py)."""

import time

from service.domain.queued import QueuedSeen


def test_a_tenant_never_counted_is_counted():
    assert QueuedSeen().uncounted({"a": 1}, {"a": 100_000}) == frozenset()


def test_far_below_the_bound_and_fresh_it_is_skipped_near_it_or_stale_it_is_counted():
    seen = QueuedSeen(fresh_seconds=0.2)
    seen.submitted({"a": 10, "b": 10}, [("a", 100), ("b", 40_000)])  # a: 110, b: 40,010
    assert seen.uncounted({"a": 5, "b": 5}, {"a": 100_000, "b": 100_000}) == {"a", "b"}
    # b: 40,010 + 10,000 is past half its bound, so it is counted.
    assert seen.uncounted({"b": 10_000}, {"b": 100_000}) == frozenset()
    # A smaller bound (an operator lowered it) brings a near: counted.
    assert seen.uncounted({"a": 1}, {"a": 200}) == frozenset()
    time.sleep(0.25)
    assert seen.uncounted({"a": 1}, {"a": 100_000}) == frozenset()  # stale: counted again


def test_this_servers_own_submits_since_the_count_are_added():
    seen = QueuedSeen()
    seen.submitted({"a": 1}, [("a", 0)])  # 1 queued
    for _ in range(3):
        seen.submitted({"a": 1000}, [])  # not counted: added to what was seen
    # 3,001 seen: 2 x (3,001 + 1) > 6,000, so a bound of 6,000 is near and counted.
    assert seen.uncounted({"a": 1}, {"a": 6_000}) == frozenset()
    assert seen.uncounted({"a": 1}, {"a": 6_004}) == {"a"}
