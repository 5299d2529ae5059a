"""berth's exit codes: a block of their own, documented the same in --help and README.md."""

import re
import tomllib
from pathlib import Path

from service.cli import SERVER_PACKAGES, parser
from service.core import exits
from service.core.exits import Exit
from service.core.states import JobState, exit_status

ROOT = Path(__file__).resolve().parents[2]


class TestExitCodes:
    def test_own_failures_are_apart_from_what_a_waited_job_returns(self):
        """The codes berth gives a job's end (0, 1, 124, 130) are none of its own failures'."""
        own = {e for e in Exit if e >= Exit.BUG}
        assert own == set(range(200, 208))
        for state in JobState:
            assert exit_status(state, None) not in own

    def test_statuses(self):
        """Each HTTP error status of the server has its code."""
        got = {s: exits.for_status(s) for s in (400, 401, 403, 404, 409, 413, 422, 500, 503)}
        assert got == {
            400: Exit.BAD_INPUT,
            401: Exit.REFUSED,
            403: Exit.REFUSED,
            404: Exit.NOT_FOUND,
            409: Exit.CONFLICT,
            413: Exit.BAD_INPUT,
            422: Exit.BAD_INPUT,
            500: Exit.SERVER_ERROR,
            503: Exit.SERVER_ERROR,
        }

    def test_every_code_is_in_the_table(self):
        """Every Exit member is documented."""
        assert {int(e) for e in Exit} <= {int(code) for code, _ in exits.TABLE if code.isdigit()}

    def test_help_and_readme_show_the_table(self):
        """`berth --help` ends with the table; README.md has it word for word."""
        text = parser().format_help()
        for code, meaning in exits.TABLE:
            assert re.search(
                rf"^\s+{re.escape(code)}\s+{re.escape(meaning[:40])}", text, re.MULTILINE
            )
        assert exits.markdown() in (ROOT / "README.md").read_text()


class TestServerPackages:
    def test_the_servers_extra(self):
        """The modules a server command is told to install are those of berth[server]."""
        extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
            "optional-dependencies"
        ]["server"]
        names = {re.split(r"[\[<>=~ ]", d, maxsplit=1)[0].replace("-", "_") for d in extra}
        assert names == SERVER_PACKAGES
