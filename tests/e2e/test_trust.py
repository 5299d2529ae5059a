"""The trust boundary around jobs (SPEC section 4), end to end, with real processes as root.

A job is untrusted code of one tenant: it sees none of its worker's or server's credentials or
settings, runs under a uid of its own, and cannot read another running job's files or
environment. Tokens mint only what their minter could do, and a tenant's own worker serves only
that tenant's jobs.
"""

import base64
import re
import textwrap

import psutil

from tests.procs import wait_for

GPU = {"pools": {"gpu": {"slots": {"default": 2}}}}
SNOOP = textwrap.dedent(
    """
    echo "uid=$(id -u)"
    env
    for f in "$@"; do echo "== $f"; cat "$f" 2>&1; ls "$f" 2>&1; done
    echo "== worker environ"; cat "/proc/$WPID/environ" 2>&1
    echo "== worker cmdline"; tr '\\0' ' ' < "/proc/$WPID/cmdline" 2>&1
    """
)

JOB_VARIABLES = {
    "BERTH_JOB_ID",
    "BERTH_ATTEMPT",
    "BERTH_TENANT",
    "BERTH_OUTPUT",
    "BERTH_PYTHON",
    "BERTH_RELAY",
    "BERTH_RELAY_SECRET",
}


def submit(s, body, token=None) -> int:
    r = s.api("POST", "/api/v1/jobs", token=token, json=body)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def finished(s, job_id: int, timeout: float = 60) -> dict:
    def done():
        shown = s.api("GET", f"/api/v1/jobs/{job_id}").json()
        return shown if shown["state"] in ("succeeded", "failed", "timed_out") else None

    return wait_for(done, timeout, f"job {job_id} to end")


def output(s, job_id: int) -> bytes:
    r = s.api("GET", f"/api/v1/jobs/{job_id}/logs", params={"encoding": "base64"}).json()
    return b"".join(base64.b64decode(c["b64"]) for c in r["chunks"])


def attached(s, name: str) -> bool:
    return any(w["name"] == name and w["attached"] for w in s.api("GET", "/api/v1/workers").json())


def uid_of(text: str) -> int:
    line = next(x for x in text.splitlines() if x.startswith("uid="))
    return int(line.removeprefix("uid="))


class TestAJobSeesNothingOfItsWorker:
    def test_remote_worker(self, server_factory, worker_factory, visible_dir):
        """A job on a root worker runs as its own uid and reads no credential or setting."""
        # Homes where a job sees them (as ~/.berth), so each read is refused, not just missing.
        s = server_factory(GPU, builtin_worker=False, under=visible_dir)
        token = s.worker_token("gpu1")
        w = worker_factory(s, token, "gpu", under=visible_dir)
        wait_for(lambda: attached(s, "gpu1"), 20, "gpu1 attached")
        assert w.proc is not None
        secret_key = (s.home / "secret.key").read_text().strip()
        files = [
            str(s.home / "admin.token"),
            str(s.home / "secret.key"),
            str(w.home),
            str(s.home),
        ]
        j = submit(
            s,
            {
                "command": ["sh", "-c", SNOOP, "snoop", *files],
                "pool": "gpu",
                "env": {"WPID": str(w.proc.pid)},
            },
        )
        assert finished(s, j)["state"] == "succeeded"
        out = output(s, j).decode()
        assert 61000 <= uid_of(out) <= 61999
        for leaked in (token, s.token, secret_key, s.db_url or "", "BERTH_TOKEN", "BERTH_CONFIG"):
            assert leaked and leaked not in out, f"the job saw {leaked[:12]}..."
        assert "BERTH_DATABASE_URL" not in out and "BERTH_SERVER" not in out
        assert out.count("Permission denied") >= len(files)  # each read was refused
        env = dict(x.split("=", 1) for x in out.splitlines() if "=" in x and x[0].isupper())
        assert env["BERTH_JOB_ID"] == str(j) and env["BERTH_TENANT"] == "default"
        assert env["HOME"].endswith(f"/{j}-1") and env["BERTH_OUTPUT"] == env["HOME"] + "/output"

    def test_builtin_worker(self, server_factory):
        """A job of `berth serve`'s own worker reads neither admin.token, secret.key nor the
        server's environment."""
        s = server_factory()
        secret_key = (s.home / "secret.key").read_text().strip()
        server_pid = s.proc.pid
        r = s.cli(
            "job",
            "submit",
            "--wait",
            "--env",
            f"WPID={server_pid}",
            "--",
            "sh",
            "-c",
            SNOOP,
            "snoop",
            str(s.home / "admin.token"),
            str(s.home / "secret.key"),
            str(s.home / "serve-worker"),
        )
        assert r.code == 0, r.err
        assert 61000 <= uid_of(r.out) <= 61999
        for leaked in (s.token, secret_key, s.db_url or ""):
            assert leaked not in r.out, leaked[:12]
        # Only the job's own variables and the runtime's (SPEC section 4), none of the server's.
        assert set(re.findall(r"BERTH_[A-Z_]+", r.out)) <= JOB_VARIABLES, r.out
        assert s.home.stat().st_mode & 0o777 in (0o700, 0o710)
        assert (s.home / "admin.token").stat().st_mode & 0o777 == 0o600

    def test_pass_env_refuses_berth_settings(self, server_factory, worker_factory):
        """`berth worker --pass-env BERTH_TOKEN` is refused with the reason, before it dials."""
        s = server_factory(GPU, builtin_worker=False)
        w = worker_factory(s, s.worker_token("gpu1"), "gpu", "--pass-env", "BERTH_TOKEN")
        r = w.wait(30)
        assert r.code != 0 and "never reach a job" in r.err and "Traceback" not in r.err


