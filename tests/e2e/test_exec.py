"""`berth job exec` / `berth job shell` with real processes: a server, a root worker with
per-job uids and namespaces, the CLI (on a PTY, driven by pexpect, where a terminal is needed)."""

import asyncio
import json
import sys
import textwrap

import httpx
import pexpect
import pytest
from websockets.asyncio.client import connect
from websockets.sync.client import connect as sync_connect

from service.core.exits import Exit
from tests.e2e.test_trust import attached, finished, submit
from tests.procs import wait_for

UID = 61760
SECRET = "exec-secret-value-8842"
# The job writes mine.txt and a file in its private /tmp, says so, and waits.
JOB = textwrap.dedent(
    """
    echo hello-from-the-job > mine.txt
    echo private > /tmp/only-the-job-sees-me
    echo ready
    exec sleep 600
    """
)


def running(s, job_id: int) -> bool:
    if s.api("GET", f"/api/v1/jobs/{job_id}").json()["state"] != "running":
        return False
    logs = s.api("GET", f"/api/v1/jobs/{job_id}/logs").json()
    return "ready" in "".join(c["data"] for c in logs["chunks"])


def start(server_factory, worker_factory, exec_policy: str | None):
    pool: dict = {"slots": {"default": 2}}
    if exec_policy is not None:
        pool["exec"] = exec_policy
    s = server_factory({"pools": {"gpu": pool}}, builtin_worker=False)
    worker_factory(s, s.worker_token("gpu1"), "gpu", "--uid-range", f"{UID}-{UID + 3}")
    wait_for(lambda: attached(s, "gpu1"), 30, "gpu1 attached")
    r = s.api("PUT", "/api/v1/secrets/exec-key", json={"value": SECRET, "tenant": "default"})
    assert r.status_code in (200, 201), r.text
    job = submit(
        s,
        {"command": ["sh", "-c", JOB], "pool": "gpu", "secrets": {"MY_SECRET": "exec-key"}},
    )
    wait_for(lambda: running(s, job), 60, f"job {job} running")
    return s, job


def token(s, name: str, kind: str, tenants: list[str]) -> str:
    r = s.api("POST", "/api/v1/tokens", json={"name": name, "kind": kind, "tenants": tenants})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def spawn(s, *args: str, rows: int = 24, cols: int = 80) -> pexpect.spawn:
    """The CLI on a PTY of the given size, as a person at a terminal runs it."""
    return pexpect.spawn(
        sys.executable,
        ["-m", "service", *args],
        env=s.env(BERTH_TOKEN=s.token),
        dimensions=(rows, cols),
        timeout=60,
    )


