"""The HTTP client the commands share: server URL, credential, JSON in and out, clear errors."""

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec

DEFAULT_SERVER = "http://127.0.0.1:8443"


class CliError(Exception):
    """A user-facing error: printed as one line, exit code `code`."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def home() -> Path:
    return Path(os.environ.get("BERTH_HOME") or Path.home() / ".berth").expanduser()


def credential() -> str:
    if token := os.environ.get("BERTH_TOKEN"):
        return token.strip()
    path = home() / "admin.token"
    try:
        return path.read_text().strip()
    except OSError:
        raise CliError(
            f"no credential: set BERTH_TOKEN or run `berth serve` to create {path}"
        ) from None


class Client:
    def __init__(self, server: str | None) -> None:
        self.server = (server or os.environ.get("BERTH_SERVER") or DEFAULT_SERVER).rstrip("/")
        self._http = httpx.Client(
            base_url=self.server,
            headers={"Authorization": f"Bearer {credential()}"},
            timeout=httpx.Timeout(30.0, read=None),
            # verify=True with trust_env honours SSL_CERT_FILE for a private CA.
        )

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:  # noqa: ANN401
        try:
            r = self._http.request(
                method,
                path,
                content=msgspec.json.encode(body) if body is not None else None,
                headers={"content-type": "application/json"} if body is not None else None,
                params={k: v for k, v in params.items() if v is not None},
            )
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach the server at {self.server}: {exc}", 3) from None
        return result(r)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        content: Any = None,  # noqa: ANN401  (bytes or an iterator of them)
        timeout: float | None = 30.0,
    ) -> httpx.Response:
        """A raw request (its response is the caller's to read); unreachable is one line."""
        try:
            return self._http.request(method, path, params=params, content=content, timeout=timeout)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach the server at {self.server}: {exc}", 3) from None

    def stream(
        self, method: str, path: str, params: dict[str, str]
    ) -> contextlib.AbstractContextManager[httpx.Response]:
        """A streamed response, to be read inside `with`."""
        return self._http.stream(method, path, params=params)

    def stream_lines(self, path: str, **params: Any) -> Iterator[dict[str, Any]]:  # noqa: ANN401
        try:
            with self._http.stream("GET", path, params=params) as r:
                if r.status_code >= 400:
                    r.read()
                    result(r)
                for line in r.iter_lines():
                    if line.strip():
                        yield msgspec.json.decode(line)
        except httpx.HTTPError as exc:
            raise CliError(f"lost the server at {self.server}: {exc}", 3) from None


def result(r: httpx.Response) -> Any:  # noqa: ANN401
    """The JSON of a response, or the CliError its error body names."""
    try:
        data = r.json() if r.content else None
    except ValueError:
        data = None
    if r.status_code >= 400:
        message = data.get("error") if isinstance(data, dict) else None
        raise CliError(message or f"HTTP {r.status_code}", 1 if r.status_code >= 500 else 2)
    return data


def print_json(data: Any) -> None:  # noqa: ANN401
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(data)).decode() + "\n")


def listing(args: Any, data: Any, rows: list[list[str]], header: list[str]) -> int:  # noqa: ANN401
    """A listing command's output: `data` as JSON with --json, else `rows` as a table."""
    if args.json:
        print_json(data)
    else:
        table(rows, header)
    return 0


def table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for row in [header, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=False)).rstrip())


def add_server_arg(p: Any) -> None:  # noqa: ANN401
    p.add_argument("--server", help="server URL (env BERTH_SERVER, default %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
