"""The artifact store with real processes: `berth cas serve` for the installation only, `berth
cas put/get` through `berth serve`, a server on S3 and on a remote `cas serve`, and a GiB
through a server whose memory is capped far below it."""

import asyncio
import contextlib
import hashlib
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
import pytest

from service.cas.http import HttpStore
from service.cas.local import LocalStore
from service.domain import secrets
from service.domain.artifacts import server_store
from tests.procs import Server, free_port, stop, wait_for

MIB = 1 << 20
CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def blob(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class CasServe:
    url: str  # the store's base, e.g. http://127.0.0.1:PORT/cas
    key: str  # the installation's cas serve key
    home: Path
    proc: subprocess.Popen[bytes]

    def call(self, method: str, path: str, key: str | None = None, **kw) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        headers.update(kw.pop("headers", {}))
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kw)


@contextlib.contextmanager
def cas_serve(home: Path, port: int | None = None) -> Iterator[CasServe]:
    """`berth cas serve` with `home` as its $BERTH_HOME (and the secret key found there)."""
    home.mkdir(parents=True, exist_ok=True)
    key = server_store.serve_key(secrets.load_key(home, environ={}))
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    env.update(BERTH_HOME=str(home), PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "service", "cas", "serve", "--listen", f"127.0.0.1:{port}"]
    with (home / "cas-serve.log").open("ab") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
    served = CasServe(f"http://127.0.0.1:{port}/cas", key, home, proc)

    def up() -> bool:
        assert proc.poll() is None, (home / "cas-serve.log").read_text()
        with contextlib.suppress(httpx.HTTPError):
            return served.call("GET", "/.id").status_code == 401
        return False

    try:
        wait_for(up, 30, "berth cas serve to answer")
        yield served
    finally:
        stop(proc)


def cli(s: Server, *args: str, token: str | None = None) -> subprocess.CompletedProcess[bytes]:
    """`berth ARGS` against `s`, with bytes for stdout (a blob may be anything)."""
    env = s.env(BERTH_TOKEN=token or s.token)
    return subprocess.run(
        [sys.executable, "-m", "service", *args],
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )


def one_line_error(r: subprocess.CompletedProcess[bytes]) -> str:
    err = r.stderr.decode()
    assert r.returncode != 0 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    return err


class TestCasServe:
    def test_answers_only_the_installation_key(self, tmp_path):
        """The installation's key is served the whole contract; no key is 401, another 403."""
        with cas_serve(tmp_path / "home") as cs:
            assert cs.call("GET", "/.id").status_code == 401
            assert cs.call("GET", "/.id", "brt_not-the-key").status_code == 403
            near = cs.key[:-1] + ("1" if cs.key.endswith("0") else "0")
            assert cs.call("GET", "/.id", near).status_code == 403
            r = cs.call("GET", "/.id", cs.key)
            store = LocalStore(cs.home / "cas")
            assert r.status_code == 200 and r.text.strip() == asyncio.run(store.id())
            data = blob(3 * MIB + 5, seed=1)
            r = cs.call("PUT", f"/{sha(data)}", "", content=data)
            assert r.status_code == 401 and asyncio.run(store.stat(sha(data))) is None
            r = cs.call("PUT", f"/{sha(data)}", cs.key, content=data)
            assert r.status_code == 201 and r.json() == {"sha256": sha(data), "size": len(data)}
            r = cs.call("HEAD", f"/{sha(data)}", cs.key)
            assert r.status_code == 200 and r.headers["content-length"] == str(len(data))
            r = cs.call("GET", f"/{sha(data)}", cs.key, headers={"Range": "bytes=100-199"})
            assert r.status_code == 206 and r.content == data[100:200]
            assert r.headers["content-range"] == f"bytes 100-199/{len(data)}"
            r = cs.call("GET", f"/{sha(data)}", cs.key, headers={"Range": "bytes=3000000-"})
            assert r.status_code == 206 and r.content == data[3000000:]
            assert cs.call("GET", f"/{sha(data)}", cs.key).content == data
            assert cs.call("GET", f"/{sha(data)}").status_code == 401
            r = cs.call("PUT", f"/{sha(b'other')}", cs.key, content=data)
            assert r.status_code == 422
            assert f"{sha(data)} {len(data)}" in cs.call("GET", "/.list", cs.key).text
            assert cs.call("DELETE", f"/{sha(data)}", "brt_x").status_code == 403
            assert cs.call("DELETE", f"/{sha(data)}", cs.key).status_code == 204
            assert cs.call("DELETE", f"/{sha(data)}", cs.key).status_code == 404
            assert cs.call("HEAD", f"/{sha(data)}", cs.key).status_code == 404

    def test_refuses_a_public_listen_without_tls(self, tmp_path):
        """A non-loopback --listen without [network] tls is refused in one line, as serve does."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
        env["BERTH_HOME"] = str(tmp_path)
        for listen, words in (("0.0.0.0:7702", b"without TLS"), ("nope", b"HOST:PORT")):
            r = subprocess.run(
                [sys.executable, "-m", "service", "cas", "serve", "--listen", listen],
                env=env,
                capture_output=True,
                timeout=60,
                check=False,
            )
            assert words in r.stderr and one_line_error(r)

    def test_the_http_store_client_speaks_to_it(self, tmp_path):
        """service.cas's HttpStore, with the key, round-trips a blob through `cas serve`."""
        with cas_serve(tmp_path / "home") as cs:

            async def round_trip() -> bytes:
                store = HttpStore(cs.url, headers={"Authorization": f"Bearer {cs.key}"})
                try:
                    data = blob(2 * MIB, seed=2)

                    async def body():
                        yield data

                    await store.put(body(), sha256=sha(data))
                    return b"".join([c async for c in store.get(sha(data))])
                finally:
                    await store.aclose()

            assert asyncio.run(round_trip()) == blob(2 * MIB, seed=2)


