"""Chaining of audit entries: each entry's hash covers its content and the previous hash.

Pure. Sealing assigns a sequence number and a hash to entries in batches (db.queries.audit);
verification walks the chain and names the first entry that does not fit.

Keyed: the link is an HMAC-SHA256 under a key derived from berth's secret key, which is never
stored in the database, so a writer with database access alone cannot recompute the chain after
an edit. Entries sealed before the key existed keep their plain SHA-256 links; the anchor says
where the keyed part begins and is itself MACed, so that boundary cannot be moved to pass keyed
entries off as plain ones. Deleting the newest entries leaves a valid shorter chain; only a head
recorded elsewhere (`audit head`, logged on each seal) shows that.
"""

import hashlib
import hmac
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

GENESIS = b"\x00" * 32
FIELDS = ("id", "at", "caller", "action", "target", "tenant", "request_id", "detail")


def chain_key(secret_key: bytes) -> bytes:
    """The chain's own key, derived from the secret key (never the secret key itself)."""
    return HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"berth audit chain v1"
    ).derive(secret_key)


def canonical(seq: int, entry: Mapping[str, Any]) -> bytes:
    """The bytes an entry's hash covers: its sequence and every recorded field."""
    body: dict[str, Any] = {"seq": seq}
    for key in FIELDS:
        value = entry[key]
        body[key] = value.isoformat() if isinstance(value, datetime) else value
    return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()


def link(previous: bytes, seq: int, entry: Mapping[str, Any], key: bytes | None = None) -> bytes:
    """The entry's hash: HMAC under `key`, or plain SHA-256 (entries sealed before keys)."""
    data = previous + canonical(seq, entry)
    if key is None:
        return hashlib.sha256(data).digest()
    return hmac.new(key, data, hashlib.sha256).digest()


def anchor_mac(key: bytes, keyed_from: int) -> bytes:
    return hmac.new(key, f"berth-audit-keyed-from:{keyed_from}".encode(), hashlib.sha256).digest()


def parse_head(text: str) -> tuple[int, bytes]:
    """`SEQ:HEX` as `audit head` prints it; ValueError naming the problem otherwise."""
    seq, _, digest = text.partition(":")
    try:
        raw = bytes.fromhex(digest)
    except ValueError:
        raw = b""
    if not (seq.isascii() and seq.isdigit()) or len(raw) != 32:
        raise ValueError(f"--head {text!r} is not SEQ:HASH (as `berth audit head` prints)")
    return int(seq), raw


def show_head(seq: int, digest: bytes) -> str:
    return f"{seq}:{digest.hex()}"


class Walker:
    """Verifies sealed entries fed in seq order, a batch at a time.

    A long chain never sits in memory whole.

    `keyed_from`: the first keyed seq (from a verified anchor); None means no entry is keyed.
    `head`: a (seq, hash) recorded earlier; the chain must still contain it.
    """

    def __init__(
        self,
        *,
        key: bytes | None = None,
        keyed_from: int | None = None,
        head: tuple[int, bytes] | None = None,
    ) -> None:
        self.key = key
        self.keyed_from = keyed_from
        self.head = head
        self.previous = GENESIS
        self.expected = 1
        self.plain = 0
        self.keyed = 0

    def feed(self, entry: Mapping[str, Any]) -> str | None:
        """The next entry; a description of the break, or None when it fits."""
        seq = entry["seq"]
        if seq != self.expected:
            missing = self.expected
            return f"audit entry seq {missing} is missing (deleted); the chain resumes at {seq}"
        keyed = self.keyed_from is not None and seq >= self.keyed_from
        if keyed and self.key is None:
            return "no secret key to verify the keyed entries (BERTH_SECRET_KEY or secret.key)"
        expected_hash = link(self.previous, seq, entry, self.key if keyed else None)
        if not hmac.compare_digest(entry["hash"], expected_hash):
            return f"audit entry seq {seq} (id {entry['id']}) was altered: its hash does not match"
        head = self.head
        if head is not None and seq == head[0] and not hmac.compare_digest(entry["hash"], head[1]):
            return f"audit entry seq {seq} is not the recorded head: the chain was rewritten"
        self.previous = entry["hash"]
        self.expected += 1
        if keyed:
            self.keyed += 1
        else:
            self.plain += 1
        return None

    def finish(self) -> str | None:
        """After the last entry: a recorded head beyond the chain's end means deleted entries."""
        last = self.expected - 1
        if self.head is not None and last < self.head[0]:
            return (
                f"the chain ends at seq {last} but the recorded head is seq {self.head[0]}: "
                f"the newest {self.head[0] - last} entries were deleted"
            )
        return None
