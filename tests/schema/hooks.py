"""schemathesis hooks for tests/schema (loaded through SCHEMATHESIS_HOOKS).

They give the fuzzer what a schema cannot: the names of things that exist on this server (a
queued job, a worker that has left, a blob, the pool), so each operation also reaches past its
404, a blob's name that is the hash of its bytes, and a job's inputs with distinct names. They
change only values the generator made as valid ones, and only into values the document allows.
BERTH_ST_SEEDS (JSON) names the things; `own_tokens` the run's own credentials.
"""

import hashlib
import json
import os
import re
from typing import Any

import schemathesis
from schemathesis import GenerationMode
from schemathesis.transport.serialization import serialize_binary

SEEDS: dict[str, Any] = json.loads(os.environ.get("BERTH_ST_SEEDS", "{}"))
HEX64 = re.compile(r"[0-9a-f]{64}")
TRUE = {"true", "1", "yes", "on", "t", "y"}
POOL_FIELDS = "slots.|max_load|min_memory_gb|min_disk_gb|provisioner."


def _half(value: object) -> bool:
    """Deterministically half of the generated values (so 404s are still fuzzed too)."""
    return hashlib.sha256(repr(value).encode()).digest()[0] < 128


def _existing(path: str, params: dict[str, Any]) -> None:
    """Some valid names become those of things that exist."""
    if path.endswith("/cas/{sha256}") and "blob" in SEEDS:
        if HEX64.fullmatch(str(params.get("sha256", ""))) and _half(params["sha256"]):
            params["sha256"] = SEEDS["blob"]
    elif path.startswith("/api/v1/jobs/{job_id}") and "job" in SEEDS:
        if isinstance(params.get("job_id"), int) and params["job_id"] > 0 and _half(params):
            # A followed output (and a job's events) stream until its job ends, and no job
            # here ever runs: those are read of one that was cancelled, the rest of a queued one.
            streams = path.endswith(("/logs", "/events"))
            params["job_id"] = SEEDS["ended" if streams else "job"]
    elif path.startswith("/api/v1/workers/{name}") and "worker" in SEEDS:
        if _half(params.get("name")):
            params["name"] = SEEDS["worker"]
    elif path == "/api/v1/limits/{key}" and _half(params.get("key")):
        key = str(params.get("key", ""))
        if key.startswith("pools."):  # the pool the server has
            pattern = rf"^pools\..+?\.(?=(?:{POOL_FIELDS}))"
            params["key"] = re.sub(pattern, "pools.serve.", key, count=1)


SEEDED_LIMIT = "tenants.seed.max_stored_gb"  # any number >= 0; the test sets it first


def _reachable(path: str, method: str, params: dict[str, Any], case: Any) -> None:
    """Half of the cases name what can succeed: a limit's value depends on its key (in the
    path), which JSON Schema cannot tie to the body; a blob is read as its owner stored it."""
    if path == "/api/v1/limits/{key}" and _half(params.get("key")):
        params["key"] = SEEDED_LIMIT
        if method == "PUT" and isinstance(case.body, dict):
            value = case.body.get("value")
            ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
            case.body["value"] = value if ok else 1
    elif path == "/api/v1/cas/{sha256}" and method == "GET" and "blob" in SEEDS:
        if params.get("sha256") != SEEDS["blob"]:  # half of them are already (_existing)
            return
        for name in ("tenant",):
            (case.query or {}).pop(name, None)
        for name in list(case.headers or {}):
            if name.lower() == "range":
                case.headers.pop(name)


def _distinct_inputs(body: Any) -> None:
    """Inputs land in the job's folder by name, so no two share one: JSON Schema can say
    "unique items" but not "unique by this field"."""
    for job in body if isinstance(body, list) else [body]:
        if isinstance(job, dict) and isinstance(job.get("inputs"), list):
            for i, item in enumerate(job["inputs"]):
                if isinstance(item, dict) and isinstance(item.get("name"), str):
                    item["name"] = f"{i}-{item['name']}"[:255]


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    path, method = case.operation.path, case.method.upper()
    params = case.path_parameters or {}
    if case.meta is None or case.meta.generation.mode is GenerationMode.POSITIVE:
        if method != "PUT":
            _existing(path, params)
        if path == "/api/v1/jobs" and method == "POST":
            _distinct_inputs(case.body)
    follow = str((case.query or {}).get("follow", "")).lower() in TRUE
    if case.meta is None or case.meta.generation.mode is GenerationMode.POSITIVE:
        _reachable(path, method, params, case)
    streamed = (path.endswith("/logs") and follow) or path.endswith("/events")
    if streamed and "ended" in SEEDS:
        # A followed output streams until its job ends, and no job runs here: any other job
        # (ids are small, so the fuzzer names those it made) would never answer. In every
        # mode: a negative case may break only what the server ignores.
        params["job_id"] = SEEDS["ended"]
    if path == "/api/v1/tokens/{name}" and method == "DELETE":
        # The run's own credential: the server refuses to revoke the token in use (409) unless
        # force is given, and force is the deliberate way to end one's own access. The fuzzer
        # keeps its credential by never forcing that one name; the rest of revocation (force
        # on any other token, the 409 without it) is still fuzzed.
        query = case.query or {}
        own = params.get("name") in SEEDS.get("own_tokens", ())
        if own and str(query.get("force", "")).lower() in TRUE:
            query["force"] = "false"
            case.query = query
    return case


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """A blob's name is the sha256 of its bytes (as sent): the document says so in words."""
    params = case.path_parameters or {}
    put = case.operation.path.endswith("/cas/{sha256}") and case.method.upper() == "PUT"
    if put and HEX64.fullmatch(str(params.get("sha256", ""))) and case.body is not None:
        params["sha256"] = hashlib.sha256(serialize_binary(case.body)).hexdigest()
