"""Job I/O, end to end (SPEC section 4): inputs reach a remote worker, outputs come back, output
is bytes kept whole (the tail in Postgres, the rest in the store), and the runtime inside a job
(`emit`, `save_artifact`, a relayed `berth`) acts for the job's tenant only while its lease is
live."""

import asyncio
import hashlib
import json
import subprocess
import sys
import textwrap

import asyncpg

from service.db.engine import plain_url
from tests.procs import wait_for

GPU = {"pools": {"gpu": {"slots": {"default": 2}}}}


def attached(s, name: str) -> bool:
    return any(w["name"] == name and w["attached"] for w in s.api("GET", "/api/v1/workers").json())


def remote(s, worker_factory, *args: str, name: str = "gpu1"):
    w = worker_factory(s, s.worker_token(name), "gpu", "--python", "/usr/bin/python3", *args)
    wait_for(lambda: attached(s, name), 20, f"{name} attached")
    return w


def shown(s, job: int) -> dict:
    return s.api("GET", f"/api/v1/jobs/{job}").json()


class TestInputs:
    def test_a_directory_reaches_a_remote_worker_whole(
        self, server_factory, worker_factory, tmp_path
    ):
        """A directory input of 3 files arrives under its name; the job's checksums match."""
        s = server_factory(GPU, builtin_worker=False)
        remote(s, worker_factory)
        data = tmp_path / "data"
        (data / "sub").mkdir(parents=True)
        files = {"a.txt": b"alpha\n", "b.bin": bytes(range(256)) * 40, "sub/c": b"\x00gamma"}
        for rel, content in files.items():
            (data / rel).write_bytes(content)
        r = s.cli(
            "job",
            "submit",
            "--wait",
            "--pool",
            "gpu",
            "--input",
            str(data),
            "--",
            "sh",
            "-c",
            "cd data && sha256sum a.txt b.bin sub/c",
        )
        assert r.code == 0, r.err
        got = dict(line.split()[::-1] for line in r.out.splitlines())
        assert got == {rel: hashlib.sha256(c).hexdigest() for rel, c in files.items()}

    def test_a_second_submit_of_the_same_input_sends_nothing(
        self, server_factory, worker_factory, tmp_path
    ):
        """200 MB input: the first submit sends it, the second sends 0 bytes (HEAD first)."""
        s = server_factory(GPU, builtin_worker=False)
        remote(s, worker_factory)
        big = tmp_path / "big.bin"
        with big.open("wb") as f:
            block = hashlib.sha256(b"seed").digest() * 32768  # 1 MiB, not all one byte
            for i in range(200):
                f.write(block[i:] + block[:i])
        expected = hashlib.sha256(big.read_bytes()).hexdigest()
        check = f"test $(sha256sum big.bin | cut -c1-64) = {expected}"
        first = s.cli(
            "job",
            "submit",
            "--wait",
            "--pool",
            "gpu",
            "--input",
            str(big),
            "--",
            "sh",
            "-c",
            check,
            timeout=300,
        )
        assert first.code == 0, first.err
        assert f"{200 * 1024 * 1024} bytes sent" in first.err
        second = s.cli(
            "job",
            "submit",
            "--wait",
            "--pool",
            "gpu",
            "--input",
            str(big),
            "--",
            "sh",
            "-c",
            check,
            timeout=300,
        )
        assert second.code == 0, second.err
        assert "0 bytes sent" in second.err


class TestOutputs:
    def test_outputs_come_back_byte_identical_even_from_a_failed_job(
        self, server_factory, worker_factory, tmp_path
    ):
        """Files under $BERTH_OUTPUT are listed by `job show` and fetched byte-identical, also
        from a job that exits 1; a symlink it leaves there is not followed."""
        s = server_factory(GPU, builtin_worker=False)
        remote(s, worker_factory)
        script = textwrap.dedent(
            """
            mkdir -p "$BERTH_OUTPUT/deep/er"
            printf 'result\\n' > "$BERTH_OUTPUT/result.txt"
            head -c 100000 /dev/urandom > "$BERTH_OUTPUT/deep/er/noise.bin"
            ln -s /etc/shadow "$BERTH_OUTPUT/shadow"
            cp "$BERTH_OUTPUT/deep/er/noise.bin" "$HOME/noise.copy"
            sha256sum "$BERTH_OUTPUT/deep/er/noise.bin" | cut -c1-64
            exit 1
            """
        )
        r = s.cli("job", "submit", "--wait", "--pool", "gpu", "--", "sh", "-c", script)
        assert r.code == 1
        noise_sha = r.out.strip()
        job = s.api("GET", "/api/v1/jobs", params={"limit": 1}).json()[0]
        paths = {o["path"]: o for o in shown(s, job["id"])["outputs"]}
        assert set(paths) == {"result.txt", "deep/er/noise.bin"}  # no symlink followed
        assert paths["deep/er/noise.bin"]["sha256"] == noise_sha
        out = tmp_path / "fetched"
        f = s.cli("job", "fetch", str(job["id"]), str(out))
        assert f.code == 0, f.err
        assert (out / "result.txt").read_bytes() == b"result\n"
        assert hashlib.sha256((out / "deep/er/noise.bin").read_bytes()).hexdigest() == noise_sha
        text = s.cli("job", "show", str(job["id"])).out
        assert "deep/er/noise.bin" in text


