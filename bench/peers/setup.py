"""Create one virtual environment per peer under ``bench/.venvs/<name>``.

Peers are installed in their own environments so that their dependency pins never meet berth's
(or each other's). A venv is reused when its marker file records the same requirement list and
interpreter, so a second run costs nothing; a changed pin rebuilds it from scratch.

Usage: ``python bench/peers/setup.py [--only NAME ...] [--force]``. Prints one JSON object per venv
with the installed versions of the packages that matter, and writes them to ``versions.json``
inside the venv.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
VENVS_DIR = BENCH_DIR / ".venvs"
MARKER = ".bench-marker.json"

# Pinned so that numbers from two runs compare like with like; bump deliberately.
REQUIREMENTS: dict[str, list[str]] = {
    "procrastinate": ["procrastinate[psycopg]==3.10.0"],
    "pgqueuer": ["pgqueuer[asyncpg]==1.6.0"],
    "celery": ["celery[redis]==5.7.0"],
    # The ceilings: raw asyncpg claim loop and hello-world HTTP servers. uvicorn[standard] brings
    # uvloop and httptools so both the fast and the plain-h11 configurations can be measured.
    "ceilings": [
        "asyncpg==0.32.0",
        "litestar==2.25.0",
        "uvicorn[standard]==0.54.0",
        "granian==2.8.9",
    ],
}

# The distributions whose versions are worth reporting next to the numbers.
REPORTED: dict[str, list[str]] = {
    "procrastinate": ["procrastinate", "psycopg", "psycopg-pool"],
    "pgqueuer": ["pgqueuer", "asyncpg"],
    "celery": ["celery", "kombu", "redis"],
    "ceilings": ["asyncpg", "litestar", "uvicorn", "granian", "uvloop", "httptools"],
}


def venv_python(name: str) -> Path:
    return VENVS_DIR / name / "bin" / "python"


def _marker_payload(name: str) -> dict[str, object]:
    return {"requirements": REQUIREMENTS[name], "python": sys.version.split()[0]}


def _installed_versions(name: str) -> dict[str, str]:
    out = subprocess.run(
        [str(venv_python(name)), "-m", "pip", "list", "--format=json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    wanted = {d.lower() for d in REPORTED[name]}
    return {
        row["name"].lower(): row["version"]
        for row in json.loads(out)
        if row["name"].lower() in wanted
    }


def ensure_venv(name: str, *, force: bool = False) -> dict[str, str]:
    """Create (or reuse) the venv for ``name`` and return the reported package versions."""
    root = VENVS_DIR / name
    marker = root / MARKER
    wanted = _marker_payload(name)
    if not force and marker.exists():
        try:
            if json.loads(marker.read_text()) == wanted and venv_python(name).exists():
                return _installed_versions(name)
        except json.JSONDecodeError:
            pass  # a half-written marker means a half-built venv: rebuild it
    if root.exists():
        shutil.rmtree(root)
    VENVS_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    pip = [str(venv_python(name)), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True, timeout=600)
    subprocess.run([*pip, *REQUIREMENTS[name]], check=True, timeout=1200)
    versions = _installed_versions(name)
    (root / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")
    # The marker is written last: its presence means the install finished.
    marker.write_text(json.dumps(wanted))
    return versions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(REQUIREMENTS), default=None)
    parser.add_argument("--force", action="store_true", help="rebuild even if the marker matches")
    args = parser.parse_args(argv)
    for name in args.only or sorted(REQUIREMENTS):
        versions = ensure_venv(name, force=args.force)
        print(json.dumps({"venv": name, "versions": versions}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
