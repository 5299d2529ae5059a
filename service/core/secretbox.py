"""AES-256-GCM for secrets at rest. Pure: the key is handed in (domain/secrets.py loads it).

The secret's tenant and name are the associated data, so a ciphertext moved to another row
does not decrypt.
"""

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from service.core.errors import BerthError

KEY_BYTES = 32


class SecretKeyMismatch(BerthError):
    """The ciphertext was sealed with another key (or altered)."""

    status = 409


def seal(key: bytes, plaintext: bytes, *, tenant: str, name: str) -> tuple[bytes, bytes]:
    """Encrypt; returns (nonce, ciphertext)."""
    nonce = os.urandom(12)
    return nonce, AESGCM(key).encrypt(nonce, plaintext, _aad(tenant, name))


def open_(key: bytes, nonce: bytes, ciphertext: bytes, *, tenant: str, name: str) -> bytes:
    try:
        return AESGCM(key).decrypt(nonce, ciphertext, _aad(tenant, name))
    except InvalidTag:
        raise SecretKeyMismatch(
            f"secret {name!r} does not decrypt with this server's key (BERTH_SECRET_KEY)"
        ) from None


def _aad(tenant: str, name: str) -> bytes:
    return f"berth-secret\x00{tenant}\x00{name}".encode()
