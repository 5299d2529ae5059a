"""The one authorization point: each handler's declared permission, checked for its caller.

It also refuses, before anything else runs, a URL holding a NUL character (raw or %00): no name,
id or filter berth stores can contain one, and Postgres would refuse it deep in a query.
"""

from urllib.parse import unquote_to_bytes

from litestar.handlers.base import BaseRouteHandler

from service.api.identity import Conn, identify
from service.auth.permissions import Perm, allowed
from service.core.errors import Forbidden, Invalid


def _has_nul(connection: Conn) -> bool:
    path = str(connection.scope.get("path", ""))
    query = connection.scope.get("query_string", b"")
    return "\x00" in path or b"\x00" in unquote_to_bytes(query)


async def require_perm(connection: Conn, handler: BaseRouteHandler) -> None:
    """Authenticate, then check opt["perm"]. A handler that declares nothing is refused."""
    if _has_nul(connection):
        raise Invalid("the URL holds a NUL character")
    if handler.opt.get("public") or connection.url.path.startswith("/schema"):
        return
    perm = handler.opt.get("perm")
    if handler.opt.get("auth_in_handler"):
        return  # the worker socket answers refusals with a frame the worker can print
    caller = await identify(connection)
    if not isinstance(perm, Perm) or not allowed(caller, perm):
        # Generic to the caller; the role and the permission are in the server's log.
        raise Forbidden("you may not do this")
