"""Who is calling: berth's bearer token (auth = "token") or the proxy's claims (auth = "proxy").

Security: in token mode the claim headers are never read, whatever a client sends. In proxy mode
only the configured headers are read, a claim header sent twice is refused, and berth's own
`brt_` tokens are refused: the proxy is the one authentication.
"""

import hmac
import uuid
from typing import Any

import structlog
from litestar.connection import ASGIConnection

from service.api.runtime import Runtime
from service.api.ui import session as ui_session
from service.auth import jwt as jwt_auth
from service.auth import rules as rules_mod
from service.auth import tokens as tokens_auth
from service.auth.callers import Caller, Kind, Role
from service.config import Proxy
from service.core.errors import Forbidden, Unauthenticated
from service.domain import tokens

Conn = ASGIConnection[Any, Any, Any, Any]

log = structlog.get_logger(__name__)


def runtime_of(connection: Conn) -> Runtime:
    rt = connection.app.state["runtime"]
    assert isinstance(rt, Runtime)
    return rt


async def identify(connection: Conn) -> Caller:
    """Resolve the caller once per connection; raise Unauthenticated/Forbidden with a reason."""
    cached = connection.scope.get("state", {}).get("caller")
    if isinstance(cached, Caller):
        return cached
    rt = runtime_of(connection)
    if rt.config.network.auth == "proxy":
        caller = await _from_proxy(connection, rt)
    else:
        caller = await _from_token(connection, rt)
    state = connection.scope.setdefault("state", {})
    state["caller"] = caller
    request_id = connection.headers.get("x-request-id") or uuid.uuid4().hex
    state["request_id"] = request_id
    structlog.contextvars.bind_contextvars(caller=str(caller), request_id=request_id)
    return caller


def bearer(connection: Conn) -> str:
    """The credential of an `Authorization: Bearer ...` header; "" without one."""
    scheme, _, credential = connection.headers.get("authorization", "").partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else ""


def _ui_session(connection: Conn, rt: Runtime) -> str:
    """The token a web UI session cookie holds; only UI routes read the cookie (api/ui)."""
    handler = connection.scope.get("route_handler")
    if handler is None or not handler.opt.get("ui"):
        return ""
    cookie = connection.cookies.get(ui_session.COOKIE, "")
    return ui_session.opened(rt.secret_key, cookie) if cookie else ""


async def _from_token(connection: Conn, rt: Runtime) -> Caller:
    credential = bearer(connection) or _ui_session(connection, rt)
    if not credential:
        raise Unauthenticated("missing bearer token (Authorization: Bearer brt_…)")
    digest = tokens_auth.digest(credential)
    if (cached := rt.callers.get(digest)) is not None:
        return cached
    caller = await tokens.authenticate(rt.db, credential)
    rt.callers.put(digest, caller)
    return caller


async def _from_proxy(connection: Conn, rt: Runtime) -> Caller:
    proxy = rt.config.network.proxy
    presented = bearer(connection)
    if rt.builtin_token and hmac.compare_digest(presented, rt.builtin_token):
        # This server's built-in worker dials it directly, not through the proxy; its token is
        # kept 0600 in this server's home and named nowhere else.
        return await tokens.authenticate(rt.db, presented)
    if tokens_auth.looks_like(presented):
        raise Unauthenticated(
            "berth tokens are not accepted here: the proxy in front of berth is the authentication"
        )
    raw: dict[str, str] = {}
    if proxy.verify_jwt:
        raw = await _verified_claims(connection, rt)
    for claim, header in ({} if proxy.verify_jwt else proxy.claims).items():
        values = connection.headers.getall(header, [])
        if len(values) > 1:  # a copy the proxy failed to strip: trust neither
            log.warning("claim_header_repeated", header=header)
            raise Forbidden("you may not do this")
        if values:
            raw[claim] = values[0]
    worker = connection.headers.get(proxy.worker_header, "").strip() or None
    try:
        return rules_mod.resolve(
            rules_mod.Claims.from_headers(raw),
            compiled_rules(proxy),
            name_claims=proxy.name_claims,
            worker_name=worker,
        )
    except Forbidden as exc:
        # Generic to the caller; the specific reason and the claims' names are in the log.
        log.warning("caller_refused", reason=exc.message, claims=sorted(raw))
        raise Forbidden("no rule grants you access to berth") from None


async def _verified_claims(connection: Conn, rt: Runtime) -> dict[str, str]:
    """Claims from the forwarded JWT, verified against the issuer's keys (not the headers)."""
    proxy = rt.config.network.proxy
    value = connection.headers.get(proxy.jwt_header, "").strip()
    token = value[7:].strip() if value.lower().startswith("bearer ") else value
    if not token:
        raise Unauthenticated("no token forwarded by the proxy")
    assert rt.jwks is not None, "assemble() builds the JWKS when verify_jwt"
    payload = await rt.jwks.verify(token, issuer=proxy.issuer, audience=proxy.audience)
    return jwt_auth.claims_of(payload, proxy.jwt_claims)


_RULES: dict[int, tuple[rules_mod.Rule, ...]] = {}


def compiled_rules(proxy: Proxy) -> tuple[rules_mod.Rule, ...]:
    """The config's rules as pure Rule values (built once per config object)."""
    key = id(proxy)
    if key not in _RULES:
        _RULES[key] = tuple(
            rules_mod.Rule(
                when=dict(r.when),
                kind=Kind(r.caller),
                role=Role(r.role) if r.role else None,
                tenants=frozenset(r.tenants),
                tenants_from=r.tenants_from,
                tenant_prefix=r.tenant_prefix,
                names=r.names,
            )
            for r in proxy.rules
        )
    return _RULES[key]


def request_id(connection: Conn) -> str:
    return str(connection.scope.get("state", {}).get("request_id", ""))
