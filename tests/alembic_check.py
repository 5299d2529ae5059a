"""`alembic check` against a freshly migrated scratch database (run by scripts/test).

Alembic's own command, so CI proves models and migrations agree the way ops would check it.
"""

import os
import subprocess
import sys

from service.db import migrate
from tests import pg


def main() -> int:
    with pg.server() as admin_url, pg.scratch(admin_url, f"berth_alembic_{os.getpid()}") as url:
        migrate.upgrade(url)
        env = {**os.environ, "BERTH_DATABASE_URL": url}
        check = [sys.executable, "-m", "alembic", "check"]
        return subprocess.run(check, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
