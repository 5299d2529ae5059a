"""Hash-chaining of audit entries: each entry's hash covers its content and the previous hash.

Pure. Sealing assigns a sequence number and a hash to entries in batches (db.queries.audit);
verification walks the chain by sequence and names the first entry that does not fit.
"""

import hashlib
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

GENESIS = b"\x00" * 32
FIELDS = ("id", "at", "caller", "action", "target", "tenant", "request_id", "detail")


def canonical(seq: int, entry: Mapping[str, Any]) -> bytes:
    """The bytes an entry's hash covers: its sequence and every recorded field."""
    body: dict[str, Any] = {"seq": seq}
    for key in FIELDS:
        value = entry[key]
        body[key] = value.isoformat() if isinstance(value, datetime) else value
    return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()


def link(previous: bytes, seq: int, entry: Mapping[str, Any]) -> bytes:
    return hashlib.sha256(previous + canonical(seq, entry)).digest()


def first_break(entries: Iterable[Mapping[str, Any]]) -> str | None:
    """Walk sealed entries in seq order; describe the first that does not fit, or None."""
    previous = GENESIS
    expected = 1
    for entry in entries:
        seq = entry["seq"]
        if seq != expected:
            return f"audit entry seq {expected} is missing (deleted); the chain resumes at {seq}"
        if entry["hash"] != link(previous, seq, entry):
            return f"audit entry seq {seq} (id {entry['id']}) was altered: its hash does not match"
        previous = entry["hash"]
        expected += 1
    return None
