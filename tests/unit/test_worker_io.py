"""The worker's side of a job's I/O against what a hostile job leaves or sends: its output folder,
its relay socket, its repository. Real files, a real Unix socket, real git."""

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from service.cas.local import LocalStore
from service.worker import artifacts, relay, repos
from service.worker.jobusers import JobUser

ME = os.getuid()


class TestOutputs:
    async def test_only_regular_files_the_job_owns_are_taken(self, tmp_path):
        """A FIFO (which would block a reader), a symlink to a secret, a file of another uid and
        a folder symlink are all left; the walk returns at once with the job's own files."""
        out = tmp_path / "output"
        (out / "deep").mkdir(parents=True)
        (out / "deep" / "mine.txt").write_bytes(b"mine")
        (out / "top.bin").write_bytes(b"\x00\x01")
        os.mkfifo(out / "pipe")
        secret = tmp_path / "secret"
        secret.write_bytes(b"root only")
        (out / "link").symlink_to(secret)
        (out / "dirlink").symlink_to(tmp_path)
        (out / "theirs").write_bytes(b"other")
        os.chown(out / "theirs", 65534, 65534)
        store = LocalStore(tmp_path / "cas")
        found = await asyncio.wait_for(artifacts.upload_outputs(store, out, ME), timeout=30)
        assert sorted((a.path, a.size) for a in found) == [("deep/mine.txt", 4), ("top.bin", 2)]

    async def test_an_output_folder_replaced_by_a_symlink_yields_nothing(self, tmp_path):
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "f").write_bytes(b"x")
        (tmp_path / "output").symlink_to(tmp_path / "elsewhere")
        store = LocalStore(tmp_path / "cas")
        assert await artifacts.upload_outputs(store, tmp_path / "output", ME) == []


class Recorder:
    def __init__(self) -> None:
        self.emitted: list[dict[str, float]] = []

    def emit(self, values: dict[str, float]) -> bool:
        self.emitted.append(values)
        return True

    async def api(self, method: str, path: str, body: object) -> tuple[int, object]:
        return 200, {"method": method, "path": path}

    async def saved(self, sha: str, size: int) -> bool:
        return True


async def ask(path: Path, request: dict) -> dict:
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(json.dumps(request).encode() + b"\n")
        await writer.drain()
        return json.loads(await reader.readline())
    finally:
        writer.close()


@pytest.fixture
async def job_relay(tmp_path):
    rec = Recorder()
    r = relay.Relay(
        socket_path=tmp_path / ".berth" / "relay.sock",
        store=LocalStore(tmp_path / "cas"),
        api=rec.api,
        emit=rec.emit,
        saved=rec.saved,
    )
    await r.start(ME, os.getgid())
    yield r, rec
    await r.close()


class TestRelay:
    async def test_secret_and_values_are_checked(self, job_relay):
        r, rec = job_relay
        path = r.socket_path
        assert "another job's" in (await ask(path, {"op": "emit", "values": {"a": 1}}))["error"]
        ok = {"secret": r.secret, "op": "emit"}
        assert (await ask(path, {**ok, "values": {"loss": 0.5}})) == {"ok": True}
        for values, says in (
            ({"x": float("nan")}, "finite"),
            ({f"m{i}": 1 for i in range(300)}, "metrics refused"),
            ({"a\x01": 1}, "metrics refused"),
        ):
            assert says in (await ask(path, {**ok, "values": values}))["error"]
        assert rec.emitted == [{"loss": 0.5}]
        load = {"secret": r.secret, "op": "load", "ref": "../../etc/passwd"}
        assert "not a sha256 name" in (await ask(path, load))["error"]

    async def test_at_most_a_few_calls_at_once(self, job_relay):
        """Connections that never finish their request hold a buffer each: the ninth is
        refused, and closing the relay does not wait on the silent ones."""
        r, _ = job_relay
        held = [await asyncio.open_unix_connection(str(r.socket_path)) for _ in range(8)]
        await asyncio.sleep(0)  # let the server accept them
        reader, writer = await asyncio.open_unix_connection(str(r.socket_path))
        answer = json.loads(await asyncio.wait_for(reader.readline(), timeout=10))
        writer.close()
        assert "at most 8" in answer["error"]
        await asyncio.wait_for(r.close(), timeout=relay.CLOSE_TIMEOUT * 3)
        for held_reader, held_writer in held:
            assert await asyncio.wait_for(held_reader.read(), timeout=10) == b""
            held_writer.close()

    async def test_refuses_once_the_lease_ended(self, job_relay):
        r, rec = job_relay
        r.live = False  # what Run.stop does first
        answer = await ask(r.socket_path, {"secret": r.secret, "op": "emit", "values": {"a": 1}})
        assert "lease has ended" in answer["error"]
        await r.close()
        assert not r.socket_path.exists() or not await _connects(r.socket_path)
        assert rec.emitted == []


async def _connects(path: Path) -> bool:
    try:
        _, writer = await asyncio.open_unix_connection(str(path))
    except OSError:
        return False
    writer.close()
    return True


