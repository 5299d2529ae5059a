"""A stand-in for oauth2-proxy's `/oauth2/auth`: who a request is, as nginx auth_request asks.

It reads the original request's `Cookie` and `Authorization` (nginx forwards them on the
subrequest) and answers 202 with `X-Auth-Request-*` claim headers, or 401. Claims a caller does
not have are left out, as oauth2-proxy does, so nginx sends no such header upstream.

- cookie `session=<name>` for the people in PEOPLE;
- `Authorization: Bearer <secret>` for the machine principals in MACHINES;
- `Authorization: Bearer brt_...` (berth's own token): 202 with no claims at all, so the request
  reaches berth with its bearer and berth itself must refuse it;
- anything else: 401.

Run standalone with `python -m tests.proxy.authstub PORT`.
"""

import sys
import threading
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PEOPLE: dict[str, dict[str, str]] = {
    "alice": {"user": "alice", "email": "alice@example.com", "groups": "berth-admins,dev"},
    "bob": {"user": "bob", "email": "bob@example.com", "groups": "team-ml"},
    "carol": {"user": "carol", "email": "carol@example.com", "groups": "team-other"},
    "mallory": {"user": "mallory", "email": "mallory@example.com"},
}
SERVICE_SECRET = "svc-ci-secret"
WORKER_SECRET = "workers-shared-secret"
MACHINES: dict[str, dict[str, str]] = {
    SERVICE_SECRET: {"principal": "ci-pipeline"},
    WORKER_SECRET: {"principal": "berth-workers"},
}
HEADERS = {
    "user": "X-Auth-Request-User",
    "email": "X-Auth-Request-Email",
    "groups": "X-Auth-Request-Groups",
    "principal": "X-Auth-Request-Principal",
}


def claims_for(cookie: str, authorization: str) -> dict[str, str] | None:
    """The claims of a request, {} for a request let through without any, None to refuse it."""
    scheme, _, credential = authorization.partition(" ")
    credential = credential.strip()
    if scheme.lower() == "bearer" and credential:
        if credential.startswith("brt_"):
            return {}
        return MACHINES.get(credential)
    try:
        jar = SimpleCookie(cookie)
    except CookieError:
        return None
    session = jar.get("session")
    return PEOPLE.get(session.value) if session else None


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/oauth2/auth":
            self._answer(404, {})
            return
        claims = claims_for(self.headers.get("Cookie", ""), self.headers.get("Authorization", ""))
        assert isinstance(self.server, StubServer)
        self.server.checks.append(claims)
        if claims is None:
            self._answer(401, {})
        else:
            self._answer(202, {HEADERS[k]: v for k, v in claims.items()})

    def _answer(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the stdlib's name)
        """Quiet: nginx's access log already records every check."""


class StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self.checks: list[dict[str, str] | None] = []  # claims answered, None for a 401


class AuthStub:
    """The stub on a free loopback port, served from a daemon thread."""

    def __init__(self, port: int = 0) -> None:
        self.httpd = StubServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def checks(self) -> list[dict[str, str] | None]:
        """Every check answered so far: the claims given, or None for a 401."""
        return list(self.httpd.checks)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> "AuthStub":
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.thread.is_alive():  # shutdown() would wait forever for a loop never started
            self.httpd.shutdown()
            self.thread.join(timeout=5)
        self.httpd.server_close()


if __name__ == "__main__":
    stub = AuthStub(int(sys.argv[1]) if len(sys.argv) > 1 else 4180)
    print(f"authstub on 127.0.0.1:{stub.port}")
    stub.httpd.serve_forever()
