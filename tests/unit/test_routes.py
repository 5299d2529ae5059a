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

    def test_only_health_and_the_uis_sign_in_are_public(self):
        """Only liveness, readiness, the UI's login form and its static assets need no caller."""
        public = sorted(str(h.paths) for h in ROUTES if h.opt.get("public"))
        assert public == [
            "{'/healthz'}",
            "{'/readyz'}",
            "{'/ui/login'}",
            "{'/ui/login'}",
            "{'/ui/static/{name:str}'}",
        ]

    def test_ui_pages_declare_the_permission_of_their_api_twin(self):
        """A UI page reads or writes what an API route does, under the same permission."""
        perms = {next(iter(h.paths)): h.opt.get("perm") for h in ROUTES if h.opt.get("ui")}
        assert perms["/ui/jobs"] == Perm.JOBS_READ
        assert perms["/ui/jobs/{job_id:int}/cancel"] == Perm.JOBS_WRITE
        assert perms["/ui/workers/{name:str}/{action:str}"] == Perm.FLEET_WRITE
        assert perms["/ui/audit"] == Perm.AUDIT
        assert perms["/ui/pools"] == Perm.FLEET_READ
