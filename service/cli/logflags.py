"""`--log-level` and `--log-format` for the long-running commands (`serve`, `worker`)."""

import argparse
import sys

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("console", "json")


def add_log_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", choices=LEVELS, default="info", help="default: %(default)s")
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        help="console: lines for people; json: one object a line (default: console on a "
        "terminal, json otherwise)",
    )


def log_json(args: argparse.Namespace) -> bool:
    """Whether to log JSON lines: as asked, else when stderr is not a terminal."""
    if args.log_format:
        return bool(args.log_format == "json")
    return not sys.stderr.isatty()
