"""Ops can always get back in: the last admin token is not revoked by accident, and
`berth db admin-token` mints a new one on the database directly, with no server running."""

import json
import signal
import stat

from tests.procs import Server


def rescue(s: Server, **env: str):
    """`berth db admin-token rescue` with no server, no credential but the database's."""
    r = s.cli("db", "admin-token", "rescue", token="none", **env)
    assert r.code == 0, r.err
    token = r.out.strip()
    assert token.startswith("brt_") and "\n" not in token  # the token alone on stdout
    assert "ops:" in r.err
    file = s.home / "admin.token"
    assert file.read_text().strip() == token
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    return token


def signed_by_ops(s: Server, token: str) -> bool:
    entries = json.loads(s.cli("audit", "list", "--json", token=token).out)
    return any(
        e["caller"].startswith("ops:")
        and e["action"] == "token.created"
        and e["target"] == "rescue"
        for e in entries
    )


class TestBreakGlass:
    def test_external_database(self, server_factory):
        """The last admin, force-revoked: locked out; `db admin-token` brings a working one."""
        s = server_factory(builtin_worker=False)
        r = s.cli("token", "revoke", "admin")
        assert r.code != 0 and "last live admin token" in r.err and "Traceback" not in r.err
        assert s.cli("job", "list").code == 0  # refused, and nothing changed
        r = s.cli("token", "revoke", "admin", "--force")
        assert r.code == 0 and "no longer works" in r.err and "db admin-token" in r.err
        locked = s.cli("job", "list")
        assert locked.code != 0 and "revoked" in locked.err
        s.stop()
        token = rescue(s)
        s.start()
        assert s.cli("job", "list", token=token).code == 0
        assert signed_by_ops(s, token)
        # Minted where the server runs (its secret key at hand): signed, so sealed, and the
        # chain verifies with the entry in it.
        from tests.procs import wait_for

        wait_for(
            lambda: all(
                e["seq"] for e in json.loads(s.cli("audit", "list", "--json", token=token).out)
            ),
            10,
            "the break-glass entry sealed",
        )
        verified = s.cli("audit", "verify")
        assert verified.code == 0 and "intact" in verified.out, verified.err
        again = s.cli("db", "admin-token", "rescue", token="none")
        assert again.code != 0 and "live token with that name" in again.err

    def test_embedded_database(self, tmp_path):
        """The same with no database URL: the command starts the embedded Postgres itself."""
        s = Server(home=tmp_path / "home", db_url=None, builtin_worker=False).start(timeout=120)
        try:
            assert s.cli("token", "revoke", "admin", "--force").code == 0
        finally:
            s.kill(signal.SIGTERM)
        token = rescue(s)
        s.start(timeout=120)
        try:
            assert s.cli("job", "list", token=token).code == 0
            assert signed_by_ops(s, token)
        finally:
            s.kill(signal.SIGTERM)
