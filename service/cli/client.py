"""What the commands share: the server URL, the credential, the client, output, clear errors.

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

import msgspec

from service.auth.tokens import NOT_A_TOKEN
from service.client import ApiError, BerthClient, Unreachable
from service.core.exits import Exit, for_status

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


@contextlib.contextmanager
def connect(server: str | None) -> Iterator[BerthClient]:
    """The typed client (service/client) for the server and credential found as above.

    What goes wrong inside the `with` is said in one line: an error answer as the server wrote
    it (a 401 naming where the credential came from, never the credential), no answer naming
    where the server's URL came from.
    """
    url, url_from = server_url(server)
    token, token_from = credential()
    # verify=True with trust_env honours SSL_CERT_FILE for a private CA.
    with BerthClient(url, token) as client:
        try:
            yield client
        except Unreachable as exc:
            raise unreachable(url, url_from, exc.message, "lost" if exc.lost else None) from None
        except ApiError as exc:
            raise refusal(exc, token_from) from None


def unreachable(url: str, url_from: str, why: str, verb: str | None = None) -> CliError:
    """The one line for a server that does not answer, saying where its URL came from."""
    where = {
        "--server": "",
        "BERTH_SERVER": " (from BERTH_SERVER)",
        DEFAULT: f" (the default: no BERTH_SERVER, and no $BERTH_HOME/{URL_FILE} from a "
        "running `berth serve`)",
    }.get(url_from, f" (from {url_from}: is that `berth serve` running?)")
    return CliError(f"{verb or 'cannot reach'} the server at {url}{where}: {why}", Exit.UNREACHABLE)


def refusal(exc: ApiError, token_from: str) -> CliError:
    """An error answer as one line; a 401 names the credential's source (never the credential)."""
    code = for_status(exc.status)
    if exc.status != 401:
        return CliError(exc.message, code)
    if exc.message == NOT_A_TOKEN:
        return CliError(f"{token_from} is {NOT_A_TOKEN}", code)
    return CliError(f"{token_from}: {exc.message}", code)


def print_json(data: Any) -> None:  # noqa: ANN401
    """Views (and plain data) as indented JSON, the shape the API answers with."""
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