class TestJobsOfTwoTenants:
    def test_cannot_read_each_others_files_or_environment(
        self, server_factory, worker_factory, shared_dir
    ):
        """Tenant a's job holds a secret; tenant b's job beside it on the same worker reads
        neither a's working directory nor a's /proc/<pid>/environ."""
        s = server_factory(GPU, builtin_worker=False)
        value = "tenant-a-secret-4f1c2b"
        r = s.api("PUT", "/api/v1/secrets/key", json={"value": value, "tenant": "a"})
        assert r.status_code == 200, r.text
        worker_factory(s, s.worker_token("gpu1"), "gpu")
        wait_for(lambda: attached(s, "gpu1"), 20, "gpu1 attached")
        a_script = textwrap.dedent(
            f"""
            test -n "$KEY" && echo has-secret
            echo "$KEY" > "$HOME/secret.txt"
            echo "$HOME $$" > {shared_dir}/a.tmp && mv {shared_dir}/a.tmp {shared_dir}/a
            i=0; while [ ! -e {shared_dir}/b.done ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
            """
        )
        b_script = textwrap.dedent(
            f"""
            i=0; while [ ! -e {shared_dir}/a ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
            read home pid < {shared_dir}/a
            echo "a is $home $pid"
            cat "$home/secret.txt" 2>&1; ls "$home" 2>&1
            cat "/proc/$pid/environ" 2>&1
            for e in /proc/[0-9]*/environ; do cat "$e" 2>/dev/null; done | tr '\\0' '\\n' | grep -c {value}
            touch {shared_dir}/b.done
            """
        )
        a = submit(
            s,
            {
                "command": ["sh", "-c", a_script],
                "pool": "gpu",
                "tenant": "a",
                "secrets": {"KEY": "key"},
            },
        )
        b = submit(s, {"command": ["sh", "-c", b_script], "pool": "gpu", "tenant": "b"})
        assert finished(s, a)["state"] == "succeeded"
        assert finished(s, b)["state"] in ("succeeded", "failed")  # grep -c 0 exits 1
        a_out, b_out = output(s, a).decode(), output(s, b).decode()
        assert "has-secret" in a_out
        assert "a is /" in b_out, b_out  # b knew exactly where to look
        assert value not in b_out
        assert b_out.count("Permission denied") >= 3
        assert b_out.strip().endswith("0")  # no environment it could read held the value


