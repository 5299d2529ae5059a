"""schemathesis hooks for tests/schema (loaded through SCHEMATHESIS_HOOKS).

They give the fuzzer what a schema cannot: the names of things that exist on this server (a
queued job, a worker that has left, a blob), so each operation also reaches past its 404, and
a blob's name that is the hash of its bytes. They change only values the generator already
chose as valid; every value stays one the document allows. BERTH_ST_SEEDS (JSON) names them.
"""

import hashlib
import json
import os
import re
from typing import Any

import schemathesis
from schemathesis import GenerationMode

SEEDS: dict[str, Any] = json.loads(os.environ.get("BERTH_ST_SEEDS", "{}"))
HEX64 = re.compile(r"[0-9a-f]{64}")
TRUE = {"true", "1", "yes", "on", "t", "y"}


def _half(value: object) -> bool:
    """Deterministically half of the generated values (so 404s are still fuzzed too)."""
    return hashlib.sha256(repr(value).encode()).digest()[0] < 128


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    path, method = case.operation.path, case.method.upper()
    params = case.path_parameters or {}
    own = SEEDS.get("own_tokens", ())
    positive = case.meta is None or case.meta.generation.mode is GenerationMode.POSITIVE
    if path.endswith("/cas/{sha256}") and method == "PUT" and isinstance(case.body, bytes):
        # A blob's name is the sha256 of its bytes: a rule the document states in words only.
        if HEX64.fullmatch(str(params.get("sha256", ""))):
            params["sha256"] = hashlib.sha256(case.body).hexdigest()
    elif path.endswith("/cas/{sha256}") and positive and "blob" in SEEDS:
        if HEX64.fullmatch(str(params.get("sha256", ""))) and _half(params["sha256"]):
            params["sha256"] = SEEDS["blob"]
    elif path.startswith("/api/v1/jobs/{job_id}") and positive and "job" in SEEDS:
        if isinstance(params.get("job_id"), int) and params["job_id"] > 0 and _half(params):
            params["job_id"] = SEEDS["job"]
    elif path.startswith("/api/v1/workers/{name}") and positive and "worker" in SEEDS:
        if _half(params.get("name")):
            params["name"] = SEEDS["worker"]
    elif path == "/api/v1/limits/{key}" and positive and _half(params.get("key")):
        # A pool key reaches past "no such pool" when it names the pool the server has.
        key = str(params.get("key", ""))
        if key.startswith("pools."):
            fields = "slots.|max_load|min_memory_gb|min_disk_gb|provisioner."
            params["key"] = re.sub(rf"^pools\..+?\.(?=(?:{fields}))", "pools.serve.", key, count=1)
    elif path == "/api/v1/tokens/{name}" and method == "DELETE" and params.get("name") in own:
        # The run's own credential: the server already refuses to revoke the token in use
        # (409) unless force is given, and force is the deliberate way to end one's own access.
        # The fuzzer keeps its credential by never forcing that one name; everything else about
        # revocation (force on any other token, the 409 without it) is still fuzzed.
        query = case.query or {}
        if str(query.get("force", "")).lower() in TRUE:
            query["force"] = "false"
            case.query = query
    return case
