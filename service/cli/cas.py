"""`berth cas serve | put | get`: the artifact store from the command line.

`put` and `get` go through a server's /api/v1/cas as the caller's tenant (or `--tenant`): `put`
asks with HEAD first and uploads only when the tenant does not hold the blob yet, then prints
the sha256 alone; `get` writes the blob to OUT (replaced only once it is verified) or to stdout
(the last chunk held back until the digest is known, so a wrong blob never arrives whole).
`serve` runs `berth cas serve`; its server-side imports are lazy, so `put` and `get` run on a
machine without the server extra.
"""

import argparse
import contextlib
import hashlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import httpx

from service.cas import base, files
from service.cli.client import DEFAULT_SERVER, CliError, credential
from service.core.errors import Invalid

PATH = "/api/v1/cas"
DEFAULT_LISTEN = "127.0.0.1:7701"
HEAD_REFUSED = {
    400: "the server refused the request (HTTP 400): check --tenant",
    401: "the server does not accept this credential (HTTP 401)",
    403: "you may not upload there (HTTP 403)",
    503: "the server's artifact store is not available (HTTP 503); retry shortly",
}


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser("cas", help="the artifact store: serve it, put and get blobs")
    csub = p.add_subparsers(dest="cas_command", required=True, parser_class=type(p))
    sv = csub.add_parser("serve", help="serve the configured [cas] store to the installation")
    sv.add_argument("--listen", help=f"HOST:PORT (default {DEFAULT_LISTEN})")
    sv.add_argument("--home", type=Path, help="berth's home (env BERTH_HOME, default ~/.berth)")
    sv.add_argument("--config", type=Path, help="config file (default $BERTH_HOME/berth.toml)")
    sv.set_defaults(func=serve)
    pt = csub.add_parser("put", help="upload a file; prints its sha256")
    pt.add_argument("--server", help="server URL (env BERTH_SERVER)")
    pt.add_argument("--tenant")
    pt.add_argument("file", type=Path)
    pt.set_defaults(func=put)
    gt = csub.add_parser("get", help="download a blob to OUT, or to stdout")
    gt.add_argument("--server", help="server URL (env BERTH_SERVER)")
    gt.add_argument("--tenant")
    gt.add_argument("sha256")
    gt.add_argument("out", nargs="?", type=Path)
    gt.set_defaults(func=get)


def serve(args: argparse.Namespace) -> int:
    if args.home:
        os.environ["BERTH_HOME"] = str(args.home.expanduser().resolve())
    from service import config as config_mod  # noqa: PLC0415  (server-side imports stay lazy)

    cfg = config_mod.load(args.config)
    listen = args.listen or DEFAULT_LISTEN
    try:
        host, port = config_mod.split_listen(listen)
    except Invalid:
        raise CliError(f"--listen: {listen!r} is not HOST:PORT") from None
    if not config_mod.is_loopback(host) and not cfg.network.tls:
        raise CliError(
            f"refusing to listen on {listen} without TLS: set [network] tls = "
            '{ cert = "...", key = "..." }, or tls = "proxy" when a proxy ends TLS; '
            "only a loopback address may go without"
        )
    from service.cli import cas_server  # noqa: PLC0415

    return cas_server.main(cfg, host=host, port=port)


@contextlib.contextmanager
def _client(server: str | None) -> Iterator[tuple[str, httpx.Client]]:
    url = (server or os.environ.get("BERTH_SERVER") or DEFAULT_SERVER).rstrip("/")
    http = httpx.Client(
        base_url=url,
        headers={"Authorization": f"Bearer {credential()}"},
        timeout=httpx.Timeout(60.0),
    )
    try:
        yield url, http
    except httpx.HTTPError as exc:
        raise CliError(
            f"cannot reach the server at {url}: {type(exc).__name__}: {exc}", 3
        ) from None
    finally:
        http.close()


def _fail(r: httpx.Response) -> NoReturn:
    try:
        message = r.json().get("error")
    except (ValueError, AttributeError):
        message = None
    raise CliError(message or f"HTTP {r.status_code}", 1 if r.status_code >= 500 else 2)


def _read(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while block := f.read(files.CHUNK):
            yield block


def put(args: argparse.Namespace) -> int:
    path: Path = args.file
    try:
        sha256, size = files.hash_file(path)
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    params = {"tenant": args.tenant} if args.tenant else {}
    with _client(args.server) as (_, http):
        r = http.head(f"{PATH}/{sha256}", params=params)
        if r.status_code == 200 and r.headers.get("content-length") == str(size):
            print(sha256)
            return 0
        if r.status_code not in (200, 404):  # a HEAD answer has no body to quote
            raise CliError(HEAD_REFUSED.get(r.status_code, f"HTTP {r.status_code} to HEAD"))
        r = http.put(f"{PATH}/{sha256}", params=params, content=_read(path))
        if r.status_code not in (200, 201):
            _fail(r)
    print(sha256)
    return 0


def get(args: argparse.Namespace) -> int:
    try:
        sha256 = base.check_name(args.sha256)
    except base.BadName as exc:
        raise CliError(str(exc)) from None
    params = {"tenant": args.tenant} if args.tenant else {}
    out: Path | None = args.out
    if out is not None and out.is_dir():
        out /= sha256
    with (
        _client(args.server) as (url, http),
        http.stream("GET", f"{PATH}/{sha256}", params=params) as r,
    ):
        if r.status_code != 200:
            r.read()
            _fail(r)
        try:
            if out is None:
                _verified(r, sha256, sys.stdout.buffer.write)
                sys.stdout.buffer.flush()
            else:
                _to_file(r, sha256, out)
        except httpx.HTTPError as exc:
            raise CliError(
                f"the download of {sha256} from {url} was cut short ({type(exc).__name__}): "
                "the server found the blob corrupt, or went away",
                1,
            ) from None
    return 0


def _verified(r: httpx.Response, sha256: str, sink: Callable[[bytes], object]) -> None:
    """Pass the body to `sink`, holding the last chunk back until the digest is known."""
    digest = hashlib.sha256()
    held: bytes | None = None
    for chunk in r.iter_bytes(files.CHUNK):
        digest.update(chunk)
        if held is not None:
            sink(held)
        held = chunk
    if digest.hexdigest() != sha256:
        raise CliError(f"blob {sha256} is corrupt: it hashes to {digest.hexdigest()}", 1)
    if held is not None:
        sink(held)


def _to_file(r: httpx.Response, sha256: str, out: Path) -> None:
    """Write to a temporary file beside `out`, renamed over it once verified."""
    try:
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    except OSError as exc:
        raise CliError(f"cannot write {out}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            _verified(r, sha256, f.write)
        Path(tmp).replace(out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            Path(tmp).unlink()
