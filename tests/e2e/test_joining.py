"""Joining a node (SPEC section 2): a one-time join token, traded at the first attach for a
credential of the worker's own, kept 0600 in its state directory and rotated over the socket."""

import json
import stat

from tests.procs import Worker, wait_for

GPU = {"pools": {"gpu": {"slots": {"default": 1}}}}


def join(s, *args: str) -> dict:
    r = s.cli("worker", "join-token", "--pool", "gpu", "--json", *args)
    assert r.code == 0, r.err
    return json.loads(r.out)


def node(s, home, env_token: str) -> Worker:
    """A worker started the way the join command says: no --pool, only the join token."""
    w = Worker(server=s, token="", pool="", home=home)
    w.start_with({"BERTH_JOIN_TOKEN": env_token})
    return w


def attached(s, name: str) -> bool:
    return any(w["name"] == name and w["attached"] for w in s.api("GET", "/api/v1/workers").json())


class TestJoinToken:
    def test_spent_on_first_use_and_refused_after(self, server_factory, tmp_path):
        """The token binds pool, labels and name; the node stores its own credential (0600); a
        second node with the same token is refused, saying why; a restart uses the stored one."""
        s = server_factory(GPU, builtin_worker=False)
        issued = join(s, "--labels", "cuda,zone=eu", "--name", "box-1")
        assert issued["token"].startswith("brj_") and issued["name"] == "box-1"
        assert issued["command"].startswith(f"BERTH_JOIN_TOKEN={issued['token']} berth worker")
        first = node(s, tmp_path / "n1", issued["token"])
        wait_for(lambda: attached(s, "box-1"), 20, "box-1 attached")
        shown = next(w for w in s.api("GET", "/api/v1/workers").json() if w["name"] == "box-1")
        assert (shown["pool"], shown["labels"]) == ("gpu", ["cuda", "zone=eu"])
        stored = tmp_path / "n1" / "credential"
        wait_for(stored.exists, 10, "the stored credential")
        assert stat.S_IMODE(stored.stat().st_mode) == 0o600
        assert stored.read_text().strip().startswith("brt_")
        second = node(s, tmp_path / "n2", issued["token"])
        r = second.wait(30)
        assert r.code != 0 and "already used" in r.err and "Traceback" not in r.err
        first.stop()
        again = Worker(server=s, token="", pool="", home=tmp_path / "n1")
        again.start_with({})  # no token in the environment: the stored credential
        wait_for(lambda: attached(s, "box-1"), 20, "box-1 back with its own credential")
        again.stop()

    def test_expired_and_unknown_are_refused(self, server_factory, tmp_path):
        """An expired join token and a made-up one are refused with the reason."""
        s = server_factory(GPU, builtin_worker=False)
        issued = join(s, "--expires", "1s")
        wait_for(
            lambda: s.api("GET", "/api/v1/status").status_code == 200 and _expired(s, issued),
            10,
            "the token to expire",
        )
        r = node(s, tmp_path / "n", issued["token"]).wait(30)
        assert r.code != 0 and "expired" in r.err
        r = node(s, tmp_path / "m", "brj_" + "x" * 43).wait(30)
        assert r.code != 0 and "unknown join token" in r.err

    def test_operator_joins_only_for_its_tenants(self, server_factory):
        """A join token stands for a worker credential: an operator's must name its tenants."""
        s = server_factory(GPU, builtin_worker=False)
        op = s.cli("token", "create", "op-a", "--kind", "operator", "--tenant", "a").out.strip()
        r = s.cli("worker", "join-token", "--pool", "gpu", token=op)
        assert r.code != 0 and "only an admin" in r.err
        r = s.cli("worker", "join-token", "--pool", "gpu", "--tenant", "a", token=op)
        assert r.code == 0 and r.out.strip().startswith("brj_")
        r = s.cli("worker", "join-token", "--pool", "nope")
        assert r.code != 0 and "unknown pool" in r.err


class TestRotation:
    def test_rotation_replaces_the_credential_and_the_old_is_refused(
        self, server_factory, tmp_path
    ):
        """Every credential_rotate_hours the server sends a new credential; the worker stores it
        and confirms; the old one is refused from then on, the new one works."""
        s = server_factory(
            {**GPU, "executor": {"credential_rotate_hours": 0.001}}, builtin_worker=False
        )
        issued = join(s, "--name", "rot-1")
        w = node(s, tmp_path / "n", issued["token"])
        stored = tmp_path / "n" / "credential"
        wait_for(stored.exists, 20, "the first credential")
        old = stored.read_text().strip()
        wait_for(lambda: stored.read_text().strip() != old, 30, "a rotation")
        new = stored.read_text().strip()
        # A worker credential may not read jobs (403), but an unknown one is not even known (401).
        wait_for(
            lambda: s.api("GET", "/api/v1/jobs", token=old).status_code == 401,
            10,
            "the old credential to be refused",
        )
        assert s.api("GET", "/api/v1/jobs", token=new).status_code == 403  # known, no powers
        w.stop()
        again = Worker(server=s, token="", pool="", home=tmp_path / "n")
        again.start_with({})
        wait_for(lambda: attached(s, "rot-1"), 20, "back with the rotated credential")
        entries = s.api("GET", "/api/v1/audit", params={"limit": 200}).json()
        assert any(e["action"] == "worker.credential_rotated" for e in entries)
        again.stop()


def _expired(s, issued: dict) -> bool:
    from datetime import UTC, datetime

    return datetime.now(UTC) > datetime.fromisoformat(issued["expires_at"])
