"""README.md run as a newcomer would: every command block, in order, on a fresh home.

The README's ```bash blocks (and those of a docs/ page marked `<!-- readme-test: walkthrough
-->`) run one after the other in a copy of this checkout, with HOME a fresh folder (so
`~/.berth` is new) and an environment of nothing berth set: no BERTH_* variable, no database
URL. Shell variables and the working folder carry from one block to the next, as in one shell.

An HTML comment on the line before a block says how to run it (the reader never sees it):
- `expect="TEXT"`: TEXT must appear in what the block printed;
- `background ready="COMMAND"`: a long-running block (a worker) runs in the background, the
  next block waits until COMMAND succeeds, and it is stopped at the end;
- `file="PATH"`: a ```toml block is written to PATH (`~` is the fresh home);
- `skip=REASON`: only for what this machine cannot offer, from a closed list (SKIPPABLE).
Every ```toml block, run or not, must load as berth's configuration.
"""

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from service import config

REPO = Path(__file__).resolve().parents[2]
# What a block may be skipped for, and nothing else: each needs something this machine has not.
SKIPPABLE = {
    "kubernetes": "a Kubernetes cluster",
    "modal": "a Modal account",
    "s3": "an S3 service",
    "idp": "an identity provider",
    "another-host": "another host",
    "the-test-suite": "it is the command that runs this test",
}
ANNOTATION = re.compile(r"^<!--\s*readme-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
BLOCK_TIMEOUT = 600.0  # the install block downloads what pip has not cached
READY_TIMEOUT = 120.0


@dataclass
class Block:
    where: str  # file:line, for the failure message
    lang: str
    text: str
    options: dict[str, str] = field(default_factory=dict)


def options_of(annotation: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for token in shlex.split(annotation):
        key, _, value = token.partition("=")
        found[key] = value
    return found


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with the annotation right before it."""
    out: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if opened is None:
            i += 1
            continue
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        note = ANNOTATION.match(lines[start - 1]) if start > 0 else None
        out.append(
            Block(
                where=f"{path.relative_to(REPO)}:{start + 1}",
                lang=opened.group(1),
                text="\n".join(body) + "\n",
                options=options_of(note.group(1)) if note else {},
            )
        )
        i += 1
    return out


def walkthroughs() -> list[Path]:
    """README.md and the docs/ pages marked as walk-throughs."""
    marked = [
        page
        for page in sorted((REPO / "docs").glob("*.md"))
        if "<!-- readme-test: walkthrough -->" in page.read_text()
    ]
    return [REPO / "README.md", *marked]


def copy_checkout(dest: Path) -> None:
    """The files of this checkout a clone would have (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        source = REPO / raw.decode()
        if not source.is_file():  # deleted in the working tree, not yet committed
            continue
        target = dest / raw.decode()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


class Shell:
    """Blocks run one after another as if typed into one shell: variables and `cd` carry."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        self.checkout = root / "berth"
        self.checkout.mkdir()
        self.state = root / "state"
        self.state.mkdir()
        (self.state / "vars").write_text("")
        (self.state / "cwd").write_text(str(self.checkout))
        self.background: list[subprocess.Popen[bytes]] = []
        python_bin = Path(sys.base_prefix) / "bin"  # a plain Python 3.11 with venv, not ours
        self.env = {
            "HOME": str(self.home),
            "PATH": f"{python_bin}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            # pip's cache of the machine (not the fresh HOME's): the same packages, no download.
            "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        }

    def script(self, text: str, *, keep_state: bool) -> str:
        head = f'cd "$(cat {self.state}/cwd)"\nsource {self.state}/vars\nset -euo pipefail\n'
        tail = ""
        if keep_state:
            # Exported variables and the lowercase shell variables a reader sets (id=...).
            tail = (
                f"\n{{ declare -px; declare -p | grep -E '^declare -- [a-z_][a-z0-9_]*=' || true; }}"
                f" > {self.state}/vars.new && mv {self.state}/vars.new {self.state}/vars\n"
                f"pwd > {self.state}/cwd\n"
            )
        return head + text + tail

    def run(self, block: Block) -> str:
        proc = subprocess.run(
            ["bash", "-c", self.script(block.text, keep_state=True)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
            check=False,
        )
        printed = proc.stdout + proc.stderr
        assert proc.returncode == 0, self.failure(block, f"exited {proc.returncode}", printed)
        if expected := block.options.get("expect"):
            assert expected in printed, self.failure(block, f"no {expected!r} in it", printed)
        return printed

    def start(self, block: Block) -> None:
        log = (self.root / f"background-{len(self.background)}.log").open("wb")
        self.background.append(
            subprocess.Popen(
                ["bash", "-c", self.script(block.text, keep_state=False)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        ready = block.options.get("ready")
        if not ready:
            return
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.background[-1].poll() is not None:
                break
            probe = subprocess.run(
                ["bash", "-c", self.script(ready, keep_state=False)],
                env=self.env,
                capture_output=True,
                check=False,
            )
            if probe.returncode == 0:
                return
            time.sleep(0.5)
        raise AssertionError(self.failure(block, f"never ready ({ready})", self.logs()))

    def write(self, block: Block) -> None:
        target = Path(block.options["file"].replace("~", str(self.home), 1))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text)

    def logs(self) -> str:
        parts = [
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted(self.root.glob("background-*.log"))
        ]
        serve_log = self.home / ".berth" / "serve.log"
        if serve_log.exists():
            parts.append(f"--- serve.log\n{serve_log.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)

    def failure(self, block: Block, what: str, printed: str) -> str:
        return (
            f"{block.where}: the block {what}:\n{block.text}\n--- it printed:\n{printed[-4000:]}"
            f"\n{self.logs()}"
        )

    def stop(self) -> None:
        """Whatever is still running: the background blocks, the server and its workers."""
        for proc in self.background:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.background:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        berth = self.checkout / ".venv" / "bin" / "berth"
        if berth.exists() and (self.home / ".berth" / "serve.pid").exists():
            subprocess.run(
                [str(berth), "serve", "--stop"], env=self.env, capture_output=True, check=False
            )
        _end_processes_under(self.root)
        data = self.home / ".berth" / "postgres"
        if data.is_symlink():  # as root the embedded database lives in /var/lib/berth
            shutil.rmtree(data.resolve(), ignore_errors=True)


def _end_processes_under(root: Path) -> None:
    """Kill what a block left running whose home or folder is under `root` (workers the
    server provisioned outlive it by design)."""
    import psutil

    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if str(root) in " ".join(proc.cmdline()) or proc.environ().get(
                "BERTH_HOME", ""
            ).startswith(str(root)):
                proc.kill()


@pytest.fixture
def newcomer(visible_dir: Path) -> Iterator[Shell]:
    """A fresh home and a copy of this checkout, outside /tmp (jobs get a private /tmp)."""
    shell = Shell(visible_dir)
    copy_checkout(shell.checkout)
    try:
        yield shell
    finally:
        shell.stop()


class TestTomlBlocks:
    @pytest.mark.parametrize("page", walkthroughs(), ids=lambda p: p.name)
    def test_every_toml_block_loads_as_berths_configuration(self, page: Path, tmp_path: Path):
        """A configuration example that berth would refuse is a broken example."""
        for block in blocks(page):
            if block.lang != "toml":
                continue
            path = tmp_path / "berth.toml"
            path.write_text(block.text)
            try:
                config.load(path, environ={})
            except Exception as exc:  # any refusal is the finding
                pytest.fail(f"{block.where}: {exc}")


@pytest.mark.slow
class TestWalkthroughs:
    @pytest.mark.parametrize("page", walkthroughs(), ids=lambda p: p.name)
    def test_every_command_block_runs_as_written(
        self, page: Path, newcomer: Shell, capsys: pytest.CaptureFixture[str]
    ):
        """Each command block runs, in order, on a fresh home, and prints what it promises;
        a block is skipped only for something from the closed list, and the skips are said."""
        ran, skipped = 0, []
        for block in blocks(page):
            reason = block.options.get("skip")
            if reason is not None:
                assert reason in SKIPPABLE, f"{block.where}: skip={reason} is not in {SKIPPABLE}"
                skipped.append(f"{block.where} ({SKIPPABLE[reason]})")
                continue
            if block.lang == "toml" and "file" in block.options:
                newcomer.write(block)
            elif block.lang == "bash" and "background" in block.options:
                newcomer.start(block)
                ran += 1
            elif block.lang == "bash":
                newcomer.run(block)
                ran += 1
        with capsys.disabled():
            print(f"\n{page.name}: {ran} command blocks ran, {len(skipped)} skipped:")
            for where in skipped:
                print(f"  skipped {where}")
        assert ran > 0
