"""The pure parts of the trust boundary: who mints what, a job's environment, durations, and the
worker's outbox of reports."""

import asyncio
from pathlib import Path

import pytest

from service import protocol
from service.auth import minting
from service.auth.callers import Caller, Kind, Role
from service.core import durations
from service.core.errors import Forbidden
from service.core.states import TokenKind
from service.worker import environment
from service.worker.outbox import Outbox
from service.worker.runner import utf8_boundary


def who(role: Role, *tenants: str) -> Caller:
    return Caller(Kind.HUMAN, "x", role, frozenset(tenants))


K = TokenKind
ADMIN = who(Role.ADMIN)
OP_A = who(Role.OPERATOR, "a")


class TestMinting:
    @pytest.mark.parametrize(
        ("caller", "kind", "tenants", "refusal"),
        [
            (ADMIN, K.ADMIN, [], None),
            (ADMIN, K.WORKER, [], None),  # fleet-wide: admins only
            (ADMIN, K.OPERATOR, ["a", "b"], None),
            (OP_A, K.WORKER, ["a"], None),
            (OP_A, K.SERVICE, ["a"], None),
            (OP_A, K.METRICS, ["a"], None),
            (OP_A, K.ADMIN, [], "not admin tokens"),
            (OP_A, K.ADMIN, ["a"], "not admin tokens"),
            (OP_A, K.OPERATOR, ["a"], "not operator tokens"),
            (OP_A, K.WORKER, [], "only an admin"),
            (OP_A, K.SERVICE, [], "name its tenants"),
            (OP_A, K.WORKER, ["b"], "tenant 'b'"),
            (OP_A, K.SERVICE, ["a", "b"], "tenant 'b'"),
            (who(Role.MEMBER, "a"), K.SERVICE, ["a"], "only admins and operators"),
            (who(Role.VIEWER, "a"), K.WORKER, ["a"], "only admins and operators"),
            (who(Role.WORKER), K.WORKER, [], "only admins and operators"),
            (who(Role.METRICS, "a"), K.METRICS, ["a"], "only admins and operators"),
        ],
    )
    def test_table(self, caller, kind, tenants, refusal):
        """admin mints anything; operator worker/service/metrics for its own tenants; no one else."""
        if refusal is None:
            minting.check(caller, kind, tenants)
        else:
            with pytest.raises(Forbidden, match=refusal):
                minting.check(caller, kind, tenants)

    def test_could_have_minted_hides_stronger_tokens(self):
        """An operator sees (and may revoke) only tokens it could have made."""
        assert minting.could_have_minted(OP_A, "worker", ["a"])
        assert not minting.could_have_minted(OP_A, "admin", [])
        assert not minting.could_have_minted(OP_A, "worker", [])
        assert not minting.could_have_minted(OP_A, "service", ["b"])
        assert not minting.could_have_minted(OP_A, "no-such-kind", ["a"])


class TestDurations:
    @pytest.mark.parametrize(
        ("text", "seconds"),
        [
            ("90s", 90),
            ("15m", 900),
            ("1h", 3600),
            ("30d", 30 * 86400),
            ("2", 2 * 86400),
            ("1.5h", 5400),
        ],
    )
    def test_units(self, text, seconds):
        """s, m, h, d; a bare number is days."""
        assert durations.seconds(text) == seconds

    @pytest.mark.parametrize("text", ["", "h", "-1d", "0", "1w", "1e9999d", "nan", "1 h x"])
    def test_refused(self, text):
        """Anything else is refused with the forms that work."""
        with pytest.raises(ValueError, match="90s, 15m, 1h or 30d"):
            durations.seconds(text)


WORKER_ENV = {
    "PATH": "/opt/bin:/usr/bin",
    "LANG": "en_US.UTF-8",
    "LC_ALL": "C",
    "TZ": "UTC",
    "HOME": "/root",
    "BERTH_TOKEN": "brt_secret",
    "BERTH_DATABASE_URL": "postgresql://x",
    "BERTH_SECRET_KEY": "a2V5",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "HF_TOKEN": "hf",
}


