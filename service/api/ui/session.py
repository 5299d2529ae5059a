"""The web UI's sign-in and request checks: session cookie, CSRF token, same-origin writes.

Token mode: the login form trades a token for a cookie holding that token sealed (AES-GCM under
a key derived from the server's secret key, so any server of the installation opens it) with
an expiry. The cookie is HttpOnly, SameSite=Strict, Path=/ui and Secure under TLS; the token
never appears in a URL or in the page. Each request opens it and authenticates the token the
way a bearer token is (api/identity.py), so a revoked token ends its sessions too.

Behind a proxy, the proxy's headers sign the browser in; there is no berth cookie.

Every state-changing UI request carries a CSRF token: an HMAC, under another derived key, of the
session cookie (token mode) or of the caller (proxy mode); and a POST whose Origin (or
Sec-Fetch-Site) says it came from another site is refused before anything else.
"""

import base64
import hashlib
import hmac
import os
import time
from typing import Any
from urllib.parse import urlsplit

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from service.core.errors import Forbidden

COOKIE = "berth_ui"
PATH = "/ui"
SESSION_SECONDS = 12 * 3600
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"


class _Sealed(msgspec.Struct, frozen=True):
    token: str
    expires: float


def _key(secret_key: bytes, purpose: bytes) -> bytes:
    """A key for one purpose, derived from the server's secret key (never the key itself)."""
    return hmac.new(secret_key, b"berth-ui\x00" + purpose, hashlib.sha256).digest()


def seal(secret_key: bytes, token: str, *, now: float | None = None) -> str:
    """The cookie value for a signed-in token."""
    expires = (time.time() if now is None else now) + SESSION_SECONDS
    nonce = os.urandom(12)
    plain = msgspec.json.encode(_Sealed(token, expires))
    sealed = AESGCM(_key(secret_key, b"session")).encrypt(nonce, plain, COOKIE.encode())
    return base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")


def opened(secret_key: bytes, cookie: str) -> str:
    """The token a cookie holds; "" for one that is altered, foreign or expired."""
    try:
        raw = base64.urlsafe_b64decode(cookie + "=" * (-len(cookie) % 4))
        plain = AESGCM(_key(secret_key, b"session")).decrypt(raw[:12], raw[12:], COOKIE.encode())
        sealed = msgspec.json.decode(plain, type=_Sealed)
    except (ValueError, InvalidTag, msgspec.DecodeError):
        return ""
    return sealed.token if sealed.expires > time.time() else ""


def csrf_token(secret_key: bytes, bound_to: str) -> str:
    """The token a form must send back; bound to the session (or the proxy's caller)."""
    return hmac.new(_key(secret_key, b"csrf"), bound_to.encode(), hashlib.sha256).hexdigest()


def check_csrf(secret_key: bytes, bound_to: str, sent: str) -> None:
    if not sent or not hmac.compare_digest(sent, csrf_token(secret_key, bound_to)):
        raise Forbidden("this form is stale or was not sent by berth's own page; reload and retry")


def check_same_origin(headers: Any) -> None:  # noqa: ANN401  (litestar's Headers)
    """Refuse a write sent from another site (a forged form or script elsewhere).

    Browsers send Origin on every POST and Sec-Fetch-Site on every request; a client that
    sends neither (curl) is not a browser another site can steer.
    """
    site = headers.get("sec-fetch-site", "")
    if site and site not in {"same-origin", "none"}:
        raise Forbidden("a cross-site request may not change anything here")
    origin = headers.get("origin", "")
    if origin and origin != "null" and urlsplit(origin).netloc != headers.get("host", ""):
        raise Forbidden("a cross-origin request may not change anything here")
    if origin == "null":
        raise Forbidden("a request from an opaque origin may not change anything here")
