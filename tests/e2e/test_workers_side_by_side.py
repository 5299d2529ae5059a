"""Workers side by side on one host: `berth worker --home DIR`, and a stored credential that
disagrees with BERTH_TOKEN is an error naming both, never a silent choice (SPEC section 2)."""

import json

from service.core.exits import Exit
from tests.procs import Worker, wait_for

GPU = {"pools": {"gpu": {"slots": {"default": 1}}}}


def attached(s) -> dict[str, str]:
    """Attached workers: name -> pool."""
    return {w["name"]: w["pool"] for w in s.api("GET", "/api/v1/workers").json() if w["attached"]}


def join_token(s, name: str) -> str:
    r = s.cli("worker", "join-token", "--pool", "gpu", "--name", name, "--json")
    assert r.code == 0, r.err
    return str(json.loads(r.out)["token"])


def worker(s, tmp_path, env: dict[str, str], *args: str) -> Worker:
    """`berth worker ARGS` with these credentials, all workers sharing one BERTH_HOME."""
    w = Worker(server=s, token="", pool="", home=tmp_path / "shared-home", args=args)
    return w.start_with(env)


class TestHome:
    def test_two_workers_one_host_each_its_own_home(self, server_factory, tmp_path):
        """Two workers with --home DIR each attach as themselves, side by side."""
        s = server_factory(GPU, builtin_worker=False)
        a, b = s.worker_token("wa"), s.worker_token("wb")
        first = worker(
            s, tmp_path, {"BERTH_TOKEN": a}, "--pool", "gpu", "--home", str(tmp_path / "a")
        )
        second = worker(
            s, tmp_path, {"BERTH_TOKEN": b}, "--pool", "gpu", "--home", str(tmp_path / "b")
        )
        wait_for(lambda: attached(s) == {"wa": "gpu", "wb": "gpu"}, 30, "both attached")
        assert (tmp_path / "a").is_dir() and (tmp_path / "b").is_dir()  # each its own state
        first.stop()
        second.stop()

    def test_stored_credential_and_another_token_refuse_to_start(self, server_factory, tmp_path):
        """A joined node's home and another worker's BERTH_TOKEN: exit 201 naming both."""
        s = server_factory(GPU, builtin_worker=False)
        home = tmp_path / "node"
        joined = worker(s, tmp_path, {"BERTH_TOKEN": join_token(s, "box-1")}, "--home", str(home))
        wait_for(lambda: "box-1" in attached(s), 30, "box-1 attached")
        wait_for((home / "credential.json").exists, 20, "its stored credential")
        other = s.worker_token("w2")
        second = worker(s, tmp_path, {"BERTH_TOKEN": other}, "--pool", "gpu", "--home", str(home))
        r = second.wait(60)
        assert r.code == Exit.BAD_INPUT, r.err
        lines = r.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("berth: error: "), r.err
        assert "worker box-1" in r.err and other[:8] in r.err and "--home" in r.err
        stored = (home / "credential").read_text().strip()
        assert other not in r.err and stored not in r.err
        assert attached(s) == {"box-1": "gpu"}  # the first was not knocked off
        joined.stop()

    def test_the_same_join_token_again_is_the_same_worker(self, server_factory, tmp_path):
        """A join token in BERTH_TOKEN, given again after a restart (and a rotation), runs the
        worker it made with its stored credential; another join token is refused."""
        s = server_factory(
            {**GPU, "executor": {"credential_rotate_hours": 0.001}}, builtin_worker=False
        )
        home = tmp_path / "node"
        token = join_token(s, "box-2")
        first = worker(s, tmp_path, {"BERTH_TOKEN": token}, "--home", str(home))
        stored = home / "credential"
        wait_for(stored.exists, 30, "the traded credential")
        traded = stored.read_text()
        wait_for(lambda: stored.read_text() != traded, 30, "a rotation")
        first.stop()
        again = worker(s, tmp_path, {"BERTH_TOKEN": token}, "--home", str(home))
        wait_for(lambda: "box-2" in attached(s), 30, "box-2 back under the same join token")
        again.stop()
        r = worker(s, tmp_path, {"BERTH_TOKEN": join_token(s, "box-3")}, "--home", str(home)).wait(
            60
        )
        assert r.code == Exit.BAD_INPUT and "worker box-2" in r.err and "join token" in r.err
