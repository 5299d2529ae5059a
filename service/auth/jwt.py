"""Verifying a JWT the proxy forwards (`verify_jwt`).

Signature against the issuer's JWKS, then issuer, audience and expiry. Pure: the key set is
handed in (api/jwks.py fetches and caches it).

joserfc is authlib's JOSE implementation (authlib.jose is deprecated in its favour).
"""

from collections.abc import Mapping
from typing import Any

from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from service.core.errors import Unauthenticated

ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA"]


class UnknownKey(Unauthenticated):
    """The token names a key id the cached key set lacks: refresh the set, then try again."""


def kid_of(token: str) -> str | None:
    try:
        header = jws.extract_compact(token.encode()).headers()
    except (JoseError, ValueError) as exc:
        raise Unauthenticated(f"malformed token: {exc}") from None
    kid = header.get("kid")
    return str(kid) if kid else None


def verify(
    token: str, keys: KeySet, *, issuer: str, audience: str, leeway: int = 30
) -> Mapping[str, Any]:
    """The token's claims if it is signed by a key of `keys` and valid now; else Unauthenticated."""
    kid = kid_of(token)
    if kid is not None and not any(k.kid == kid for k in keys.keys):
        raise UnknownKey(f"unknown signing key {kid!r}")
    try:
        decoded = jwt.decode(token, keys, algorithms=ALGORITHMS)
        registry = jwt.JWTClaimsRegistry(
            leeway=leeway,
            iss={"essential": True, "value": issuer},
            aud={"essential": True, "value": audience},
            exp={"essential": True},
        )
        registry.validate(decoded.claims)
    except (JoseError, ValueError) as exc:
        raise Unauthenticated(f"token rejected: {exc}") from None
    return decoded.claims


def claims_of(payload: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, str]:
    """Berth claim -> value, from the JWT's claims named in `names` (lists joined by commas)."""
    out = {}
    for claim, key in names.items():
        value = payload.get(key)
        if isinstance(value, list):
            out[claim] = ",".join(str(v) for v in value)
        elif value is not None:
            out[claim] = str(value)
    return out
