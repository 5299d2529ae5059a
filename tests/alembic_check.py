"""`alembic check` against a freshly migrated scratch database (run by scripts/test).

Alembic's own command, so CI proves models and migrations agree the way ops would check it.
"""

import asyncio
import os
import subprocess
import sys

from service.db import migrate
from tests import pg


def main() -> int:
    with pg.server() as admin_url:
        name = f"berth_alembic_check_{os.getpid()}"
        asyncio.run(
            pg.admin(
                admin_url,
                f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
                f'CREATE DATABASE "{name}"',
            )
        )
        try:
            url = pg.with_db(admin_url, name)
            migrate.upgrade(url)
            env = {**os.environ, "BERTH_DATABASE_URL": url}
            return subprocess.run(
                [sys.executable, "-m", "alembic", "check"], env=env, check=False
            ).returncode
        finally:
            asyncio.run(pg.admin(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


if __name__ == "__main__":
    sys.exit(main())
