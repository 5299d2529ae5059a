"""Job I/O, end to end (SPEC section 4): inputs reach a remote worker, outputs come back, output
is bytes kept whole (the tail in Postgres, the rest in the store), and the runtime inside a job
(`emit`, `save_artifact`, a relayed `berth`) acts for the job's tenant only while its lease is
live."""

import asyncio
import hashlib
import json
import signal
import subprocess
import sys
import textwrap
import time

import asyncpg
import pytest

from service.db.engine import plain_url
from tests.e2e.test_cas_serve import MIB, generated, memory_cap
from tests.procs import FAST, wait_for

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


class TestRelayEnds:
    def test_a_job_in_its_grace_after_cancel_is_refused(
        self, server_factory, worker_factory, shared_dir
    ):
        """A job that traps TERM and calls `berth` after it was cancelled: the call before the
        cancel worked, the one after is refused by the relay."""
        s = server_factory(
            {
                "executor": {
                    "heartbeat_seconds": 3.0,
                    "kill_grace_seconds": 5.0,
                    "unreachable_seconds": 10.0,
                    "evict_seconds": 20.0,
                },
                **GPU,
            },
            builtin_worker=False,
        )
        remote(s, worker_factory)
        script = textwrap.dedent(
            """
            trap 'berth job list > "$SHARED/after" 2>&1; echo "exit $?" >> "$SHARED/after"; exit 0' TERM
            berth job list > "$SHARED/before" 2>&1
            echo ready
            while :; do sleep 0.1; done
            """
        )
        r = s.cli(
            "job",
            "submit",
            "--pool",
            "gpu",
            "--env",
            f"SHARED={shared_dir}",
            "--",
            "sh",
            "-c",
            script,
        )
        assert r.code == 0, r.err
        job = int(r.out.strip())
        wait_for(lambda: "ready" in s.cli("job", "logs", str(job)).out, 30, "the job to start")
        assert str(job) in (shared_dir / "before").read_text()
        assert s.cli("job", "cancel", str(job)).code == 0
        after = shared_dir / "after"
        wait_for(lambda: after.exists() and "exit" in after.read_text(), 30, "the trap to run")
        said = after.read_text()
        assert "lease has ended" in said and "exit 0" not in said, said


