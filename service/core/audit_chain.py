"""Chaining of audit entries: each entry's hash covers its content and the previous hash.

Pure. Sealing assigns a sequence number and a hash to entries in batches (db.queries.audit);
verification walks the chain and names the first entry that does not fit.

Keyed: the link is an HMAC-SHA256 under a key derived from berth's secret key, which is never
stored in the database, so a writer with database access alone cannot recompute the chain after
an edit. Entries sealed before the key existed keep their plain SHA-256 links; the anchor says
where the keyed part begins and is itself MACed, so that boundary cannot be moved to pass keyed
entries off as plain ones. Deleting the newest entries leaves a valid shorter chain; only a head
recorded elsewhere (`audit head`, logged on each seal, and kept by each sealing server in its
home: `audit verify` run there checks it with no flags) shows that.

Signed on insert: each entry carries a nonce and an HMAC over its content (`sign_row`, under a
key of its own derived from the secret key), made by the server that writes it. The sealer
chains only entries whose MAC holds and names the others, so a database writer cannot get an
entry of its own into the chain.
"""

import hashlib
import hmac
import json
import os
from collections.abc import Mapping, Sequence
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


ROW_FIELDS = ("caller", "action", "target", "tenant", "request_id", "detail")
NONCE = 16


def row_key(secret_key: bytes) -> bytes:
    """The key entries are signed with on insert (not the chain's, not the secret key)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"berth audit row v1").derive(
        secret_key
    )


def _plain(value: Any) -> Any:  # noqa: ANN401  (JSON values)
    """A JSON value as it reads back from jsonb: an integral float is an integer there."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _row_digest(key: bytes, nonce: bytes, entry: Mapping[str, Any]) -> bytes:
    body = {f: _plain(entry.get(f)) for f in ROW_FIELDS}
    data = nonce + json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hmac.new(key, data, hashlib.sha256).digest()


def sign_row(key: bytes, entry: Mapping[str, Any]) -> bytes:
    """A fresh nonce and the HMAC over the entry's content: the `mac` it is inserted with."""
    nonce = os.urandom(NONCE)
    return nonce + _row_digest(key, nonce, entry)


def row_signed(key: bytes, entry: Mapping[str, Any], mac: bytes | None) -> bool:
    """True when `mac` is a server's signature of exactly this content."""
    if mac is None or len(mac) != NONCE + 32:
        return False
    return hmac.compare_digest(mac[NONCE:], _row_digest(key, mac[:NONCE], entry))


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
    `heads`: (seq, hash) pairs recorded earlier; the chain must still contain each.
    """

    def __init__(
        self,
        *,
        key: bytes | None = None,
        keyed_from: int | None = None,
        heads: Sequence[tuple[int, bytes]] = (),
    ) -> None:
        self.key = key
        self.keyed_from = keyed_from
        self.heads = dict(heads)
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
        recorded = self.heads.get(seq)
        if recorded is not None and not hmac.compare_digest(entry["hash"], recorded):
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
        newest = max(self.heads, default=0)
        if last < newest:
            return (
                f"the chain ends at seq {last} but the recorded head is seq {newest}: "
                f"the newest {newest - last} entries were deleted"
            )
        return None