class TestCasCommands:
    def test_put_and_get_round_trip_through_the_server(self, server_factory, tmp_path):
        """`cas put` prints the sha256 (and skips a blob held already); `cas get` returns the
        bytes identical, to a file or to stdout; missing and corrupt blobs are one-line errors."""
        s = server_factory(builtin_worker=False)
        data = blob(5 * MIB + 3, seed=3)
        src = tmp_path / "in.bin"
        src.write_bytes(data)
        r = cli(s, "cas", "put", str(src))
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode() == f"{sha(data)}\n"
        again = cli(s, "cas", "put", str(src))
        assert again.returncode == 0 and again.stdout.decode() == f"{sha(data)}\n"
        assert s.api("GET", "/api/v1/audit").text.count('"cas.uploaded"') == 1  # HEAD first
        out = tmp_path / "out.bin"
        r = cli(s, "cas", "get", sha(data), str(out))
        assert r.returncode == 0, r.stderr
        assert out.read_bytes() == data
        r = cli(s, "cas", "get", sha(data))
        assert r.returncode == 0 and r.stdout == data
        # Another tenant's service account does not get it.
        other = s.api(
            "POST", "/api/v1/tokens", json={"name": "other", "kind": "service", "tenants": ["o"]}
        ).json()["token"]
        assert "no blob" in one_line_error(cli(s, "cas", "get", sha(data), token=other))
        assert "no blob" in one_line_error(cli(s, "cas", "get", sha(b"absent")))
        assert "sha256" in one_line_error(cli(s, "cas", "get", "not-a-hash"))
        assert one_line_error(cli(s, "cas", "put", str(tmp_path / "nope")))
        gone = cli(s, "cas", "put", str(src), "--server", f"http://127.0.0.1:{free_port()}")
        assert "cannot reach the server" in one_line_error(gone)
        # Corrupt on the server's disk: refused with the reason, and healed by a put.
        path = LocalStore(s.home / "cas").path(sha(data))
        path.write_bytes(data[:-1] + b"X")
        err = one_line_error(cli(s, "cas", "get", sha(data), str(tmp_path / "bad.bin")))
        assert "corrupt" in err or "cut short" in err
        assert not (tmp_path / "bad.bin").exists()
        assert cli(s, "cas", "put", str(src)).returncode == 0
        r = cli(s, "cas", "get", sha(data))
        assert r.returncode == 0 and r.stdout == data


