"""Every CLI command, found in the argparse tree, fails in one line with a documented code.

Sweeps run each command as a real `python -m service` process: with a closed stdout pipe, a bad
database URL and no server; then against a real server with a closed stdout pipe. Neither may
ever print a traceback. And the server's commands on an install without the server's packages
say what to install.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli import SERVER_PACKAGES
from service.core.exits import Exit
from tests.cli_tree import commands, parsers
from tests.procs import free_port, wait_for

DOCUMENTED = {int(e) for e in Exit}
OWN_FAILURES = {e for e in DOCUMENTED if e >= Exit.BUG}
# These serve until stopped; the no-server sweep covers them (they stop at the bad config).
LONG_RUNNING = {("serve",), ("cas", "serve")}


def run_closed_stdout(argv: tuple[str, ...], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """Run `berth ARGV` with stdout a pipe whose reader has gone; (exit code, stderr)."""
    read, write = os.pipe()
    os.close(read)  # as `| head -0`: every write to stdout fails with EPIPE
    try:
        r = subprocess.run(
            [sys.executable, "-m", "service", *argv],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            cwd=cwd,
            check=False,
        )
    finally:
        os.close(write)
    return r.returncode, r.stderr


def one_berth_line(err: str) -> bool:
    lines = err.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("berth: error: ")


def base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    env.update(BERTH_HOME=str(home), PYTHONUNBUFFERED="1")
    return env


class TestEveryCommand:
    def test_the_tree_is_read(self, tmp_path):
        """The sweep finds the commands of SPEC section 2, so it cannot pass by finding none."""
        names = {c.name for c in commands(tmp_path)}
        assert {"serve", "job submit", "audit list", "cas get", "worker rm", "db current"} <= names
        assert len(names) >= 35

    def test_no_server_bad_database_closed_stdout(self, tmp_path):
        """Each command: one `berth: error:` line, a code of berth's own, never a traceback."""
        env = base_env(tmp_path / "home")
        env.update(
            BERTH_SERVER=f"http://127.0.0.1:{free_port()}",
            BERTH_TOKEN="brt_" + "s" * 43,
            BERTH_DATABASE_URL="mysql://x/y",
        )
        failures = []
        for cmd in commands(tmp_path / "files"):
            code, err = run_closed_stdout(cmd.argv, env, tmp_path)
            if "Traceback" in err or not one_berth_line(err) or code not in OWN_FAILURES:
                failures.append((cmd.name, code, err[-600:]))
        assert failures == []

    def test_against_a_server_with_closed_stdout(self, server_factory, tmp_path):
        """With a server, output to a closed pipe ends quietly (141); errors stay one line."""
        s = server_factory()
        r = s.cli("job", "submit", "--wait", "--", "true")
        assert r.code == 0, r.err  # job 1 has ended: `job wait 1` and co. return at once
        env = s.env(BERTH_TOKEN=s.token)
        seen: dict[str, int] = {}
        failures = []
        for cmd in commands(tmp_path / "files"):
            if cmd.path in LONG_RUNNING:
                continue
            code, err = run_closed_stdout(cmd.argv, env, tmp_path)
            seen[cmd.name] = code
            quiet_pipe = code == Exit.PIPE_CLOSED and err == ""
            one_line = code in OWN_FAILURES and one_berth_line(err)
            done = code == 0 and "Traceback" not in err
            if not (quiet_pipe or one_line or done):
                failures.append((cmd.name, code, err[-600:]))
        assert failures == []
        # Listings print, so they met the closed pipe: quietly, with the code for it.
        for name in ("audit list", "job list", "token list", "status", "db current"):
            assert seen[name] == Exit.PIPE_CLOSED, (name, seen[name])

    def test_audit_list_and_cas_get_into_a_closed_pipe(self, server_factory, tmp_path):
        """`audit list | head -1` and `cas get SHA | head -c 10`: exit 141, nothing on stderr."""
        s = server_factory(builtin_worker=False)
        blob = tmp_path / "blob.bin"
        blob.write_bytes(os.urandom(1 << 20))  # more than a pipe holds
        put = s.cli("cas", "put", str(blob))
        assert put.code == 0, put.err
        env = s.env(BERTH_TOKEN=s.token)
        for argv in (("audit", "list"), ("cas", "get", put.out.strip())):
            code, err = run_closed_stdout(argv, env, tmp_path)
            assert (code, err) == (Exit.PIPE_CLOSED, ""), argv


