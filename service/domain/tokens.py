"""Tokens: create, list, revoke, and turning a presented bearer token into a Caller."""

import contextlib
import re
import secrets as stdlib_secrets

from service.auth import minting
from service.auth import tokens as tokens_auth
from service.auth.callers import Caller, Kind, Role
from service.core.errors import Conflict, Forbidden, Invalid, NotFound, Unauthenticated
from service.core.states import TokenKind
from service.db.engine import Database
from service.db.queries import jobs as jobs_q
from service.db.queries import tokens as tokens_q
from service.db.queries import workers as workers_q
from service.db.records import TokenRecord
from service.domain import audit

NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
DEFAULT_TENANT = "default"


def check_name(name: str, what: str = "name") -> str:
    if not NAME.match(name):
        raise Invalid(
            f"{what} {name!r} must be 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def tenant_to_write(caller: Caller, wanted: str | None, *, doing: str) -> str:
    """The tenant a write (a job, an upload) goes to.

    The one named, else the caller's only one ("default" for a caller of every tenant).
    `doing` names the write in the refusal.
    """
    if wanted:
        check_name(wanted, "tenant")
        if not caller.sees(wanted):
            raise Forbidden(f"you may not {doing} to tenant {wanted!r}")
        return wanted
    if caller.all_tenants:
        return DEFAULT_TENANT
    if len(caller.tenants) == 1:
        return next(iter(caller.tenants))
    raise Invalid('say which tenant: you hold several (--tenant / "tenant")')


# Fixed paths under /api/v1/workers/: a worker of one of these names could not be drained,
# disabled or enabled over HTTP (its name would be taken for the path).
RESERVED_WORKER_NAMES = frozenset({"attach", "cas", "join-tokens"})


def check_worker_name(name: str) -> str:
    """A worker's name: a name, and none the worker routes use for themselves."""
    check_name(name, "worker name")
    if name in RESERVED_WORKER_NAMES:
        raise Invalid(f"worker name {name!r} is reserved (a path under /api/v1/workers/)")
    return name


async def create(
    db: Database,
    caller: Caller,
    *,
    name: str,
    kind: str,
    tenants: list[str],
    expires_days: float,
    request_id: str = "",
) -> tuple[str, TokenRecord]:
    """Mint a token; returns (the token, shown once, and its record)."""
    check_name(name)
    try:
        token_kind = TokenKind(kind)
    except ValueError:
        kinds = ", ".join(k.value for k in TokenKind)
        raise Invalid(f"kind must be one of {kinds}; got {kind!r}") from None
    if token_kind is TokenKind.WORKER:
        check_worker_name(name)
    if not 0 < expires_days <= 3650:
        raise Invalid("expires must be between 0 and 3650 days")
    for t in tenants:
        check_name(t, "tenant")
    if token_kind is TokenKind.SERVICE and not tenants and caller.all_tenants:
        tenants = [DEFAULT_TENANT]
    minting.check(caller, token_kind, tenants)
    token = tokens_auth.mint()
    async with db.begin() as conn:
        if await workers_q.holds_leases(conn, name=name):
            # Security: a revoked worker's leases stay live until its silence window ends (or
            # it gives them back); a new credential of its name must not inherit them.
            raise Conflict(
                f"a worker named {name!r} still holds leases; its name is free once they end"
            )
        await jobs_q.ensure_tenants(conn, tenants)
        record = await tokens_q.create(
            conn,
            name=name,
            kind=str(token_kind),
            digest=tokens_auth.digest(token),
            tenants=sorted(set(tenants)),
            created_by=str(caller),
            expires_days=expires_days,
        )
        await audit.record(conn, caller, "token.created", name, request_id=request_id, kind=kind)
    return token, record


async def list_visible(db: Database, caller: Caller) -> list[TokenRecord]:
    """Every token for an admin; for an operator, the ones it could have minted."""
    async with db.begin() as conn:
        found = await tokens_q.list_all(conn)
    if caller.all_tenants:
        return found
    return [t for t in found if minting.could_have_minted(caller, t.kind, t.tenants)]


async def revoke(
    db: Database, caller: Caller, *, name: str, force: bool = False, request_id: str = ""
) -> TokenRecord:
    """Revoke; a worker using it is told to leave by the server holding its socket.

    A caller revokes only what it could have minted (Forbidden). Without `force`, neither the
    credential in use nor the last live admin token is revoked (Conflict, saying why): the
    first locks the caller out, the second everyone (`berth db admin-token` is the way back).
    """
    async with db.begin() as conn:
        target = await tokens_q.live_by_name(conn, name=name)
        if target is None or not (
            caller.all_tenants or minting.could_have_minted(caller, target.kind, target.tenants)
        ):
            if target is not None and caller.role is Role.OPERATOR:
                raise Forbidden(f"you may not revoke {name!r}: only its minter's peers may")
            raise NotFound(f"no live token named {name!r}")
        if target.kind == TokenKind.ADMIN:
            admins = await tokens_q.lock_live_admins(conn)
            if not force and admins == [name]:
                raise Conflict(
                    f"{name!r} is the last live admin token: revoking it locks everyone out "
                    "(use --force; `berth db admin-token NAME` on the database mints a new one)"
                )
        if not force and caller.credential == name:
            raise Conflict(
                f"{name!r} is the token you are using: revoking it ends your own access "
                "(use --force if that is what you want)"
            )
        record = await tokens_q.revoke(conn, name=name)
        if record is None:  # revoked by someone else meanwhile
            raise NotFound(f"no live token named {name!r}")
        # Every server drops the token from its cache; the one holding a worker's socket closes it.
        await workers_q.notify(conn, {"op": "revoke", "worker": name, "kind": record.kind})
        await audit.record(conn, caller, "token.revoked", name, request_id=request_id)
    return record


async def authenticate(db: Database, token: str) -> Caller:
    """The caller a bearer token stands for; Unauthenticated if unknown, revoked or expired."""
    if not tokens_auth.looks_like(token):
        raise Unauthenticated(tokens_auth.NOT_A_TOKEN)
    async with db.driver() as conn:
        found = await tokens_q.by_digest(conn, tokens_auth.digest(token))
    if found is None:
        raise Unauthenticated("unknown token")
    record, usable = found
    if not usable:
        raise Unauthenticated("token revoked" if record.revoked_at else "token expired")
    return caller_of(record)


CALLERS = {
    TokenKind.ADMIN: (Kind.HUMAN, Role.ADMIN),
    TokenKind.OPERATOR: (Kind.HUMAN, Role.OPERATOR),
    TokenKind.SERVICE: (Kind.SERVICE, Role.MEMBER),
    TokenKind.WORKER: (Kind.WORKER, Role.WORKER),  # with tenants: serves only their jobs
    TokenKind.METRICS: (Kind.SERVICE, Role.METRICS),
}


def caller_of(record: TokenRecord) -> Caller:
    kind, role = CALLERS[TokenKind(record.kind)]
    return Caller(
        kind,
        record.name,
        role,
        frozenset(record.tenants),
        credential=record.name,
        identity=f"token:{record.id}",
    )


async def break_glass(db: Database, *, name: str, os_user: str) -> str:
    """A new admin token minted on the database directly, signed `ops:<os user>`.

    The way back in when no admin token is left (or none is at hand): it needs the database's
    own credential, which is exactly who may do this.
    """
    caller = Caller(Kind.OPS, os_user or "unknown", Role.ADMIN, frozenset())
    token, _ = await create(
        db, caller, name=name, kind=str(TokenKind.ADMIN), tenants=[], expires_days=3650
    )
    return token


async def ensure_admin(db: Database) -> str | None:
    """On first start: mint an admin token and return it; None when one exists already."""
    async with db.begin() as conn:
        if await tokens_q.any_admin(conn):
            return None
    token, _ = await create(db, SYSTEM, name="admin", kind="admin", tenants=[], expires_days=3650)
    return token


SYSTEM = Caller(Kind.SERVICE, "berth", Role.ADMIN, frozenset())


async def builtin_worker(db: Database, *, stored: str, name: str) -> tuple[str, str]:
    """The credential of one server's built-in worker: (token, worker name).

    Each server keeps its own in its home, so two servers on one database (or one home) keep
    both built-in workers, each its own identity, across restarts. The stored token is used
    while it is live; otherwise a new one is minted, under the stored name while that is free
    (a revoked built-in worker comes back under its name) or a new generated one.
    """
    if stored:
        with contextlib.suppress(Unauthenticated):
            caller = await authenticate(db, stored)
            if caller.kind is Kind.WORKER and not caller.tenants:
                return stored, caller.name
    for candidate in (name, f"serve-{stdlib_secrets.token_hex(4)}"):
        if not candidate:
            continue
        with contextlib.suppress(Conflict):
            token, record = await create(
                db, SYSTEM, name=candidate, kind="worker", tenants=[], expires_days=3650
            )
            return token, record.name
    raise Conflict("cannot mint a credential for the built-in worker")
