"""schemathesis against a live `berth serve` with no worker attached (fuzzed jobs never run).

Every operation but the worker websocket (not in the document: it speaks service.protocol),
`--checks all`, every phase (examples, coverage, fuzzing, stateful), a fixed seed: 0 failures.
As an admin, each operation answers 2xx at least once (the worker's CAS routes with a worker's
token: no other role may call them); as a member of one tenant, the operations its role lacks
(service/auth/permissions.py GRANTS) answer only the documented 403; the run's own credentials
still work at the end. The UI and /metrics are not in the document (by design), so not here.

tests/schema/hooks.py names what exists on the server (a queued job, a worker that has left, a
blob) so the fuzzer reaches past each 404, and names each blob by its bytes' hash.
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.api.app import ROUTES
from service.auth.callers import Role
from service.auth.permissions import GRANTS, Perm
from service.core.states import TokenKind
from service.domain.tokens import CALLERS
from tests.procs import Server, Worker

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
METHODS = {"get", "put", "post", "delete", "patch", "head"}
WORKER_ONLY = r"^/api/v1/workers/cas/"
# Cases per operation and phase: the three runs take a few minutes on a loaded 2-core machine.
MAX_EXAMPLES = "5"
BLOB = b"a blob the fuzzer finds by name\n"


# An approval exists only once a running job asks for one through its worker's relay (asking is a
# job's call: 403 to anyone else), and no job runs here (no worker stays attached, so that fuzzed
# jobs never run). Their 2xx answers are tested in tests/integration/test_approvals.py and
# tests/e2e/test_approvals.py; here they are fuzzed and checked like every operation.
NEEDS_A_RUNNING_JOB = {
    ("POST", "/api/v1/approvals"),
    ("GET", "/api/v1/approvals/{approval_id}"),
    ("POST", "/api/v1/approvals/{approval_id}/approve"),
    ("POST", "/api/v1/approvals/{approval_id}/deny"),
}


def _schemathesis(
    server: Server, token: str, report: Path, seeds: dict[str, Any], *extra: str
) -> subprocess.CompletedProcess[str]:
    cmd = [
        str(Path(sys.executable).parent / "st"),
        "--config-file",
        str(Path(__file__).with_name("schemathesis.toml")),
        "run",
        f"{server.url}/schema/openapi.json",
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        MAX_EXAMPLES,
        "--seed",
        "1",
        "--workers",
        "1",
        "--no-color",
        "--output-sanitize",
        "false",  # the HAR keeps Authorization: the statuses are sorted by credential
        "-H",
        f"Authorization: Bearer {token}",
        "--report",
        "har",
        "--report-har-path",
        str(report),
        "--request-timeout",
        "30",
        *extra,
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SCHEMATHESIS_HOOKS": "tests.schema.hooks",
        "BERTH_ST_SEEDS": json.dumps(seeds),
    }
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=1500, check=False, env=env, cwd=report.parent
    )


def _operations(document: dict[str, Any]) -> dict[tuple[str, str], re.Pattern[str]]:
    # Literal segments first, as the router matches them (/workers/cas/.id before /workers/{name}).
    paths = sorted(document["paths"], key=lambda p: -len(re.sub(r"\{[^}]+\}", "", p)))
    ops = {}
    for path in paths:
        pattern = re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)) + "$")
        for method in document["paths"][path]:
            if method in METHODS:
                ops[(method.upper(), path)] = pattern
    return ops


def _statuses(
    har: Path, ops: dict[tuple[str, str], re.Pattern[str]], token: str
) -> dict[tuple[str, str], set[int]]:
    """Per operation, the statuses it answered to requests carrying `token`."""
    seen: dict[tuple[str, str], set[int]] = {op: set() for op in ops}
    for entry in json.loads(har.read_text())["log"]["entries"]:
        headers = {h["name"].lower(): h["value"] for h in entry["request"]["headers"]}
        if headers.get("authorization") != f"Bearer {token}":
            continue  # ignored_auth's probes, without or with a bad credential
        method = entry["request"]["method"]
        path = httpx.URL(entry["request"]["url"]).path
        template = next((t for (_, t), pattern in ops.items() if pattern.match(path)), None)
        if (method, template) in seen:
            seen[(method, template)].add(int(entry["response"]["status"]))
    return seen


def _perms() -> dict[tuple[str, str], Perm | None]:
    """(method, path) -> the permission its handler declares (None: public)."""
    out: dict[tuple[str, str], Perm | None] = {}
    for handler in ROUTES:
        for path in handler.paths:
            for method in getattr(handler, "http_methods", ()):  # not the websockets
                out[(method.upper(), re.sub(r"\{(\w+):\w+\}", r"{\1}", path))] = handler.opt.get(
                    "perm"
                )
    return out


def _failures(run: subprocess.CompletedProcess[str]) -> str:
    # Each failure's header and reason first: the full report can be long (large bodies).
    lines = run.stdout.splitlines()
    heads = [x for x in lines if x.startswith(("___", "- ST", "    `{", "[", "    Valid"))]
    return "\n".join(heads)[-10000:] + "\n...\n" + run.stdout[-20000:] + run.stderr[-4000:]


def _seed(server: Server, worker_factory: Any) -> dict[str, Any]:
    """A worker that attached once and left, then a queued job, a cancelled one and a blob."""
    worker: Worker = worker_factory(server, server.worker_token("seed"), "serve", name="seed")
    deadline = time.monotonic() + 120
    names: list[str] = []
    while not names and time.monotonic() < deadline:
        names = [w["name"] for w in server.api("GET", "/api/v1/workers").json()]
        time.sleep(0.2)
    assert names, "the seed worker never attached"
    worker.stop()  # it leaves before any job exists: no job ever runs
    while time.monotonic() < deadline:
        attached = [w["attached"] for w in server.api("GET", "/api/v1/workers").json()]
        if attached == [False]:
            break
        time.sleep(0.2)
    assert attached == [False], attached
    job = server.api("POST", "/api/v1/jobs", json={"command": ["true"]})
    assert job.status_code == 201, job.text
    ended = server.api("POST", "/api/v1/jobs", json={"command": ["true"]})
    assert ended.status_code == 201, ended.text
    cancelled = server.api("POST", f"/api/v1/jobs/{ended.json()['id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    limit = server.api(
        "PUT", "/api/v1/limits/tenants.seed.max_stored_gb", json={"value": 1, "reason": "seed"}
    )
    assert limit.status_code == 200, limit.text
    blob = hashlib.sha256(BLOB).hexdigest()
    put = server.api("PUT", f"/api/v1/cas/{blob}", content=BLOB)
    assert put.status_code == 201, put.text
    return {
        "job": job.json()["id"],
        "ended": ended.json()["id"],
        "blob": blob,
        "worker": names[0],
    }


@pytest.mark.timeout(1200)
def test_admin_run_has_no_failures_and_reaches_every_operation(
    server_factory, worker_factory, tmp_path: Path
) -> None:
    server = server_factory(builtin_worker=False)
    seeds = {**_seed(server, worker_factory), "own_tokens": ["admin"]}
    document = httpx.get(f"{server.url}/schema/openapi.json", timeout=30).json()
    ops = _operations(document)
    admin = _schemathesis(
        server, server.token, tmp_path / "admin.har", seeds, "--exclude-path-regex", WORKER_ONLY
    )
    assert admin.returncode == 0, _failures(admin)
    worker_token = server.worker_token("fuzzer")
    worker = _schemathesis(
        server,
        worker_token,
        tmp_path / "worker.har",
        {**seeds, "own_tokens": ["fuzzer"]},
        "--include-path-regex",
        WORKER_ONLY,
    )
    assert worker.returncode == 0, _failures(worker)
    seen = _statuses(tmp_path / "admin.har", ops, server.token)
    for op, statuses in _statuses(tmp_path / "worker.har", ops, worker_token).items():
        if re.match(WORKER_ONLY, op[1]):
            seen[op] = statuses
    never_2xx = sorted(
        f"{m} {p}: {sorted(s)}"
        for (m, p), s in seen.items()
        if not any(200 <= c < 300 for c in s) and (m, p) not in NEEDS_A_RUNNING_JOB
    )
    assert never_2xx == [], "\n".join(never_2xx)
    for op in NEEDS_A_RUNNING_JOB:  # refused as documented: not a job (403), none such (404)
        assert seen[op] and seen[op] <= {400, 403, 404}, (op, seen[op])
    assert server.api("GET", "/api/v1/jobs").status_code == 200, "the admin token must still work"
    r = server.api("GET", "/api/v1/workers/cas/.id", token=worker_token)
    assert r.status_code == 200, "the worker token must still work"


@pytest.mark.timeout(900)
def test_member_run_has_no_failures_and_is_refused_what_its_role_lacks(
    server_factory, worker_factory, tmp_path: Path
) -> None:
    server = server_factory(builtin_worker=False)
    seeds = _seed(server, worker_factory)
    made = server.cli("token", "create", "fuzzer", "--kind", "service", "--tenant", "b")
    assert made.code == 0, made.err
    member = made.out.strip()
    assert CALLERS[TokenKind.SERVICE][1] is Role.MEMBER
    document = httpx.get(f"{server.url}/schema/openapi.json", timeout=30).json()
    ops = _operations(document)
    run = _schemathesis(
        server, member, tmp_path / "member.har", {**seeds, "own_tokens": ["fuzzer"]}
    )
    assert run.returncode == 0, _failures(run)
    perms = _perms()
    lacking = {op for op in ops if (perm := perms[op]) and perm not in GRANTS[Role.MEMBER]}
    assert lacking, "a member lacks some powers"
    seen = _statuses(tmp_path / "member.har", ops, member)
    # A URL holding a NUL is refused (400) before anything else, the caller included.
    wrong = {f"{m} {p}": sorted(seen[(m, p)]) for m, p in lacking if seen[(m, p)] - {400} != {403}}
    assert wrong == {}
    assert server.api("GET", "/api/v1/jobs", token=member).status_code == 200