class TestRepos:
    @pytest.mark.parametrize(
        ("spec", "says"),
        [
            ("--upload-pack=touch /tmp/x", "not a repository URL"),
            ("https://example.com/x.git@--orphan=x", "not a revision"),
            ("/srv/secret-repo", "local repositories are refused"),
            ("file:///srv/secret-repo", "local repositories are refused"),
        ],
    )
    async def test_refused_before_git_runs(self, tmp_path, spec, says):
        user = JobUser(ME, os.getgid(), "me", isolated=False)
        with pytest.raises(repos.RepoError, match=says):
            await repos.clone(tmp_path / "cache", spec, tmp_path / "repo", user)
        assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())

    async def test_a_huge_change_is_collected_without_holding_it(self, tmp_path):
        """The job's uncommitted change is written by git straight to repo.patch; the worker
        only asks whether there is one."""
        origin = tmp_path / "origin"
        git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
        subprocess.run(["git", "init", "-q", "-b", "main", str(origin)], check=True)
        (origin / "f").write_text("one\n")
        subprocess.run([*git, "-C", str(origin), "add", "f"], check=True)
        subprocess.run([*git, "-C", str(origin), "commit", "-qm", "first"], check=True)
        user = JobUser(ME, os.getgid(), "me", isolated=False)
        repo = tmp_path / "work" / "repo"
        base = await repos.clone(tmp_path / "cache", str(origin), repo, user, allow_local=True)
        (repo / "big.txt").write_text("line\n" * 200_000)
        out = tmp_path / "work" / "output"
        out.mkdir()
        await repos.collect(repo, base, out, user, tmp_path / "work")
        assert not (out / "repo.bundle").exists()  # no commit since base
        assert (out / "repo.patch").stat().st_size > 1_000_000

    async def test_the_jobs_git_config_and_hooks_never_run_at_collection(self, tmp_path):
        """A job's repository config (fsmonitor, hooks, filters, diff drivers, includes, a
        ~/.gitconfig in its folder) names a script that leaves a mark: collecting its outputs
        runs none of it, and the bundle and the patch are still its commit and its edits."""
        origin = tmp_path / "origin"
        git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
        subprocess.run(["git", "init", "-q", "-b", "main", str(origin)], check=True)
        (origin / "f").write_text("one\n")
        (origin / "gone").write_text("bye\n")
        subprocess.run([*git, "-C", str(origin), "add", "f", "gone"], check=True)
        subprocess.run([*git, "-C", str(origin), "commit", "-qm", "first"], check=True)
        user = JobUser(ME, os.getgid(), "me", isolated=False)
        work = tmp_path / "work"
        repo = work / "repo"
        base = await repos.clone(tmp_path / "cache", str(origin), repo, user, allow_local=True)
        # What the job does: a commit on a branch of its own, then edits left uncommitted.
        subprocess.run([*git, "-C", str(repo), "checkout", "-qb", "topic"], check=True)
        (repo / "f").write_text("one\ntwo\n")
        subprocess.run([*git, "-C", str(repo), "commit", "-qam", "from the job"], check=True)
        (repo / "f").write_text("one\ntwo\nthree\n")
        (repo / "new.txt").write_text("new\n")
        (repo / "gone").unlink()
        # ...and what it leaves for whoever runs git there next.
        marks = tmp_path / "marks"
        evil = tmp_path / "evil.sh"
        evil.write_text(f'#!/bin/sh\necho "$0 $*" >> {marks}\ncat\n')
        evil.chmod(0o755)
        hooks = repo / ".git" / "hooks"
        for hook in ("post-index-change", "pre-commit", "post-checkout", "reference-transaction"):
            (hooks / hook).write_text(evil.read_text())
            (hooks / hook).chmod(0o755)
        config = "\n".join(
            [
                "[core]",
                f"\tfsmonitor = {evil}",
                f"\thooksPath = {hooks}",
                f"\tsshCommand = {evil}",
                f"\tpager = {evil}",
                "\tcommitGraph = true",
                '[filter "evil"]',
                f"\tclean = {evil} clean",
                f"\tsmudge = {evil} smudge",
                f"\tprocess = {evil} process",
                "\trequired = true",
                '[diff "evil"]',
                f"\tcommand = {evil} driver",
                f"\ttextconv = {evil} textconv",
                "[diff]",
                f"\texternal = {evil} external",
                "[include]",
                f"\tpath = {tmp_path / 'more.config'}",
                "",
            ]
        )
        with (repo / ".git" / "config").open("a") as f:
            f.write(config)
        (tmp_path / "more.config").write_text(f"[core]\n\tfsmonitor = {evil}\n")
        (work / ".gitconfig").write_text(config)  # $HOME of the job, and of git as it ran
        (repo / ".gitattributes").write_text("* filter=evil diff=evil\n")
        (repo / ".git" / "info" / "attributes").write_text("* filter=evil diff=evil\n")
        out = work / "output"
        out.mkdir()

        await repos.collect(repo, base, out, user, work)

        assert not marks.exists(), marks.read_text()
        assert sorted(p.name for p in work.iterdir()) == [".gitconfig", "output", "repo"]
        subprocess.run(
            ["git", "-C", str(origin), "fetch", "-q", str(out / "repo.bundle"), "topic:topic"],
            check=True,
        )
        log = subprocess.run(
            ["git", "-C", str(origin), "log", "--format=%s", "topic"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        assert log == ["from the job", "first"]
        # The patch takes a checkout of the job's commit to exactly the files it left.
        check = tmp_path / "check"
        subprocess.run(["git", "clone", "-q", "-b", "topic", str(origin), str(check)], check=True)
        subprocess.run(["git", "-C", str(check), "apply", str(out / "repo.patch")], check=True)
        assert (check / "f").read_text() == "one\ntwo\nthree\n"
        assert (check / "new.txt").read_text() == "new\n"
        assert not (check / "gone").exists()
        assert (check / ".gitattributes").read_text() == "* filter=evil diff=evil\n"
        assert not marks.exists()
