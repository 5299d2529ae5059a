"""berth's exit codes: its own failures in a block of their own (200-207), apart from a job's.

`job submit --wait`, `job wait` and `job logs -f` exit with the job's code (SPEC section 2), so a
remote job feels local. berth's own failures use the codes below and always print one line on
stderr starting `berth: error:`; that line and the code are how a script tells them from a job's.
The table is `berth --help`'s epilog and README.md's (a test keeps them the same).
"""

import enum


class Exit(enum.IntEnum):
    OK = 0
    INTERRUPTED = 130  # Ctrl-C, as a shell reports it
    PIPE_CLOSED = 141  # stdout closed early: 128 + SIGPIPE, what a shell reports for `yes | head`
    BUG = 200
    BAD_INPUT = 201
    REFUSED = 202
    NOT_FOUND = 203
    CONFLICT = 204
    UNREACHABLE = 205
    SERVER_ERROR = 206
    NOT_INSTALLED = 207


# (code, meaning) in the order documented; "1-255" stands for a job's own codes.
TABLE: tuple[tuple[str, str], ...] = (
    ("0", "done (with `--wait`, `job wait`, `job logs -f`: the job succeeded)"),
    (
        "1-255",
        (
            "with `--wait`, `job wait`, `job logs -f`: the job's own exit code (124: it timed "
            "out, 130: it was cancelled, 1: it failed without a code); no `berth: error:` line"
        ),
    ),
    ("1", "`berth audit verify`: the audit chain is broken (a finding; the line says where)"),
    (str(Exit.INTERRUPTED.value), "interrupted (Ctrl-C); a job being waited on goes on"),
    (
        str(Exit.PIPE_CLOSED.value),
        (
            "stdout was closed early (`berth audit list | head -1`): berth stops quietly, "
            "as other Unix tools do"
        ),
    ),
    (str(Exit.BUG.value), "a bug in berth (one line; `BERTH_DEBUG=1` shows the traceback)"),
    (
        str(Exit.BAD_INPUT.value),
        "bad input: usage, an argument, the configuration, a URL (HTTP 400, 413, 422)",
    ),
    (
        str(Exit.REFUSED.value),
        "refused: no credential, a bad or revoked one, or not allowed (HTTP 401, 403)",
    ),
    (str(Exit.NOT_FOUND.value), "not found (HTTP 404)"),
    (
        str(Exit.CONFLICT.value),
        "conflicts with the current state (HTTP 409), e.g. `worker rm` of a worker holding a lease",
    ),
    (str(Exit.UNREACHABLE.value), "cannot reach the server or the database"),
    (str(Exit.SERVER_ERROR.value), "the server failed (HTTP 5xx, e.g. its database is down)"),
    (
        str(Exit.NOT_INSTALLED.value),
        "this install lacks the server's packages: `pip install 'berth[server]'`",
    ),
)


def for_status(status: int) -> Exit:
    """The exit code for an HTTP error status from the server."""
    if status >= 500:
        return Exit.SERVER_ERROR
    return {
        401: Exit.REFUSED,
        403: Exit.REFUSED,
        404: Exit.NOT_FOUND,
        409: Exit.CONFLICT,
    }.get(status, Exit.BAD_INPUT)


def text() -> str:
    """The table as plain text (the CLI's --help epilog)."""
    width = max(len(code) for code, _ in TABLE)
    lines = ["Exit codes (berth's own failures also print one line starting `berth: error:`):"]
    lines += [f"  {code:>{width}}  {meaning}" for code, meaning in TABLE]
    return "\n".join(lines)


def markdown() -> str:
    """The table as README.md has it."""
    rows = ["| code | meaning |", "| --- | --- |"]
    pipe = "\\|"  # a pipe inside a cell
    rows += [f"| {code} | {meaning.replace('|', pipe)} |" for code, meaning in TABLE]
    return "\n".join(rows)
