"""deploy/kubernetes/Dockerfile builds an image with the whole package, checked without Docker.

The build is emulated: the Dockerfile is parsed, the files its build stage COPYs are selected
from the repository (the build context) through Dockerfile.dockerignore as BuildKit would, and
put where the COPY lines put them in a scratch folder standing for the stage's filesystem. The
package is then built there with pip into a wheel, as the stage's own `pip` line does, and every
module of that wheel is imported from it in a fresh interpreter.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the build context: the repository root
DOCKERFILE = ROOT / "deploy" / "kubernetes" / "Dockerfile"
DOCKERIGNORE = DOCKERFILE.with_name("Dockerfile.dockerignore")  # BuildKit's per-Dockerfile name


@dataclass
class Stage:
    base: str
    name: str
    lines: list[tuple[str, str]]  # (INSTRUCTION, arguments)


def stages(text: str) -> list[Stage]:
    """The Dockerfile's stages, each with its instructions (continuations joined)."""
    joined = re.sub(r"\\\n", " ", text)
    out: list[Stage] = []
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else ""
            out.append(Stage(parts[0], name, []))
        else:
            assert out, f"{word} before FROM"
            out[-1].lines.append((word, rest.strip()))
    return out


def ignore_rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore lines as (exception?, regex over a context-relative posix path)."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = line.removeprefix("!").strip().strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                regex += ".*"
                i += 2
            elif pattern[i] == "*":
                regex += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                regex += "[^/]"
                i += 1
            else:
                regex += re.escape(pattern[i])
                i += 1
        rules.append((exception, re.compile(regex)))
    return rules


def excluded(rel: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """BuildKit's rule: the last pattern matching the path, or a folder above it, decides."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    verdict = False
    for exception, regex in rules:
        if any(regex.fullmatch(p) for p in prefixes):
            verdict = not exception
    return verdict


def context_files(rules: list[tuple[bool, re.Pattern[str]]]) -> list[str]:
    """Every file of the build context that the ignore rules let through."""
    prune = not any(exception for exception, _ in rules)
    found = []
    for top, dirs, files in os.walk(ROOT):
        here = Path(top).relative_to(ROOT)
        if prune:
            dirs[:] = [d for d in dirs if not excluded((here / d).as_posix(), rules)]
        found += [rel for f in files if not excluded(rel := (here / f).as_posix(), rules)]
    return sorted(found)


def emulate_copies(stage: Stage, fs: Path, files: list[str]) -> Path:
    """Apply the stage's WORKDIR and COPY lines to `fs`; return the last WORKDIR (in `fs`)."""
    workdir = Path("/")
    for word, args in stage.lines:
        if word == "WORKDIR":
            workdir = workdir / args
            (fs / workdir.relative_to("/")).mkdir(parents=True, exist_ok=True)
        if word != "COPY":
            continue
        words = shlex.split(args)
        assert not any(w.startswith("--from") for w in words), "the build stage copies sources"
        *sources, dest = [w for w in words if not w.startswith("--")]
        target = fs / (workdir / dest).relative_to("/")
        for source in sources:
            src = source.strip("/") if source not in (".", "./") else ""
            chosen = [f for f in files if not src or f == src or f.startswith(f"{src}/")]
            assert chosen, f"COPY {source}: nothing in the build context"
            for rel in chosen:
                if rel == src:  # a file: into the destination folder, or as the destination
                    into = target / Path(rel).name if dest.endswith("/") else target
                else:  # a folder's contents go into the destination
                    into = target / (Path(rel).relative_to(src) if src else Path(rel))
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, into)
    return fs / workdir.relative_to("/")


