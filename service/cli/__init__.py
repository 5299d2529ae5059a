"""The `berth` console script: argparse dispatch, one-line errors, exit codes.

Each command group lives in its own module with `add(subparsers)`. Server-side imports are
lazy (inside the functions that need them), so `berth worker` and the client commands run on a
machine without the server extra.
"""

import argparse
import sys
from collections.abc import Sequence

from service import __version__
from service.cli import cas, db, job, limits, ops, serve, simple, token, worker
from service.cli.client import CliError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line and exit 2, as argparse does, but without the usage block.
        sys.stderr.write(f"berth: error: {message}\n")
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="berth", description="Run jobs on workers spread over many machines.")
    p.add_argument("--version", action="version", version=f"berth {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve.add(sub)
    db.add(sub)
    token.add(sub)
    worker.add(sub)
    job.add(sub)
    simple.add(sub)
    limits.add(sub)
    ops.add(sub)
    cas.add(sub)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        code = args.func(args)
    except CliError as exc:
        sys.stderr.write(f"berth: error: {exc}\n")
        code = exc.code
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:  # the user's mistakes are CliErrors; this is the last guard
        from service.core.errors import BerthError  # noqa: PLC0415

        if isinstance(exc, BerthError):
            sys.stderr.write(f"berth: error: {exc.message}\n")
            code = 2
        else:
            raise
    raise SystemExit(code or 0)
