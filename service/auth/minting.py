"""Who may mint which token (SPEC section 2). Pure: a table of rules, tested as one.

`admin` mints any token; `operator` mints `worker`, `service` and `metrics` tokens for its own
tenants only, and always names them; nobody else mints tokens. A fleet-wide worker token (no
tenants) serves every tenant's jobs, so only an admin mints one. A token never grants more than
its minter had: its tenants are a subset of the minter's.
"""

from collections.abc import Collection

from service.auth.callers import Caller, Role
from service.core.errors import Forbidden
from service.core.states import TokenKind

OPERATOR_MINTS = frozenset({TokenKind.WORKER, TokenKind.SERVICE, TokenKind.METRICS})


def check(caller: Caller, kind: TokenKind, tenants: Collection[str]) -> None:
    """Return when `caller` may mint a `kind` token for `tenants`; Forbidden saying why."""
    if caller.role is Role.ADMIN:
        return
    if caller.role is not Role.OPERATOR:
        raise Forbidden("only admins and operators mint tokens")
    if kind not in OPERATOR_MINTS:
        raise Forbidden(f"an operator mints worker, service and metrics tokens, not {kind} tokens")
    if not tenants:
        if kind is TokenKind.WORKER:
            raise Forbidden(
                "a fleet-wide worker token (no tenants) serves every tenant: only an admin mints "
                "one; name your tenants with --tenant"
            )
        raise Forbidden("an operator's tokens name its tenants: give --tenant")
    foreign = sorted(set(tenants) - caller.tenants)
    if foreign:
        raise Forbidden(f"you do not hold tenant {foreign[0]!r}")


def could_have_minted(caller: Caller, kind: str, tenants: Collection[str]) -> bool:
    """Whether `caller` may see (and revoke) a token of this kind and these tenants."""
    try:
        check(caller, TokenKind(kind), tenants)
    except (Forbidden, ValueError):
        return False
    return True