BLOCKER = """
import importlib.abc, runpy, sys
BLOCKED = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
sys.argv = ["berth", *sys.argv[2:]]
runpy.run_module("service", run_name="__main__", alter_sys=True)
"""


def run_without_server_packages(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`berth ARGV` as on a worker-only install: the server's packages cannot be imported."""
    env = base_env(tmp_path / "home")
    env.update(BERTH_SERVER=f"http://127.0.0.1:{free_port()}", BERTH_TOKEN="brt_" + "s" * 43)
    return subprocess.run(
        [sys.executable, "-c", BLOCKER, ",".join(sorted(SERVER_PACKAGES)), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )


class TestWorkerOnlyInstall:
    @pytest.mark.parametrize(
        "argv",
        [
            ("serve",),
            ("cas", "serve"),
            ("db", "current"),
            ("db", "upgrade"),
            ("db", "admin-token", "x"),
            ("audit", "verify"),
            ("audit", "head"),
        ],
        ids=" ".join,
    )
    def test_server_commands_say_what_to_install(self, tmp_path, argv):
        """A server command there: one line naming berth[server], exit 207, no traceback."""
        r = run_without_server_packages(tmp_path, *argv)
        assert r.returncode == Exit.NOT_INSTALLED, r.stderr
        assert one_berth_line(r.stderr) and "pip install 'berth[server]'" in r.stderr

    def test_client_commands_still_work(self, tmp_path):
        """The worker and the client commands need none of them: they run (and fail as usual)."""
        assert run_without_server_packages(tmp_path, "worker", "--help").returncode == 0
        r = run_without_server_packages(tmp_path, "job", "list")
        assert r.returncode == Exit.UNREACHABLE and one_berth_line(r.stderr), r.stderr


class TestBadDatabaseUrl:
    @pytest.mark.parametrize(
        ("url", "words"),
        [
            ("mysql://x/y", "uses mysql://: berth needs PostgreSQL"),
            ("postgresql://u:hunter2@db:notaport/berth", "is malformed"),
            ("not a url", "is not a URL"),
        ],
    )
    def test_one_line_naming_the_variable_never_the_password(self, tmp_path, url, words):
        """db current, serve and audit verify: one line naming BERTH_DATABASE_URL, exit 201."""
        env = base_env(tmp_path / "home")
        env["BERTH_DATABASE_URL"] = url
        for argv in (("db", "current"), ("serve",), ("audit", "verify")):
            r = subprocess.run(
                [sys.executable, "-m", "service", *argv],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert r.returncode == Exit.BAD_INPUT and one_berth_line(r.stderr), (argv, r.stderr)
            assert "BERTH_DATABASE_URL" in r.stderr and words in r.stderr, r.stderr
            assert "hunter2" not in r.stderr

    def test_a_database_that_refuses_or_is_absent(self, pg_admin_url, tmp_path):
        """A database that does not exist is refused (202); a closed port cannot be reached
        (205); both in one line."""
        env = base_env(tmp_path / "home")
        base = pg_admin_url.rsplit("/", 1)[0]
        for url, code in (
            (f"{base}/berth_no_such_database", Exit.REFUSED),
            (f"postgresql://root@127.0.0.1:{free_port()}/x", Exit.UNREACHABLE),
        ):
            env["BERTH_DATABASE_URL"] = url
            r = subprocess.run(
                [sys.executable, "-m", "service", "db", "current"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert r.returncode == code and one_berth_line(r.stderr), (url, r.stderr)


# For each command that offers --json: arguments that succeed against the server of the test
# below (job 1 has ended; worker w1 has stopped; a secret and a limit exist). A command that
# offers --json and is missing here fails the test: add it.
JSON_ARGS: dict[str, tuple[str, ...]] = {
    # Job 2 (another tenant's member's) asked for approvals 1 and 2; first, before `job cancel 2`.
    "approval list": ("approval", "list"),
    "approval show": ("approval", "show", "1"),
    "approval approve": ("approval", "approve", "1"),
    "approval deny": ("approval", "deny", "2"),
    "token create": ("token", "create", "made"),
    "token list": ("token", "list"),
    "token revoke": ("token", "revoke", "made"),
    "worker list": ("worker", "list"),
    "worker drain": ("worker", "drain", "w1"),
    "worker disable": ("worker", "disable", "w1"),
    "worker enable": ("worker", "enable", "w1"),
    "worker join-token": ("worker", "join-token", "--pool", "serve"),
    "worker rm": ("worker", "rm", "w1"),
    "job submit": ("job", "submit", "--", "true"),
    "job list": ("job", "list"),
    "job show": ("job", "show", "1"),
    "job cancel": ("job", "cancel", "2"),
    "job wait": ("job", "wait", "1"),
    "job fetch": ("job", "fetch", "1"),
    "job logs": ("job", "logs", "1"),
    "pool list": ("pool", "list"),
    "status": ("status",),
    "limits set": ("limits", "set", "pools.serve.slots.default=3", "--reason", "sweep"),
    "limits list": ("limits", "list"),
    "limits unset": ("limits", "unset", "pools.serve.slots.default"),
    "secret set": ("secret", "set", "s1", "--stdin"),
    "secret list": ("secret", "list"),
    "secret rm": ("secret", "rm", "s1"),
    "audit list": ("audit", "list"),
}
TWO_ASKS = """
import threading
from berth_runtime import request_approval
asks = [threading.Thread(target=request_approval, args=(t,)) for t in ("one", "two")]
[a.start() for a in asks]
[a.join() for a in asks]
"""
# `berth worker` itself runs a worker: its --json belongs to `worker list`.
NOT_A_JSON_COMMAND = {"worker"}


class TestJson:
    def test_every_listing_offers_json(self, tmp_path):
        """Each `list` command, and status, takes --json; no --help says `default None`."""
        for cmd in commands(tmp_path):
            if cmd.path[-1:] == ("list",) or cmd.path == ("status",):
                assert cmd.json, cmd.name
        for path, leaf in parsers():
            assert "None" not in leaf.format_help(), path

    def test_json_is_json_wherever_it_is_offered(self, server_factory, worker_factory, tmp_path):
        """Every command offering --json prints one JSON document (with -f: one per line)."""
        s = server_factory()
        assert s.cli("job", "submit", "--wait", "--", "true").code == 0  # job 1
        w = worker_factory(s, s.worker_token("w1"), "serve", name="a")
        wait_for(
            lambda: any(x["name"] == "w1" for x in s.api("GET", "/api/v1/workers").json()),
            30,
            "w1 attached",
        )
        w.stop()
        asker = s.cli("token", "create", "asker", "--kind", "service", "--tenant", "t").out.strip()
        (tmp_path / "asks.py").write_text(TWO_ASKS)
        asks = s.cli("job", "submit", "--python", str(tmp_path / "asks.py"), token=asker)
        assert asks.code == 0, asks.err  # job 2
        wait_for(lambda: len(s.api("GET", "/api/v1/approvals").json()) == 2, 60, "2 requests")
        offered = {c.name for c in commands(tmp_path / "files") if c.json} - NOT_A_JSON_COMMAND
        assert offered == set(JSON_ARGS), offered ^ set(JSON_ARGS)
        env = s.env(BERTH_TOKEN=s.token)
        for name, argv in JSON_ARGS.items():
            r = subprocess.run(
                [sys.executable, "-m", "service", *argv, "--json"],
                env=env,
                input="a secret\n",
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                cwd=tmp_path,
            )
            assert r.returncode == 0, (name, r.stderr)
            try:
                json.loads(r.stdout)
            except ValueError:
                raise AssertionError((name, r.stdout[:300])) from None