def pip_source(stage: Stage) -> str:
    """The folder the stage's pip command builds (`pip wheel DIR`) or installs (`pip install
    "DIR[extras]"`), as written."""
    for word, args in stage.lines:
        if word == "RUN" and re.search(r"\bpip (wheel|install)\b", args):
            words = shlex.split(args.split("&&")[0])
            operands = [w for w in words[2:] if not w.startswith("-")]
            # an option's value (--wheel-dir /wheels) is not the source: the last operand is
            return re.sub(r"\[.*\]$", "", operands[-1])
    raise AssertionError("the build stage has no pip wheel / pip install line")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from what the Dockerfile's build stage copies."""
    build = next(s for s in stages(DOCKERFILE.read_text()) if pip_source_or_none(s))
    fs = tmp_path_factory.mktemp("stage-fs")
    files = context_files(ignore_rules(DOCKERIGNORE.read_text()))
    workdir = emulate_copies(build, fs, files)
    source = pip_source(build)
    source_dir = fs / source.lstrip("/") if source.startswith("/") else workdir / source
    out = tmp_path_factory.mktemp("wheels")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), source_dir],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (built,) = out.glob("berth-*.whl")
    return built


def pip_source_or_none(stage: Stage) -> str | None:
    try:
        return pip_source(stage)
    except AssertionError:
        return None


class TestDockerfile:
    def test_the_context_leaves_out_what_the_wheel_does_not_need(self):
        """The ignore rules keep the wheel's inputs and drop tests, caches and virtualenvs."""
        files = context_files(ignore_rules(DOCKERIGNORE.read_text()))
        assert {"pyproject.toml", "README.md", "service/__init__.py"} <= set(files)
        assert "berth_runtime/__init__.py" in files
        assert any(f.startswith("migrations/versions/") for f in files)
        assert not [f for f in files if f.split("/")[0] in {".git", ".venv", "tests", "bench"}]
        assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]

    def test_the_wheel_holds_every_package_and_the_migrations(self, wheel):
        """The wheel has service, berth_runtime and every migration under service/_migrations."""
        names = set(zipfile.ZipFile(wheel).namelist())
        for package in ("service", "berth_runtime"):
            ours = {p.relative_to(ROOT).as_posix() for p in (ROOT / package).rglob("*.py")}
            assert ours <= names, sorted(ours - names)
        migrations = {
            "service/_migrations/" + p.relative_to(ROOT / "migrations").as_posix()
            for p in (ROOT / "migrations").rglob("*.py")
        }
        assert migrations <= names, sorted(migrations - names)
        assert "service/_migrations/env.py" in names

    def test_every_module_of_the_wheel_imports(self, wheel, tmp_path):
        """Unpacked alone, every module of the wheel imports (berth_runtime's included), and
        the migrations are found inside it at this berth's head."""
        site = tmp_path / "site"
        zipfile.ZipFile(wheel).extractall(site)
        script = (
            "import importlib, pkgutil, sys\n"
            "import service, berth_runtime\n"
            "from service.db import migrate\n"
            "for top in (service, berth_runtime):\n"
            "    assert top.__file__.startswith(sys.argv[1]), top.__file__\n"
            "    for m in pkgutil.walk_packages(top.__path__, top.__name__ + '.'):\n"
            "        if not m.name.endswith('__main__'):\n"
            "            importlib.import_module(m.name)\n"
            "            print(m.name)\n"
            "print('migrations', migrate.script_location(), migrate.head())\n"
        )
        # -S: no site hooks, so not this checkout's editable install either; the dependencies
        # come from the test's own site-packages, after the wheel.
        deps = [p for p in sys.path if p.endswith("site-packages")]
        r = subprocess.run(
            [sys.executable, "-S", "-c", script, str(site)],
            cwd=tmp_path,
            env={"PYTHONPATH": os.pathsep.join([str(site), *deps]), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert r.returncode == 0, r.stderr
        imported = r.stdout.splitlines()
        assert "berth_runtime.cli" in imported and "service.worker.main" in imported
        *_, last = imported
        from service.db import migrate

        assert last == f"migrations {site / 'service' / '_migrations'} {migrate.head()}"

    def test_the_image_installs_the_wheel_with_the_server_and_kubernetes_extras(self):
        """The image stage installs the built wheel (not a source folder) with both extras."""
        build, image = stages(DOCKERFILE.read_text())
        copies = [args for word, args in image.lines if word == "COPY"]
        assert copies == [f"--from={build.name} /wheels /wheels"], copies
        (install,) = [args for word, args in image.lines if word == "RUN" and "pip install" in args]
        assert '"$(ls /wheels/berth-*.whl)[server,kubernetes]"' in install