class TestServerStores:
    def test_s3(self, server_factory, s3_endpoint, bucket):
        """A server on `[cas] provider = "s3"` stores uploads in the bucket and serves them."""
        cas = {"provider": "s3", "bucket": bucket, "endpoint_url": s3_endpoint}
        s = server_factory({"cas": {**cas, "region": "us-east-1"}}, builtin_worker=False)
        data = blob(6 * MIB, seed=4)
        r = s.api("PUT", f"/api/v1/cas/{sha(data)}", content=data)
        assert r.status_code == 201, r.text
        client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
        try:
            assert client.head_object(Bucket=bucket, Key=sha(data))["ContentLength"] == len(data)
        finally:
            client.close()
        assert s.api("GET", f"/api/v1/cas/{sha(data)}").content == data
        r = s.api("GET", f"/api/v1/cas/{sha(data)}", headers={"Range": "bytes=5-9"})
        assert r.status_code == 206 and r.content == data[5:10]

    def test_remote_cas_serve(self, server_factory, tmp_path):
        """A server on `[cas] provider = "http"` keeps blobs in the installation's `cas serve`,
        reached with the key both derive from the shared secret key."""
        home = tmp_path / "s"  # the server's home (server_factory's name "s"): one secret key
        with cas_serve(home) as cs:
            s = server_factory({"cas": {"provider": "http", "url": cs.url}}, builtin_worker=False)
            assert s.home == home
            data = blob(MIB + 1, seed=5)
            r = s.api("PUT", f"/api/v1/cas/{sha(data)}", content=data)
            assert r.status_code == 201, r.text
            assert LocalStore(home / "cas").path(sha(data)).read_bytes() == data
            assert s.api("GET", f"/api/v1/cas/{sha(data)}").content == data
            assert s.api("HEAD", f"/api/v1/cas/{sha(data)}").status_code == 200


def generated(size_mib: int) -> Iterator[bytes]:
    """`size_mib` MiB of pseudo-random data: 8 random blocks cycled, each chunk numbered."""
    rng = random.Random(7)
    blocks = [rng.randbytes(MIB - 8) for _ in range(8)]
    for i in range(size_mib):
        yield i.to_bytes(8, "little") + blocks[i % len(blocks)]


@contextlib.contextmanager
def memory_cap(proc: subprocess.Popen[bytes], limit: int) -> Iterator[Path]:
    """Run the block with `proc` in a new cgroup v1 memory group capped at `limit` bytes; the
    process is stopped and the group removed afterwards."""
    group = CGROUP_V1 / f"berth-test-{os.getpid()}-{proc.pid}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit))
        (group / "cgroup.procs").write_text(str(proc.pid))
        yield group
    finally:
        stop(proc)
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), 30, "an empty group")
        group.rmdir()


class TestMemory:
    @pytest.mark.timeout(600)  # ~10 s here; a slow disk may take minutes
    def test_a_gib_through_a_server_capped_at_256_mib(self, server_factory):
        """1 GiB goes up and comes back through /api/v1/cas while the server process is in a
        cgroup v1 memory group of 256 MiB: it survives, and the bytes come back identical."""
        if not os.access(CGROUP_V1, os.W_OK):
            pytest.skip("needs a writable cgroup v1 memory controller (root)")
        size_mib = 1024
        digest = hashlib.sha256()
        for chunk in generated(size_mib):
            digest.update(chunk)
        name = digest.hexdigest()
        s = server_factory(builtin_worker=False)
        assert s.proc is not None
        headers = {"Authorization": f"Bearer {s.token}"}
        timeout = httpx.Timeout(120.0)
        try:
            with memory_cap(s.proc, 256 * MIB) as group:
                r = httpx.put(
                    f"{s.url}/api/v1/cas/{name}",
                    content=generated(size_mib),
                    headers=headers,
                    timeout=timeout,
                )
                assert r.status_code == 201, r.text
                assert r.json()["size"] == size_mib * MIB
                back = hashlib.sha256()
                received = 0
                with httpx.stream(
                    "GET", f"{s.url}/api/v1/cas/{name}", headers=headers, timeout=timeout
                ) as resp:
                    assert resp.status_code == 200
                    for chunk in resp.iter_bytes(MIB):
                        back.update(chunk)
                        received += len(chunk)
                assert (received, back.hexdigest()) == (size_mib * MIB, name)
                assert s.proc.poll() is None, s.log()
                peak = int((group / "memory.max_usage_in_bytes").read_text())
                assert peak <= 256 * MIB
        finally:
            with contextlib.suppress(FileNotFoundError):
                LocalStore(s.home / "cas").path(name).unlink()
