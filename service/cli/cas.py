"""`berth cas serve | put | get`: the artifact store from the command line.

`put` and `get` go through a server's /api/v1/cas as the caller's tenant (or `--tenant`), the
way `job submit --input` and `job fetch` do (cli/transfer.py): `put` uploads only what the
tenant does not hold yet and prints the sha256 alone; `get` writes the blob to OUT or stdout,
verified before its last bytes arrive.
`serve` runs `berth cas serve`; its server-side imports are lazy, so `put` and `get` run on a
machine without the server extra.
"""

import argparse
import os
from pathlib import Path
from typing import Any

from service.cas import base
from service.cli import transfer
from service.cli.client import CliError, add_server_arg, connect
from service.core.errors import Invalid

DEFAULT_LISTEN = "127.0.0.1:7701"


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser("cas", help="the artifact store: serve it, put and get blobs")
    csub = p.add_subparsers(dest="cas_command", required=True, parser_class=type(p))
    sv = csub.add_parser("serve", help="serve the configured [cas] store to the installation")
    sv.add_argument("--listen", help=f"HOST:PORT (default {DEFAULT_LISTEN})")
    sv.add_argument("--home", type=Path, help="berth's home (env BERTH_HOME, default ~/.berth)")
    sv.add_argument("--config", type=Path, help="config file (default $BERTH_HOME/berth.toml)")
    sv.set_defaults(func=serve)
    pt = csub.add_parser("put", help="upload a file; prints its sha256")
    add_server_arg(pt, json=False)
    pt.add_argument("--tenant")
    pt.add_argument("file", type=Path)
    pt.set_defaults(func=put)
    gt = csub.add_parser("get", help="download a blob to OUT, or to stdout")
    add_server_arg(gt, json=False)
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
    from service.cli import cas_serve_process  # noqa: PLC0415

    return cas_serve_process.main(cfg, host=host, port=port)


def put(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        print(transfer.upload(client, args.file, tenant=args.tenant).sha256)
    return 0


def get(args: argparse.Namespace) -> int:
    try:
        sha256 = base.check_name(args.sha256)
    except base.BadName as exc:
        raise CliError(str(exc)) from None
    out: Path | None = args.out
    if out is not None and out.is_dir():
        out /= sha256
    with connect(args.server) as client:
        transfer.download(client, sha256, out, tenant=args.tenant)
    return 0