class TestOutputBytes:
    def test_five_megabytes_read_back_whole_while_postgres_keeps_the_tail(
        self, server_factory, sync_db_url
    ):
        """A job printing 5 MB: `job logs` returns every byte, in order, while Postgres holds
        only the newest output_tail_kb (the rest moved to the store)."""
        s = server_factory(
            {"executor": {"output_tail_kb": 64, "pack_seconds": 0.5}}, builtin_worker=True
        )
        r = s.cli("job", "submit", "--", "sh", "-c", "seq 1 750000")
        job = int(r.out.strip())
        wait_for(lambda: shown(s, job)["state"] == "succeeded", 60, "the job to end")
        expected = "".join(f"{i}\n" for i in range(1, 750001)).encode()
        assert len(expected) > 5_000_000

        async def rows_bytes() -> int:
            conn = await asyncpg.connect(plain_url(sync_db_url))
            try:
                return int(
                    await conn.fetchval(
                        "SELECT coalesce(sum(length(data)), 0) FROM job_output WHERE job_id = $1",
                        job,
                    )
                )
            finally:
                await conn.close()

        wait_for(lambda: asyncio.run(rows_bytes()) <= 64 * 1024 + 65536, 30, "the tail only")
        logs = subprocess.run(
            [sys.executable, "-m", "service", "job", "logs", str(job)],
            env=s.env(BERTH_TOKEN=s.token),
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout == expected


PYTHON_JOB = textwrap.dedent(
    """
    import json, os, subprocess
    from berth_runtime import emit, save_artifact, load_artifact
    emit(loss=0.5, step=3)
    with open("model.bin", "wb") as f:
        f.write(b"weights-" * 1000)
    ref = save_artifact("model.bin")
    back = load_artifact(ref, "again.bin").read_bytes()
    child = subprocess.run(
        ["berth", "job", "submit", "--wait", "--", "sh", "-c", "echo child in $BERTH_TENANT"],
        capture_output=True, text=True,
    )
    print(json.dumps({
        "ref": ref, "same": back == b"weights-" * 1000,
        "child_code": child.returncode, "child_id": child.stdout.split()[0] if child.stdout else "",
        "child_err": child.stderr,
    }))
    """
)


class TestRuntime:
    def test_emit_save_and_a_relayed_child_job(self, server_factory, worker_factory, tmp_path):
        """A --python job emits a metric, saves and loads an artifact, and submits a child job
        through its relayed `berth`: the child runs in the same tenant, signed job:<id>."""
        s = server_factory(GPU, builtin_worker=False)
        remote(s, worker_factory)
        script = tmp_path / "job.py"
        script.write_text(PYTHON_JOB)
        r = s.cli(
            "job",
            "submit",
            "--wait",
            "--pool",
            "gpu",
            "--tenant",
            "ml",
            "--python",
            str(script),
            timeout=120,
        )
        assert r.code == 0, r.err
        said = json.loads(r.out.strip().splitlines()[-1])
        assert said["same"] and said["child_code"] == 0, said
        parent = s.api("GET", "/api/v1/jobs", params={"limit": 5}).json()
        parent = next(j for j in parent if j["python"])
        detail = json.loads(s.cli("job", "show", str(parent["id"]), "--json").out)
        assert detail["metrics"] == {"loss": 0.5, "step": 3.0}
        assert detail["python_sha256"]
        child = shown(s, int(said["child_id"]))
        assert (child["tenant"], child["created_by"]) == ("ml", f"job:{parent['id']}")
        assert child["state"] == "succeeded"
        audit = s.api("GET", "/api/v1/audit", params={"limit": 50}).json()
        entry = next(
            e
            for e in audit
            if e["action"] == "job.submitted" and e["caller"] == f"job:{parent['id']}"
        )
        assert entry["detail"]["on_behalf_of"] == "human:admin"
        # The artifact is the tenant's: readable by it, not by another tenant.
        assert (
            s.api("HEAD", f"/api/v1/cas/{said['ref']}", params={"tenant": "ml"}).status_code == 200
        )
        assert (
            s.api("HEAD", f"/api/v1/cas/{said['ref']}", params={"tenant": "other"}).status_code
            == 404
        )