class TestRepo:
    def test_a_commit_made_by_the_job_comes_back_as_a_bundle(
        self, server_factory, worker_factory, tmp_path
    ):
        """`--repo` of a local repository: the job runs in its own clone at the named revision,
        its inputs beside its files; its commit comes back as repo.bundle that `git fetch`
        takes, its edit as repo.patch, which leaves its inputs out."""
        origin = tmp_path / "origin"
        git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
        subprocess.run(["git", "init", "-q", "-b", "main", str(origin)], check=True)
        (origin / "README").write_text("one\n")
        subprocess.run([*git, "-C", str(origin), "add", "README"], check=True)
        subprocess.run([*git, "-C", str(origin), "commit", "-qm", "first"], check=True)
        s = server_factory(GPU, builtin_worker=False)
        remote(s, worker_factory, "--allow-local-repos")
        script = textwrap.dedent(
            """
            test "$(cat README)" = one && test "$(cat notes.txt)" = hi
            echo two >> README
            git -c user.email=job@example.com -c user.name=job commit -qam "from the job"
            echo three >> README
            """
        )
        notes = tmp_path / "notes.txt"
        notes.write_text("hi\n")
        r = s.cli(
            "job",
            "submit",
            "--wait",
            "--pool",
            "gpu",
            "--repo",
            f"{origin}@main",
            "--input",
            str(notes),
            "--",
            "sh",
            "-c",
            script,
        )
        assert r.code == 0, r.err
        job = s.api("GET", "/api/v1/jobs", params={"limit": 1}).json()[0]["id"]
        out = tmp_path / "back"
        assert s.cli("job", "fetch", str(job), str(out)).code == 0
        assert {p.name for p in out.iterdir()} == {"repo.bundle", "repo.patch"}
        subprocess.run(
            ["git", "-C", str(origin), "fetch", "-q", str(out / "repo.bundle"), "HEAD:from-job"],
            check=True,
        )
        log = subprocess.run(
            ["git", "-C", str(origin), "log", "--format=%s", "from-job"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        assert log[:2] == ["from the job", "first"]
        patch = (out / "repo.patch").read_text()
        assert "+three" in patch and "notes.txt" not in patch

    def test_the_jobs_git_config_does_not_run_when_its_outputs_are_collected(
        self, server_factory, worker_factory, tmp_path
    ):
        """A job that leaves core.fsmonitor, a hook and a clean filter naming a script that
        writes into $BERTH_OUTPUT: nothing runs it after the job, under the job's uid or any
        other, and its commit and edit still come back."""
        origin = tmp_path / "origin"
        git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
        subprocess.run(["git", "init", "-q", "-b", "main", str(origin)], check=True)
        (origin / "README").write_text("one\n")
        subprocess.run([*git, "-C", str(origin), "add", "README"], check=True)
        subprocess.run([*git, "-C", str(origin), "commit", "-qm", "first"], check=True)
        s = server_factory(GPU, builtin_worker=False)
        remote(s, worker_factory, "--allow-local-repos")
        script = textwrap.dedent(
            """
            echo two >> README
            git -c user.email=job@example.com -c user.name=job commit -qam "from the job"
            echo three >> README
            evil="$HOME/evil.sh"
            printf '#!/bin/sh\\necho "$0 $*" >> %s/marker\\ncat\\n' "$BERTH_OUTPUT" > "$evil"
            chmod +x "$evil"
            git config core.fsmonitor "$evil"
            cp "$evil" .git/hooks/post-index-change
            git config core.hooksPath "$PWD/.git/hooks"
            git config filter.evil.clean "$evil clean"
            echo '* filter=evil' > .gitattributes
            """
        )
        r = s.cli(
            "job",
            "submit",
            "--wait",
            "--pool",
            "gpu",
            "--repo",
            f"{origin}@main",
            "--",
            "sh",
            "-c",
            script,
        )
        assert r.code == 0, r.err
        job = s.api("GET", "/api/v1/jobs", params={"limit": 1}).json()[0]["id"]
        out = tmp_path / "back"
        assert s.cli("job", "fetch", str(job), str(out)).code == 0
        assert {p.name for p in out.iterdir()} == {"repo.bundle", "repo.patch"}
        subprocess.run(
            ["git", "-C", str(origin), "fetch", "-q", str(out / "repo.bundle"), "HEAD:from-job"],
            check=True,
        )
        log = subprocess.run(
            ["git", "-C", str(origin), "log", "--format=%s", "from-job"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        assert log == ["from the job", "first"]
        patch = (out / "repo.patch").read_text()
        assert "+three" in patch and "+* filter=evil" in patch

    def test_a_local_path_is_refused_without_the_workers_consent(
        self, server_factory, worker_factory, tmp_path
    ):
        """Without --allow-local-repos a path (or file://) is not cloned: the job fails saying
        why, and nothing of the path reaches it."""
        s = server_factory(GPU, builtin_worker=False)
        remote(s, worker_factory)
        r = s.cli(
            "job",
            "submit",
            "--wait",
            "--pool",
            "gpu",
            "--repo",
            f"file://{tmp_path}",
            "--",
            "true",
        )
        assert r.code != 0
        job = s.api("GET", "/api/v1/jobs", params={"limit": 1}).json()[0]
        assert job["state"] == "failed" and "repo" in job["error"], job


class TestStoreMismatch:
    def test_a_worker_with_another_store_is_refused_at_hello(
        self, server_factory, worker_factory, tmp_path
    ):
        """A worker whose own [cas] is not the server's store is refused, saying both ids."""
        s = server_factory(GPU, builtin_worker=False)
        home = tmp_path / "worker-other"
        home.mkdir()
        (home / "berth.toml").write_text(f'[cas]\nprovider = "local"\nroot = "{tmp_path / "x"}"\n')
        w = worker_factory(s, s.worker_token("other"), "gpu", name="other")
        r = w.wait(30)
        assert r.code != 0
        assert "artifact store" in r.err and "not the server's" in r.err, r.err
        assert not attached(s, "other")


class TestWorkerKilled:
    def test_kill_9_of_a_worker_loses_at_most_seconds_of_output(
        self, server_factory, worker_factory, shared_dir, sync_db_url
    ):
        """kill -9 of a worker mid-job: the output it had sent is all there, in order, and the
        older part is already in the store (segments), not only in Postgres."""
        s = server_factory(
            {"executor": {"output_tail_kb": 1, "pack_seconds": 0.5}, **GPU}, builtin_worker=False
        )
        w = remote(s, worker_factory)
        pad = "x" * 100
        script = (
            f'i=0; while :; do i=$((i+1)); echo "line $i {pad}"; echo $i > "$SHARED/count"; '
            "sleep 0.02; done"
        )
        r = s.cli(
            "job",
            "submit",
            "--pool",
            "gpu",
            "--env",
            f"SHARED={shared_dir}",
            "--",
            "sh",
            "-c",
            script,
        )
        job = int(r.out.strip())

        async def segments() -> int:
            conn = await asyncpg.connect(plain_url(sync_db_url))
            try:
                return int(
                    await conn.fetchval(
                        "SELECT count(*) FROM job_log_segments WHERE job_id = $1", job
                    )
                )
            finally:
                await conn.close()

        count = shared_dir / "count"
        wait_for(
            lambda: asyncio.run(segments()) >= 2 and int(count.read_text() or 0) >= 300,
            60,
            "300 lines, the older ones packed into the store",
        )
        w.kill(signal.SIGKILL)
        # The job dies with its worker (its lifeline closes): its counter stops.
        wait_for(lambda: _stable(count), 30, "the job to die with its worker")
        printed = int(count.read_text())
        logs = subprocess.run(
            [sys.executable, "-m", "service", "job", "logs", str(job)],
            env=s.env(BERTH_TOKEN=s.token),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        numbers = [int(line.split()[1]) for line in logs.stdout.splitlines()]
        assert numbers == list(range(1, len(numbers) + 1))  # nothing lost in between, in order
        # At most 30 s (SPEC) of the newest output may be missing; here the worker had sent
        # nearly all of it: far fewer than 30 s of lines (50 a second at most).
        print(f"\nkill -9: job printed {printed} lines, {len(numbers)} kept")
        assert printed - len(numbers) < 30 * 50, (printed, len(numbers))
        assert len(numbers) >= 300


def _stable(path) -> bool:
    before = path.read_text()
    time.sleep(0.5)
    return path.read_text() == before


IO_SCRIPT = textwrap.dedent(
    """
    set -e
    sha256sum data/a data/b | cut -c1-64 > "$BERTH_OUTPUT/input.sums"
    head -c 3000000 /dev/urandom > "$BERTH_OUTPUT/made.bin"
    sha256sum "$BERTH_OUTPUT/made.bin" | cut -c1-64
    """
)


class TestS3:
    def test_job_io_through_an_s3_store(
        self,
        server_factory,
        worker_factory,
        s3_endpoint,
        bucket,
        tmp_path,
    ):
        """A server on `[cas] provider = "s3"`: a fleet-wide worker fetches the input from the
        bucket and returns its output there; a tenant-bound worker does the same through the
        server's worker route (the bucket would reach every tenant's blobs), and its outputs
        are referenced for its tenant only."""
        cas = {"provider": "s3", "bucket": bucket, "endpoint_url": s3_endpoint}
        s = server_factory(
            {"cas": {**cas, "region": "us-east-1"}, "pools": {"gpu": {"slots": {"default": 1}}}},
            builtin_worker=False,
        )
        data = tmp_path / "data"
        data.mkdir()
        (data / "a").write_bytes(b"a" * 1000)
        (data / "b").write_bytes(bytes(range(256)) * 100)
        sums = "".join(
            hashlib.sha256(p.read_bytes()).hexdigest() + "\n" for p in (data / "a", data / "b")
        )
        for name, tenant, args in (("fleet", "default", ()), ("bound", "ml", ("--tenant", "ml"))):
            token = s.cli("token", "create", name, "--kind", "worker", *args).out.strip()
            # The store as the welcome hands it out: the workers have no [cas] of their own.
            env = {"BERTH_CONFIG_JSON": json.dumps(FAST)}
            w = worker_factory(s, token, "gpu", "--python", "/usr/bin/python3", name=name, env=env)
            wait_for(lambda n=name: attached(s, n), 20, f"{name} attached")
            r = s.cli(
                "job",
                "submit",
                "--wait",
                "--pool",
                "gpu",
                "--tenant",
                tenant,
                "--input",
                str(data),
                "--",
                "sh",
                "-c",
                IO_SCRIPT,
            )
            assert r.code == 0, r.err
            made = r.out.strip().splitlines()[-1]
            job = s.api("GET", "/api/v1/jobs", params={"limit": 1}).json()[0]
            assert job["worker"] == name and job["tenant"] == tenant, job
            out = tmp_path / f"out-{name}"
            assert s.cli("job", "fetch", str(job["id"]), str(out)).code == 0
            assert (out / "input.sums").read_text() == sums
            assert hashlib.sha256((out / "made.bin").read_bytes()).hexdigest() == made
            r = s.api("HEAD", f"/api/v1/cas/{made}", params={"tenant": tenant})
            assert r.status_code == 200
            other = "ml" if tenant == "default" else "default"
            assert s.api("HEAD", f"/api/v1/cas/{made}", params={"tenant": other}).status_code == 404
            w.stop()
            wait_for(lambda n=name: not attached(s, n), 20, f"{name} gone")


class TestMemory:
    @pytest.mark.slow
    @pytest.mark.timeout(900)
    def test_a_worker_capped_at_256_mib_moves_a_gib_each_way(
        self, server_factory, worker_factory, tmp_path
    ):
        """A worker (and its job) in a cgroup v1 memory group of 256 MiB fetches a 1 GiB input
        and uploads a 1 GiB output; both arrive whole."""
        s = server_factory(GPU, builtin_worker=False)
        big = tmp_path / "big.bin"
        with big.open("wb") as f:
            for chunk in generated(1024):
                f.write(chunk)
        name = hashlib.sha256()
        with big.open("rb") as f:
            while chunk := f.read(1 << 20):
                name.update(chunk)
        w = worker_factory(s, s.worker_token("gpu1"), "gpu", "--python", "/usr/bin/python3")
        with memory_cap(w.proc, 256 * MIB) as group:
            wait_for(lambda: attached(s, "gpu1"), 20, "gpu1 attached")
            script = 'sha256sum big.bin | cut -c1-64; cp big.bin "$BERTH_OUTPUT/copy.bin"'
            r = s.cli(
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
                script,
                timeout=800,
            )
            assert r.code == 0, r.err
            assert r.out.strip().splitlines()[-1] == name.hexdigest()
            job = s.api("GET", "/api/v1/jobs", params={"limit": 1}).json()[0]["id"]
            outputs = shown(s, job)["outputs"]
            assert [(o["path"], o["sha256"], o["size"]) for o in outputs] == [
                ("copy.bin", name.hexdigest(), 1 << 30)
            ]
            assert w.proc.poll() is None
            peak = int((group / "memory.max_usage_in_bytes").read_text())
            assert peak <= 256 * MIB
        big.unlink()


class TestBoundWorkerStore:
    def test_a_tenant_bound_worker_with_the_servers_store_is_still_refused(
        self, server_factory, worker_factory
    ):
        """Even the server's own store, named in a tenant-bound worker's [cas], is refused: it
        would reach every tenant's blobs; the worker is told to go through the server."""
        s = server_factory(GPU, builtin_worker=False)
        cas = {"provider": "local", "root": str(s.home / "cas")}
        token = s.cli("token", "create", "bound", "--kind", "worker", "--tenant", "ml").out.strip()
        env = {"BERTH_CONFIG_JSON": json.dumps({**FAST, "cas": cas})}
        w = worker_factory(s, token, "gpu", name="bound", env=env)
        r = w.wait(30)
        assert r.code != 0 and "only through the server" in r.err, r.err


HOSTILE_RELAY_JOB = textwrap.dedent(
    """
    import json, os, time
    from berth_runtime.relay import RelayError, call
    from berth_runtime import emit
    me = os.environ["BERTH_JOB_ID"]
    for _ in range(2048):
        print("y" * 1023, flush=True)  # 2 MiB of output, for the logs call below
    asks = {
        "nan": {"op": "emit", "values": {"loss": float("nan")}},
        "inf": {"op": "emit", "values": {"loss": float("inf")}},
        "many": {"op": "emit", "values": {f"m{i}": 1 for i in range(300)}},
        "long_name": {"op": "emit", "values": {"m" * 200: 1}},
        "control": {"op": "emit", "values": {"a\\u0001b": 1}},
        "patch": {"op": "api", "method": "PATCH", "path": f"/api/v1/jobs/{me}", "body": None},
        "outside": {"op": "api", "method": "GET", "path": "/metrics", "body": None},
        "long_path": {"op": "api", "method": "GET", "path": "/api/v1/jobs?" + "a" * 5000,
                      "body": None},
        "big_body": {"op": "api", "method": "POST", "path": "/api/v1/jobs",
                     "body": {"command": ["\\u00ff" * 700000]}},
        "ref": {"op": "load", "ref": "f" * 3000},
    }
    said = {}
    for name, ask in asks.items():
        try:
            answer = call(ask)
            said[name] = answer.get("status", "ok")
        except RelayError as exc:
            said[name] = str(exc)
    # The 2 MiB reaches the server as the worker streams it: ask until it is all there.
    logs = {"op": "api", "method": "GET", "path": f"/api/v1/jobs/{me}/logs", "body": None}
    for _ in range(300):
        said["logs"] = call(logs)["status"]
        if said["logs"] != 200:
            break
        time.sleep(0.1)
    emit(loss=1.0)
    print(json.dumps(said))
    """
)


class TestHostileRelay:
    def test_bad_values_stop_at_the_worker(self, server_factory, worker_factory, tmp_path):
        """A job that feeds its relay what the protocol refuses (NaN, 300 metrics, a PATCH, a
        5000-character path, a 1.4 MB body, a 3000-character ref) gets an error for each; the
        worker keeps its session (its own jobs go on), and a relayed answer over 1 MiB is 413."""
        s = server_factory(GPU, builtin_worker=False)
        remote(s, worker_factory)
        script = tmp_path / "hostile.py"
        script.write_text(HOSTILE_RELAY_JOB)
        r = s.cli("job", "submit", "--wait", "--pool", "gpu", "--python", str(script), timeout=120)
        assert r.code == 0, r.err
        said = json.loads(r.out.strip().splitlines()[-1])
        for name in ("nan", "inf"):
            assert "finite" in said[name], said
        for name in ("many", "long_name", "control"):
            assert "metrics refused" in said[name], said
        for name in ("patch", "long_path", "outside"):  # the worker's 400, never sent
            assert said[name] == 400, said
        # Over the relay's 1 MiB request line: refused before it is read whole.
        assert "bad request" in said["big_body"] or "closed the relay" in said["big_body"]
        assert "not a sha256 name" in said["ref"]
        assert said["logs"] == 413
        job = s.api("GET", "/api/v1/jobs", params={"limit": 1}).json()[0]
        assert job["metrics"] == {"loss": 1.0}
        worker = next(w for w in s.api("GET", "/api/v1/workers").json() if w["name"] == "gpu1")
        assert worker["attached"]
        assert "worker_refused" not in s.log() and "bad_frame" not in s.log()