def ended(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus if child.exitstatus is not None else 128 + child.signalstatus


@pytest.fixture
def member_pool(server_factory, worker_factory):
    return start(server_factory, worker_factory, "member")


class TestExec:
    def test_exec_beside_a_running_job(self, member_pool):
        """The exec'd command runs in the job's folder, as its uid, in its private /tmp, with
        its environment (secrets masked on the way back); exit codes come back."""
        s, job = member_pool
        r = s.cli("job", "exec", str(job), "--", "cat", "mine.txt")
        assert r.code == 0, r.err
        assert r.out == "hello-from-the-job\n"
        r = s.cli("job", "exec", str(job), "--", "sh", "-c", "id -u; cat /tmp/only-the-job-sees-me")
        assert r.code == 0, r.err
        uid, private = r.out.split()
        assert UID <= int(uid) <= UID + 3
        assert private == "private"
        r = s.cli("job", "exec", str(job), "--", "sh", "-c", "echo oops >&2; exit 7")
        assert r.code == 7
        assert "oops" in r.err
        r = s.cli(
            "job", "exec", str(job), "--", "sh", "-c", 'echo "s=$MY_SECRET"; echo "$MY_SECRET" >&2'
        )
        assert r.code == 0, r.err
        assert r.out == "s=***\n"
        assert SECRET not in r.err and "***" in r.err
        # stdin reaches the command
        r = s.cli("job", "exec", str(job), "--", "wc", "-c", stdin="12345")
        assert r.out.strip() == "5", r.err

    def test_refusals(self, member_pool):
        """Another tenant's member: 404. A finished job: refused with its state. Every session
        is in the audit log with its command and exit code."""
        s, job = member_pool
        other = token(s, "b-member", "service", ["b"])
        r = s.cli("job", "exec", str(job), "--", "true", token=other)
        assert r.code == Exit.NOT_FOUND, r.err
        assert f"no job {job}" in r.err
        done = submit(s, {"command": ["true"], "pool": "gpu"})
        finished(s, done)
        r = s.cli("job", "exec", str(done), "--", "true")
        assert r.code == Exit.CONFLICT
        assert "succeeded" in r.err and "running job" in r.err
        r = s.cli("job", "exec", str(job))
        assert r.code == Exit.BAD_INPUT
        assert "say what to run" in r.err
        url = s.url.replace("http", "ws", 1) + f"/api/v1/jobs/{job}/exec"
        with sync_connect(url, additional_headers={"Authorization": f"Bearer {s.token}"}) as ws:
            ws.send(json.dumps({"command": "cat"}))
            said = json.loads(ws.recv(timeout=30))
        assert (said["type"], said["status"]) == ("error", 400), said
        assert "$.command" in said["error"]
        assert s.cli("job", "exec", str(job), "--", "sh", "-c", "exit 3").code == 3
        entries = s.api("GET", "/api/v1/audit", params={"limit": 50}).json()
        opened = [e for e in entries if e["action"] == "job.exec" and e["target"] == str(job)]
        closed = [e for e in entries if e["action"] == "job.exec_ended"]
        assert any(e["detail"]["command"] == ["sh", "-c", "exit 3"] for e in opened), opened
        assert any(e["detail"]["exit_code"] == 3 for e in closed), closed

    def test_tty_size_resize_and_ctrl_c(self, member_pool):
        """With --tty the command sees the terminal's size, and a resize; Ctrl-C ends the
        command only: the job goes on."""
        s, job = member_pool
        child = spawn(
            s, "job", "exec", str(job), "--tty", "--", "sh", "-c",
            "stty size; while read x; do stty size; done",
            rows=33, cols=101,
        )  # fmt: skip
        child.expect("33 101")
        child.setwinsize(40, 120)
        # The resize and the newline travel separately: ask again until the new size shows.
        wait_for(
            lambda: child.sendline("") and child.expect(["40 120", "33 101"]) == 0, 30, "resize"
        )
        child.sendcontrol("c")
        assert ended(child) == 130  # SIGINT: the command's, through its terminal
        assert s.api("GET", f"/api/v1/jobs/{job}").json()["state"] == "running"
        assert s.cli("job", "exec", str(job), "--", "cat", "mine.txt").code == 0

    def test_ctrl_c_without_tty(self, member_pool):
        """Without --tty, Ctrl-C sends SIGINT to the command's group, not to the job."""
        s, job = member_pool
        child = spawn(s, "job", "exec", str(job), "--", "sh", "-c", "echo started; exec sleep 600")
        child.expect("started")
        child.kill(2)
        assert ended(child) == 130
        assert s.api("GET", f"/api/v1/jobs/{job}").json()["state"] == "running"

    def test_exec_ends_with_the_lease(self, member_pool):
        """Cancelling the job ends its exec sessions, saying why."""
        s, job = member_pool
        child = spawn(s, "job", "exec", str(job), "--", "sh", "-c", "echo started; exec sleep 600")
        child.expect("started")
        assert s.api("POST", f"/api/v1/jobs/{job}/cancel").status_code == 200
        child.expect("the job's lease ended")
        assert ended(child) == 128 + 9  # killed

    def test_shell(self, member_pool):
        """`job shell` gives a shell on a terminal, in the job's folder, with its environment."""
        s, job = member_pool
        child = spawn(s, "job", "shell", str(job))
        child.expect(r"\$ ")  # its prompt, as a person waits for it
        child.sendline("echo answer-$((6*7))-$BERTH_JOB_ID; cat mine.txt")
        child.expect(f"answer-42-{job}")
        child.expect("hello-from-the-job")
        child.sendline("exit 4")
        assert ended(child) == 4


class TestPolicy:
    def test_off_binds_admins_too(self, server_factory, worker_factory):
        s, job = start(server_factory, worker_factory, "off")
        r = s.cli("job", "exec", str(job), "--", "true")
        assert r.code == Exit.REFUSED
        assert 'exec is off in pool gpu ([pools.gpu] exec = "off")' in r.err

    def test_operator_is_the_default(self, server_factory, worker_factory):
        s, job = start(server_factory, worker_factory, None)
        member = token(s, "a-member", "service", ["default"])
        r = s.cli("job", "exec", str(job), "--", "true", token=member)
        assert r.code == Exit.REFUSED
        assert '[pools.gpu] exec = "operator"' in r.err
        operator = token(s, "a-operator", "operator", ["default"])
        r = s.cli("job", "exec", str(job), "--", "cat", "mine.txt", token=operator)
        assert (r.code, r.out) == (0, "hello-from-the-job\n"), r.err


SESSIONS = 200


async def one_session(url: str, token: str, all_open: "asyncio.Event", opened: list[int]) -> tuple:
    """One exec: wait until every session shows the job's file, then end stdin; its exit."""
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                       open_timeout=120, compression=None) as ws:  # fmt: skip
        await ws.send(json.dumps({"command": ["sh", "-c", "cat mine.txt; cat >/dev/null"]}))
        assert json.loads(await ws.recv())["type"] == "started"
        out = b""
        while b"hello-from-the-job\n" not in out:
            message = await ws.recv()
            assert isinstance(message, bytes), message
            out += message[1:]
        opened.append(1)
        if len(opened) == SESSIONS:
            all_open.set()
        await all_open.wait()
        await ws.send(json.dumps({"eof": True}))
        async for message in ws:
            if isinstance(message, str) and json.loads(message)["type"] == "exit":
                return out, json.loads(message)["exit_code"]
    return out, None


