"""nginx (auth_request) plus the auth stub in front of an upstream, all on loopback, for tests.

`ProxyFront(prefix, upstream).start()` starts tests/proxy/authstub.py on a free port, renders
nginx.conf.template under `prefix` and runs `nginx -p prefix` in the foreground as a child process;
`.url` is where clients go, `.stop()` ends both. nginx missing is an error, not a skip:
scripts/test installs it.
"""

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Self

from tests.proxy.authstub import AuthStub

TEMPLATE = Path(__file__).with_name("nginx.conf.template")
HEADERS_MORE = Path("/usr/lib/nginx/modules/ngx_http_headers_more_filter_module.so")
# Every client-sent header that berth could read as a claim (or that a proxy would stamp).
STRIP = "'X-Auth-Request-*' 'X-Forwarded-User' 'X-Forwarded-Email' 'X-Forwarded-Groups'"


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else "")
    if not found:
        raise RuntimeError(
            "nginx is not installed; scripts/test installs it "
            "(apt-get install nginx libnginx-mod-http-headers-more-filter)"
        )
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def render(prefix: Path, port: int, auth_port: int, upstream: str, headers_more: bool) -> str:
    values = {
        "PREFIX": str(prefix),
        "PORT": str(port),
        "AUTH_PORT": str(auth_port),
        "UPSTREAM": upstream,
        # As root the workers would drop to `nobody`, who cannot write under pytest's tmp dirs.
        "USER": "user root root;" if os.geteuid() == 0 else "",
        "LOAD_HEADERS_MORE": f"load_module {HEADERS_MORE};" if headers_more else "",
        "CLEAR_INPUT_HEADERS": f"more_clear_input_headers {STRIP};" if headers_more else "",
    }
    text = TEMPLATE.read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    left = re.findall(r"@[A-Z_]+@", text)
    assert not left, f"unrendered placeholders: {left}"
    return text


class ProxyFront:
    """nginx + auth stub before `upstream` (host:port)."""

    def __init__(self, prefix: Path, upstream: str, *, headers_more: bool | None = None) -> None:
        self.prefix = prefix
        self.upstream = upstream
        self.headers_more = HEADERS_MORE.exists() if headers_more is None else headers_more
        self.port = free_port()
        self.stub = AuthStub()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15) -> Self:
        binary = nginx_binary()
        self.stub.start()
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.prefix / "tmp" / sub).mkdir(parents=True, exist_ok=True)
        conf = self.prefix / "nginx.conf"
        conf.write_text(
            render(self.prefix, self.port, self.stub.port, self.upstream, self.headers_more)
        )
        argv = [
            binary,
            "-p",
            str(self.prefix),
            "-e",
            str(self.prefix / "error.log"),
            "-c",
            str(conf),
        ]
        out = (self.prefix / "nginx.out").open("ab")
        self.proc = subprocess.Popen(argv, stdout=out, stderr=out)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stub.stop()
                raise RuntimeError(f"nginx exited {self.proc.returncode}:\n{self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            except OSError:
                time.sleep(0.05)
                continue
            return self
        self.stop()
        raise RuntimeError(f"nginx did not listen on {self.port}:\n{self.log()}")

    def log(self) -> str:
        parts = []
        for name in ("nginx.out", "error.log"):
            path = self.prefix / name
            if path.exists():
                parts.append(f"--- {name}\n" + path.read_text(errors="replace")[-4000:])
        return "\n".join(parts)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # fast shutdown: open websockets are closed, not waited for
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stub.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
