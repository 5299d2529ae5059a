"""Every route declares its permission: a route without one fails here, not open in production."""

from service.api.app import ROUTES
from service.auth.permissions import Perm


class TestRoutePermissions:
    def test_every_route_declares_a_permission(self):
        """Each handler has opt["perm"] (a Perm) or is explicitly public."""
        undeclared = [
            h.handler_name
            for h in ROUTES
            if not h.opt.get("public") and not isinstance(h.opt.get("perm"), Perm)
        ]
        assert undeclared == []

    def test_only_health_is_public(self):
        """Only liveness and readiness answer without a caller."""
        public = sorted(str(h.paths) for h in ROUTES if h.opt.get("public"))
        assert public == ["{'/healthz'}", "{'/readyz'}"]
