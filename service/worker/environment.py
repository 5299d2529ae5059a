"""A job's environment, built from nothing (SPEC section 4): never the worker's own.

The worker's process holds its credential and settings (BERTH_TOKEN, BERTH_CONFIG_JSON, and in
the built-in worker the server's BERTH_DATABASE_URL and BERTH_SECRET_KEY). A job is untrusted
code of one tenant, so it starts from a small base, then the names the operator passed with
`--pass-env`, then its own env, its secrets, and berth's variables last (a job cannot fake them).

PATH is the system's, never the worker's own: a worker's PATH names folders of its user (a
pyenv's shims in root's home, a virtualenv) that the job's uid cannot enter or should not use.
"""

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
BASE_NAMES = ("LANG", "TZ")  # taken from the worker's environment when set
LOCALE = re.compile(r"^LC_[A-Z_]+$")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class BadPassEnv(ValueError):
    """A --pass-env name that may not be passed (a berth setting) or is not a variable name."""


def check_pass_env(names: Sequence[str]) -> tuple[str, ...]:
    """The --pass-env names, refusing BERTH_* (the worker's own settings and credential)."""
    for name in names:
        if not NAME.match(name):
            raise BadPassEnv(f"--pass-env {name!r} is not an environment variable name")
        if name.upper().startswith("BERTH_"):
            raise BadPassEnv(f"--pass-env {name}: berth's own settings never reach a job")
    return tuple(dict.fromkeys(names))


def build(
    worker_env: Mapping[str, str],
    *,
    pass_env: Sequence[str],
    job_env: Mapping[str, str],
    secrets: Mapping[str, str],
    berth: Mapping[str, str],
    workdir: Path,
    user: str,
) -> dict[str, str]:
    """The environment a job starts with, in the order of SPEC section 4."""
    env = {name: worker_env[name] for name in BASE_NAMES if worker_env.get(name)}
    env.update({k: v for k, v in worker_env.items() if LOCALE.match(k)})
    env["PATH"] = DEFAULT_PATH
    env.setdefault("LANG", "C.UTF-8")
    env["HOME"] = str(workdir)
    env["TMPDIR"] = str(workdir / "tmp")
    env["USER"] = user
    env["SHELL"] = "/bin/sh"
    env.update({k: worker_env[k] for k in pass_env if k in worker_env})
    env.update(job_env)
    env.update(secrets)
    env.update(berth)
    return env