class TestTokenPowers:
    def test_operator_mints_only_what_it_could_do(self, server_factory):
        """An operator of tenant a mints worker/service/metrics tokens for a, nothing stronger."""
        s = server_factory(builtin_worker=False)
        r = s.cli("token", "create", "op-a", "--kind", "operator", "--tenant", "a")
        assert r.code == 0, r.err
        op = r.out.strip()

        def mint(name, kind, *tenants):
            body = {"name": name, "kind": kind, "tenants": list(tenants)}
            return s.api("POST", "/api/v1/tokens", token=op, json=body)

        for kind, tenants, words in [
            ("admin", (), "not admin tokens"),
            ("operator", ("a",), "not operator tokens"),
            ("worker", (), "only an admin"),
            ("worker", ("b",), "tenant 'b'"),
            ("service", ("a", "b"), "tenant 'b'"),
        ]:
            refused = mint(f"x-{kind}-{len(tenants)}", kind, *tenants)
            assert refused.status_code == 403, refused.text
            assert words in refused.json()["error"]
        for kind in ("worker", "service", "metrics"):
            assert mint(f"ok-{kind}", kind, "a").status_code == 201
        seen = {t["name"] for t in s.api("GET", "/api/v1/tokens", token=op).json()}
        assert seen == {"ok-worker", "ok-service", "ok-metrics"}  # never the admin's
        assert s.cli("token", "create", "x", "--kind", "admin", token=op).code != 0

    def test_tenant_worker_never_receives_another_tenants_lease(
        self, server_factory, worker_factory
    ):
        """A worker token an operator of a minted serves a's jobs; b's wait, saying why."""
        s = server_factory(GPU, builtin_worker=False)
        op = s.cli("token", "create", "op-a", "--kind", "operator", "--tenant", "a").out.strip()
        r = s.cli("token", "create", "a-box", "--kind", "worker", "--tenant", "a", token=op)
        assert r.code == 0, r.err
        worker_factory(s, r.out.strip(), "gpu")
        wait_for(lambda: attached(s, "a-box"), 20, "a-box attached")
        b_jobs = [submit(s, {"command": ["true"], "pool": "gpu", "tenant": "b"}) for _ in range(3)]
        a_job = submit(s, {"command": ["true"], "pool": "gpu", "tenant": "a"})
        assert finished(s, a_job)["worker"] == "a-box"
        worker = next(w for w in s.api("GET", "/api/v1/workers").json() if w["name"] == "a-box")
        assert worker["tenants"] == ["a"] and worker["no_lease"] == "nothing"
        for j in b_jobs:
            shown = s.api("GET", f"/api/v1/jobs/{j}").json()
            assert (shown["state"], shown["attempt"]) == ("queued", 0)
            assert shown["waiting_for"] == "no attached worker of pool gpu serves tenant b"


class TestOutputIsBytes:
    def test_binary_jobs_beside_good_jobs(self, server_factory, worker_factory):
        """Jobs printing NULs and binary noise leave every other job's output whole, and their
        own output is kept byte for byte."""
        s = server_factory(GPU, builtin_worker=False)
        for name in ("w1", "w2"):
            worker_factory(s, s.worker_token(name), "gpu", name=name)
        wait_for(lambda: attached(s, "w1") and attached(s, "w2"), 20, "two workers")
        noise = "printf 'a\\000b\\377\\376\\000'; head -c 3000 /dev/urandom | od -An | head -c 0; printf '\\200\\000end'"
        expected = b"a\x00b\xff\xfe\x00\x80\x00end"
        bad = [submit(s, {"command": ["sh", "-c", noise], "pool": "gpu"}) for _ in range(4)]
        good = [
            submit(s, {"command": ["sh", "-c", f"echo good-{i}"], "pool": "gpu"}) for i in range(24)
        ]
        for j in bad + good:
            assert finished(s, j)["state"] == "succeeded"
        for i, j in enumerate(good):
            assert output(s, j) == f"good-{i}\n".encode()
        for j in bad:
            assert output(s, j) == expected
            text = s.api("GET", f"/api/v1/jobs/{j}/logs").json()["chunks"]
            assert "\ufffd" in "".join(c["data"] for c in text)  # replaced visibly as text


def process_of(job: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("BERTH_JOB_ID") == str(job):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found
