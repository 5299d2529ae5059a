"""The in-memory fan-out of job notices (api/followers.py) and the CLI's state lines."""

import asyncio

from service.api.followers import Followers
from service.cli.progress import state_line
from service.events import StateEvent


async def test_a_notice_wakes_only_that_jobs_followers_and_reconnect_wakes_all() -> None:
    f = Followers()
    with f.follow(1) as a, f.follow(1) as b, f.follow(2) as c:
        assert len(f) == 3
        f.on_notice("1")
        assert a.is_set() and b.is_set() and not c.is_set()
        f.on_notice("not a number")  # logged and dropped, never raised into the listener
        a.clear()
        b.clear()
        f.wake_all()
        assert a.is_set() and b.is_set() and c.is_set()
    assert len(f) == 0  # a follower that left is forgotten
    f.on_notice("1")  # nobody follows: nothing to do


async def test_close_wakes_every_stream() -> None:
    f = Followers()
    with f.follow(7) as e:
        waiter = asyncio.create_task(e.wait())
        f.close()
        await asyncio.wait_for(waiter, 5)
        assert f.closed


def event(state: str, **kw: object) -> StateEvent:
    base: dict[str, object] = {
        "state": state,
        "attempt": 1,
        "worker": "w1",
        "waiting_for": "",
        "exit_code": None,
        "error": "",
    }
    return StateEvent(**{**base, **kw})  # type: ignore[arg-type]


def test_state_lines_say_each_move() -> None:
    queued = event("queued", attempt=0, worker=None, waiting_for="no worker of pool gpu")
    assert state_line(5, queued) == "berth: job 5 queued: waiting for no worker of pool gpu"
    again = event("queued", attempt=1, worker=None, waiting_for="")
    assert state_line(5, again) == "berth: job 5 queued (attempt 2)"
    assert state_line(5, event("leased")) == "berth: job 5 leased on worker w1 (attempt 1)"
    assert state_line(5, event("running")) == "berth: job 5 running on worker w1"
    ended = event("failed", exit_code=3, error="exit code 3")
    assert state_line(5, ended) == "berth: job 5 failed (exit 3): exit code 3"
    assert state_line(5, event("succeeded", exit_code=0)) == "berth: job 5 succeeded (exit 0)"