async def many_sessions(s, job: int) -> tuple[list, list[str]]:
    """SESSIONS execs at once from one client, every worker's state watched all along."""
    url = s.url.replace("http", "ws", 1) + f"/api/v1/jobs/{job}/exec"
    all_open, opened, seen = asyncio.Event(), [], []

    async def watch() -> None:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {s.token}"}) as http:
            while True:
                workers = (await http.get(f"{s.url}/api/v1/workers", timeout=30)).json()
                seen.extend(
                    f"{w['name']}: {w['state']}, attached={w['attached']}"
                    for w in workers
                    if w["state"] in ("unreachable", "lost") or not w["attached"]
                )
                await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch())
    try:
        results = await asyncio.gather(
            *(one_session(url, s.token, all_open, opened) for _ in range(SESSIONS))
        )
    finally:
        watcher.cancel()
    return results, seen


@pytest.mark.slow
class TestManySessions:
    def test_200_sessions_leave_every_worker_reachable(self, server_factory, worker_factory):
        """200 exec sessions at once, from one async client, through one server: every one
        runs and exits 0, and no worker (the job's or the idle one) goes unreachable with
        heartbeat_seconds = 0.5 and unreachable_seconds = 2.5."""
        s = server_factory(
            {
                "executor": {"heartbeat_seconds": 0.5, "unreachable_seconds": 2.5},
                "pools": {"gpu": {"slots": {"default": 1}, "exec": "member"}},
            },
            builtin_worker=False,
        )
        for name, uid in (("gpu1", UID), ("gpu2", UID + 2)):
            worker_factory(
                s, s.worker_token(name), "gpu", "--uid-range", f"{uid}-{uid + 1}", name=name
            )
            wait_for(lambda n=name: attached(s, n), 30, f"{name} attached")
        job = submit(s, {"command": ["sh", "-c", JOB], "pool": "gpu"})
        wait_for(lambda: running(s, job), 60, f"job {job} running")
        results, seen = asyncio.run(many_sessions(s, job))
        assert seen == []
        assert [code for _, code in results] == [0] * SESSIONS
        assert s.api("GET", f"/api/v1/jobs/{job}").json()["state"] == "running"
