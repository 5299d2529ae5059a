"""berth's own bearer tokens: `brt_` + 256 random bits; only a sha256 of each is stored."""

import hashlib
import secrets

PREFIX = "brt_"
# The refusal of a malformed credential; the CLI names where it came from.
NOT_A_TOKEN = "not a berth token (brt_…)"  # noqa: S105  (a message, not a password)


def mint() -> str:
    """A new token, shown once to whoever created it."""
    return PREFIX + secrets.token_urlsafe(32)  # 32 bytes = 256 bits


def digest(token: str) -> bytes:
    """What the database keeps: sha256 suffices, as 256 random bits need no salt."""
    return hashlib.sha256(token.encode()).digest()


def looks_like(token: str) -> bool:
    return token.startswith(PREFIX) and len(token) > len(PREFIX) + 20