class TestJobEnvironment:
    def build(self, **over):
        kw = {
            "pass_env": (),
            "job_env": {},
            "secrets": {},
            "berth": {"BERTH_JOB_ID": "7"},
            "workdir": Path("/w/7-1"),
            "user": "berth-job-61000",
            **over,
        }
        return environment.build(WORKER_ENV, **kw)

    def test_built_not_inherited(self):
        """Only the base comes from the worker (not even its PATH: the system's): no credential,
        no BERTH_* setting, no stray keys."""
        env = self.build()
        assert env == {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "en_US.UTF-8",
            "LC_ALL": "C",
            "TZ": "UTC",
            "HOME": "/w/7-1",
            "TMPDIR": "/w/7-1/tmp",
            "USER": "berth-job-61000",
            "SHELL": "/bin/sh",
            "BERTH_JOB_ID": "7",
        }

    def test_order(self):
        """--pass-env, then the job's env, its secrets, and berth's variables last."""
        env = self.build(
            pass_env=("HF_TOKEN",),
            job_env={"HF_TOKEN": "job", "A": "1", "BERTH_JOB_ID": "fake"},
            secrets={"A": "secret"},
        )
        assert (env["HF_TOKEN"], env["A"], env["BERTH_JOB_ID"]) == ("job", "secret", "7")
        assert self.build(pass_env=("HF_TOKEN",))["HF_TOKEN"] == "hf"

    @pytest.mark.parametrize("name", ["BERTH_TOKEN", "berth_home", "Berth_Database_URL"])
    def test_pass_env_refuses_berth_settings(self, name):
        """--pass-env never passes berth's own settings."""
        with pytest.raises(environment.BadPassEnv, match="never reach a job"):
            environment.check_pass_env([name])

    def test_pass_env_names_must_be_names(self):
        """A --pass-env that is not a variable name is refused."""
        with pytest.raises(environment.BadPassEnv, match="not an environment variable name"):
            environment.check_pass_env(["A=B"])


class TestUtf8Boundary:
    @pytest.mark.parametrize(
        ("data", "cut"),
        [
            (b"abc", 3),
            ("é".encode()[:1], 0),
            ("é".encode(), 2),
            (b"a" + "€".encode()[:2], 1),
            (b"a" + "😀".encode(), 5),
            (b"a" + "😀".encode()[:3], 1),
            (b"\x80\x80\x80\x80\x80", 5),  # not UTF-8 at all: passes as it is
            (b"\x00\x00", 2),
        ],
    )
    def test_cut(self, data, cut):
        """A chunk is cut before an incomplete UTF-8 character, never inside one."""
        assert utf8_boundary(data) == cut


def started(seq: int, job: int = 1) -> protocol.Started:
    return protocol.Started(seq=seq, job=job, epoch=1)


class TestOutbox:
    async def test_resent_until_received(self):
        """Reports stay until received; a new session sends the rest again, in order."""
        box = Outbox()
        for job in (1, 2, 3):
            box.put(lambda seq, job=job: started(seq, job))
        assert [(await box.next()).job for _ in range(3)] == [1, 2, 3]
        box.received(1)
        box.rewind()
        assert [(await box.next()).job for _ in range(2)] == [2, 3]
        box.received(3)
        assert len(box) == 0

    async def test_output_waits_for_room(self):
        """Output waits while the outbox is full and goes on once the server received."""
        box = Outbox(limit_bytes=1000)
        await box.put_output(1, 1, "stdout", b"x" * 600)
        blocked = asyncio.create_task(box.put_output(1, 1, "stdout", b"y" * 600))
        await asyncio.sleep(0)
        assert not blocked.done()
        box.put(lambda seq: protocol.Finished(seq=seq, job=2, epoch=1, state="succeeded"))
        assert len(box) == 2  # a result is never held up behind output
        box.received(1)
        await asyncio.wait_for(blocked, 1)
        assert box.unreceived_bytes < 1000 + 600

    async def test_held_results_and_forget(self):
        """Unreceived results count as held; a lease that is gone drops its reports."""
        box = Outbox()
        box.put(lambda seq: protocol.Finished(seq=seq, job=5, epoch=2, state="failed"))
        box.put(lambda seq: started(seq, 6))
        assert box.finished_keys() == {(5, 2)}
        box.forget((5, 2))
        assert box.finished_keys() == set()
        assert len(box) == 1

    async def test_drained(self):
        """drained() is True once everything is received, False on timeout."""
        box = Outbox()
        box.put(started)
        assert await box.drained(0.05) is False
        box.received(1)
        assert await box.drained(0.05) is True
