"""The one authorization point: each handler's declared permission, checked for its caller."""

from litestar.handlers.base import BaseRouteHandler

from service.api.identity import Conn, identify
from service.auth.permissions import Perm, allowed
from service.core.errors import Forbidden


async def require_perm(connection: Conn, handler: BaseRouteHandler) -> None:
    """Authenticate, then check opt["perm"]. A handler that declares nothing is refused."""
    if handler.opt.get("public") or connection.url.path.startswith("/schema"):
        return
    perm = handler.opt.get("perm")
    if handler.opt.get("auth_in_handler"):
        return  # the worker socket answers refusals with a frame the worker can print
    caller = await identify(connection)
    if not isinstance(perm, Perm) or not allowed(caller, perm):
        # Generic to the caller; the role and the permission are in the server's log.
        raise Forbidden("you may not do this")
