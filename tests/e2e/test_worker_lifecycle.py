"""Dead workers leave `worker list` at once with `berth worker rm NAME` (SPEC section 2). On
their own after `[executor] forget_lost_after_seconds`: in process, in
tests/integration/test_worker_channel.py."""

import json

from service.core.exits import Exit
from tests.procs import wait_for


def names(s) -> set[str]:
    return {w["name"] for w in json.loads(s.cli("worker", "list", "--json").out)}


def attached(s, name: str) -> bool:
    return any(w["name"] == name and w["attached"] for w in s.api("GET", "/api/v1/workers").json())


class TestLifecycle:
    def test_worker_rm(self, server_factory, worker_factory):
        """`worker rm` refuses an attached worker in one line (204), removes it once it stopped,
        and an unknown name is 203."""
        s = server_factory(builtin_worker=False)
        w = worker_factory(s, s.worker_token("w1"), "serve", name="a")
        wait_for(lambda: attached(s, "w1"), 30, "attached")
        r = s.cli("worker", "rm", "w1")
        assert r.code == Exit.CONFLICT and r.err.startswith("berth: error: worker w1 is attached")
        assert len(r.err.splitlines()) == 1
        w.stop()
        wait_for(lambda: not attached(s, "w1"), 30, "detached")
        r = s.cli("worker", "rm", "w1")
        assert (r.code, r.out) == (0, "removed w1\n"), r.err
        assert "w1" not in names(s)
        r = s.cli("worker", "rm", "w1")
        assert (r.code, r.err) == (Exit.NOT_FOUND, "berth: error: no worker named 'w1'\n")
