"""The HTTP client the commands share: server URL, credential, JSON in and out, clear errors.

Which server: `--server`, else BERTH_SERVER, else the URL a local `berth serve` wrote to
`$BERTH_HOME/server.url` when it started, else http://127.0.0.1:8443 (SPEC section 2).
"""

import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec

from service.auth.tokens import NOT_A_TOKEN
from service.client import events as job_events
from service.core.exits import Exit, for_status
from service.events import JobEvent

DEFAULT_SERVER = "http://127.0.0.1:8443"
URL_FILE = "server.url"  # in $BERTH_HOME: the URL `berth serve` listens on, while it runs
DEFAULT = "the default"


class CliError(Exception):
    """A user-facing error: printed as one line, exit code `code` (service/core/exits.py)."""

    def __init__(self, message: str, code: int = Exit.BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


def home() -> Path:
    return Path(os.environ.get("BERTH_HOME") or Path.home() / ".berth").expanduser()


def server_url(given: str | None = None) -> tuple[str, str]:
    """The server to talk to, and where that came from (said when it cannot be reached)."""
    if given:
        return given.rstrip("/"), "--server"
    if env := os.environ.get("BERTH_SERVER", "").strip():
        return env.rstrip("/"), "BERTH_SERVER"
    path = home() / URL_FILE
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if written := path.read_text().strip():
            return written.rstrip("/"), str(path)
    return DEFAULT_SERVER, DEFAULT


def write_server_url(berth_home: Path, url: str) -> Path:
    """`berth serve` says where it listens, for the CLI on this machine."""
    path = berth_home / URL_FILE
    tmp = path.with_name(f".{URL_FILE}.{os.getpid()}")
    tmp.write_text(url + "\n")
    tmp.replace(path)  # whole or not at all: a reader never sees half a URL
    return path


def remove_server_url(berth_home: Path, url: str) -> None:
    """On a clean stop: remove the file, unless another server has written its own since."""
    path = berth_home / URL_FILE
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if path.read_text().strip() == url:
            path.unlink()


def credential() -> tuple[str, str]:
    """The credential to present and where it came from (named in a refusal, never shown)."""
    if token := os.environ.get("BERTH_TOKEN", "").strip():
        return _checked(token, "BERTH_TOKEN"), "BERTH_TOKEN"
    path = home() / "admin.token"
    try:
        return _checked(path.read_text().strip(), str(path)), str(path)
    except OSError:
        raise CliError(
            f"no credential: set BERTH_TOKEN or run `berth serve` to create {path}", Exit.REFUSED
        ) from None


def _checked(token: str, where: str) -> str:
    # A header carries printable ASCII only: a token pasted with a stray character (an ellipsis,
    # a newline) is no token, and is said so before anything is sent.
    if not token or not all(" " < c < "\x7f" for c in token):
        raise CliError(f"{where} is not a berth token (brt_…)", Exit.REFUSED)
    return token


class Client:
    def __init__(self, server: str | None) -> None:
        self.server, self._server_from = server_url(server)
        token, self._credential_from = credential()
        self._http = httpx.Client(
            base_url=self.server,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(30.0, read=None),
            # verify=True with trust_env honours SSL_CERT_FILE for a private CA.
        )

    def unreachable(self, exc: Exception, verb: str = "cannot reach") -> CliError:
        """The one line for a server that does not answer, saying where its URL came from."""
        where = {
            "--server": "",
            "BERTH_SERVER": " (from BERTH_SERVER)",
            DEFAULT: f" (the default: no BERTH_SERVER, and no $BERTH_HOME/{URL_FILE} from a "
            "running `berth serve`)",
        }.get(self._server_from, f" (from {self._server_from}: is that `berth serve` running?)")
        return CliError(f"{verb} the server at {self.server}{where}: {exc}", Exit.UNREACHABLE)

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
            raise self.unreachable(exc) from None
        return self.result(r)

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
            raise self.unreachable(exc) from None

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
                    self.result(r)
                for line in r.iter_lines():
                    if line.strip():
                        yield msgspec.json.decode(line)
        except httpx.HTTPError as exc:
            raise self.unreachable(exc, "lost") from None

    def events(
        self, job_id: int, *, encoding: str = "text", output: bool = True
    ) -> Iterator[JobEvent]:
        """The job's events pushed by the server until its end, across dropped connections."""
        try:
            yield from job_events.follow(
                self._http, job_id, refused=self.result, encoding=encoding, output=output
            )
        except job_events.Lost as exc:
            raise self.unreachable(exc) from None

    def result(self, r: httpx.Response) -> Any:  # noqa: ANN401
        """`result(r)`, a refusal naming the credential's source (never the credential)."""
        try:
            return result(r)
        except CliError as exc:
            if r.status_code != 401:
                raise
            if str(exc) == NOT_A_TOKEN:
                raise CliError(f"{self._credential_from} is {NOT_A_TOKEN}", exc.code) from None
            raise CliError(f"{self._credential_from}: {exc}", exc.code) from None


def result(r: httpx.Response) -> Any:  # noqa: ANN401
    """The JSON of a response, or the CliError its error body names."""
    try:
        data = r.json() if r.content else None
    except ValueError:
        data = None
    if r.status_code >= 400:
        message = data.get("error") if isinstance(data, dict) else None
        raise CliError(message or f"HTTP {r.status_code}", for_status(r.status_code))
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


@functools.cache  # every command's parser asks; the answer is the same within one process
def server_help() -> str:
    """--server's help: the order it is found in, and what it is here and now."""
    url, source = server_url()
    now = (f"{url}, " + (source if source == DEFAULT else f"from {source}")).replace("%", "%%")
    return (
        f"server URL: BERTH_SERVER, else $BERTH_HOME/{URL_FILE} (written by a running "
        f"`berth serve`), else {DEFAULT_SERVER}; here: {now}"
    )


def add_server_arg(p: Any, *, json: bool = True) -> None:  # noqa: ANN401
    p.add_argument("--server", metavar="URL", help=server_help())
    if json:
        p.add_argument("--json", action="store_true", help="machine-readable output")
