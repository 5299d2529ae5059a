"""Logs a person can read: --log-level and --log-format on `serve` and `worker`, JSON lines off a
terminal by default, and the worker's HTTP client quiet below DEBUG."""

import json

from tests.procs import Server, wait_for

SAVE = ["sh", "-c", 'echo data > "$BERTH_OUTPUT/out.txt"']


def attached(s, name: str) -> bool:
    return any(w["name"] == name and w["attached"] for w in s.api("GET", "/api/v1/workers").json())


def run_one_job(s, worker_factory, *args: str, name: str = "w1") -> list[str]:
    """A worker with ARGS runs a job that saves an output (HTTP to the store); its stderr."""
    w = worker_factory(s, s.worker_token(name), "serve", *args, name=name)
    wait_for(lambda: attached(s, name), 30, "attached")
    r = s.cli("job", "submit", "--wait", "--pool", "serve", "--", *SAVE)
    assert r.code == 0, r.err
    w.stop()
    return w.wait(30).err.splitlines()


class TestWorkerLogs:
    def test_json_off_a_terminal_and_no_request_lines(self, server_factory, worker_factory):
        """By default (stderr not a terminal) every line is a JSON object; no HTTP request line."""
        s = server_factory(builtin_worker=False)
        lines = run_one_job(s, worker_factory)
        records = [json.loads(x) for x in lines]
        assert {"timestamp", "level", "logger", "event"} <= set(records[0])
        assert any(r["event"].startswith("attached as w1") for r in records)
        assert not any("HTTP Request" in r["event"] for r in records)

    def test_debug_shows_the_requests_at_debug(self, server_factory, worker_factory):
        """--log-level debug: the HTTP client's request lines appear, at DEBUG."""
        s = server_factory(builtin_worker=False)
        records = [json.loads(x) for x in run_one_job(s, worker_factory, "--log-level", "debug")]
        requests = [r for r in records if r["event"].startswith("HTTP Request")]
        assert requests and {r["level"] for r in requests} == {"debug"}

    def test_console_format_and_level(self, server_factory, worker_factory):
        """--log-format console: lines for people (time, level, message), not JSON; with
        --log-level warning, no info line."""
        s = server_factory(builtin_worker=False)
        lines = run_one_job(s, worker_factory, "--log-format", "console")
        line = next(x for x in lines if "attached as w1" in x)
        assert " INFO attached as w1" in line and not line.startswith("{")
        quiet = run_one_job(
            s, worker_factory, "--log-format", "console", "--log-level", "warning", name="w2"
        )
        assert not any(" INFO " in x for x in quiet), quiet


class TestServerLogs:
    def test_format_and_level(self, tmp_path, sync_db_url):
        """`serve --log-format json` writes JSON lines; console, readable ones; --log-level
        warning leaves out the info lines."""
        for fmt, level in (("json", "info"), ("console", "info"), ("json", "warning")):
            s = Server(
                home=tmp_path / f"{fmt}-{level}",
                db_url=sync_db_url,
                builtin_worker=False,
                args=("--log-format", fmt, "--log-level", level),
            )
            s.start()
            s.stop()
            lines = [x for x in s.log().splitlines() if x.strip()]
            serving = [x for x in lines if "serving" in x]
            if level == "warning":
                assert serving == [], lines[:5]
            elif fmt == "json":
                assert json.loads(serving[0])["event"] == "serving"
            else:
                assert not serving[0].startswith("{") and "[info     ] serving" in serving[0]
