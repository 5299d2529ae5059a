"""`--repo URL[@REV]`: a clone for each job, made from one cached mirror per URL on the worker.

The cache is the worker's alone (0700, under its state directory); each job gets its own clone
copied out of it (`--no-hardlinks`: no object or ref is shared with the cache or another job),
checked out at REV, and handed to the job's uid. When the job ends, what it did comes back as two
of its outputs: the commits it made since REV as `repo.bundle` (`git fetch` takes it), and its
uncommitted changes as `repo.patch`.

Security: the URL is the tenant's choice and git runs as root for the cache, so only network
transports are allowed (`ext::` runs commands; `file://` would read any repository on this
machine), unless the worker was started with `--allow-local-repos`.

When the job ends its repository is the job's work, and its `.git` too: a config it wrote can
name commands (`core.fsmonitor`, `core.hooksPath`, filters, diff drivers, `include.path`...),
and git runs them in whichever repository it works in. So the outputs are never made in the
job's repository: its refs are read as data, and git works in a fresh repository the worker
made (see `collect`), which borrows the job's object database (objects are data, never run)
and reads the job's files as the work tree, as the job's uid, with no configuration but ours.
"""

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from service.worker.artifacts import hand_over
from service.worker.jobusers import JobUser, become

NETWORK = "https:http:ssh:git"
TIMEOUT = 600.0
KEEP = 64 << 10  # bytes of a git command's output kept (a commit id, an error's tail)


class RepoError(Exception):
    """The repository could not be cloned or checked out; the message says why."""


def parse(spec: str) -> tuple[str, str]:
    """`URL[@REV]` -> (url, rev); the rev is after the last `@` that follows the last `/`."""
    url, sep, rev = spec.rpartition("@")
    if not sep or "/" in rev or ":" in rev or not url:
        return spec, ""
    return url, rev


def _is_local(url: str) -> bool:
    """A path or file:// URL (an scp-like `host:path` has its colon before the first slash)."""
    if url.startswith("file:"):
        return True
    if "://" in url:
        return False
    return ":" not in url.split("/", 1)[0]


def _env(home: Path, allow_local: bool) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": NETWORK + (":file" if allow_local else ""),
        # ssh finds root's keys and agent by uid, not $HOME: a tenant's URL must not use them.
        "GIT_SSH_COMMAND": (
            "ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -o IdentityFile=none "
            "-o IdentityAgent=none"
        ),
    }


async def _run(
    *args: str, cwd: Path, env: dict[str, str], user: JobUser | None
) -> tuple[int, str, str]:
    """Run `git ARGS`: (exit code, the head of stdout, the tail of stderr), memory bounded."""
    proc = await asyncio.create_subprocess_exec(
        "git",
        *args,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        # A worker that is not root runs git as itself: it could not drop to another user.
        preexec_fn=become(user.uid, user.gid) if user and user.uid != os.geteuid() else None,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        out, err, _ = await asyncio.wait_for(
            asyncio.gather(_head(proc.stdout), _tail(proc.stderr), proc.wait()), timeout=TIMEOUT
        )
    except TimeoutError:
        proc.kill()
        raise RepoError(f"git {args[0]} took longer than {TIMEOUT:g}s") from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace").strip(), err.decode(errors="replace")


async def _git(*args: str, cwd: Path, env: dict[str, str], user: JobUser | None = None) -> str:
    code, out, err = await _run(*args, cwd=cwd, env=env, user=user)
    if code:
        raise RepoError(f"git {args[0]}: {err.strip()[-500:]}")
    return out


async def _head(stream: asyncio.StreamReader) -> bytes:
    """The first KEEP bytes; the rest is read and dropped (a job's repo may print anything)."""
    kept = b""
    while chunk := await stream.read(1 << 16):
        if len(kept) < KEEP:
            kept += chunk[: KEEP - len(kept)]
    return kept


async def _tail(stream: asyncio.StreamReader) -> bytes:
    kept = b""
    while chunk := await stream.read(1 << 16):
        kept = (kept + chunk)[-KEEP:]
    return kept


async def clone(
    cache_root: Path, spec: str, dest: Path, user: JobUser, *, allow_local: bool = False
) -> str:
    """Clone `spec` into `dest` for the job (its user owns it); returns the commit checked out."""
    url, rev = parse(spec)
    if url.startswith("-"):
        raise RepoError(f"--repo {url!r} is not a repository URL")
    if rev.startswith("-"):
        raise RepoError(f"--repo revision {rev!r} is not a revision")
    if not allow_local and _is_local(url):
        raise RepoError(
            f"--repo {url}: local repositories are refused on this worker (--allow-local-repos)"
        )
    await asyncio.to_thread(cache_root.mkdir, mode=0o700, parents=True, exist_ok=True)
    env = _env(cache_root, allow_local)
    mirror = cache_root / (hashlib.sha256(url.encode()).hexdigest()[:24] + ".git")
    if mirror.exists():
        await _git("remote", "update", "--prune", cwd=mirror, env=env)
    else:
        await _git("clone", "--mirror", "--quiet", "--", url, str(mirror), cwd=cache_root, env=env)
    await _git(
        "clone", "--quiet", "--no-hardlinks", "--", str(mirror), str(dest), cwd=cache_root, env=env
    )
    await _git("remote", "set-url", "origin", url, cwd=dest, env=env)
    if rev:
        await _git("checkout", "--quiet", "--detach", rev, cwd=dest, env=env)
    base = await _git("rev-parse", "HEAD", cwd=dest, env=env)
    await asyncio.to_thread(hand_over, dest, user.uid, user.gid)
    return base


# What git may read while it makes a job's outputs: the fresh repository's own (empty) config
# and these (command-line scope, given in the environment), nothing of the machine's, the
# worker's or the job's. Most are off in that config already; they are named again so that no
# default of a newer git turns one on.
_COLLECT_CONFIG = {
    "core.fsmonitor": "false",
    "core.hooksPath": "/dev/null",  # no hook: `git add` runs post-index-change
    "core.untrackedCache": "false",
    "core.commitGraph": "false",  # the job wrote the commit graph of its objects: not trusted
    "core.bare": "false",
    "submodule.recurse": "false",
}
_NO_DRIVERS = ("--no-ext-diff", "--no-textconv")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_REF_FILE = 4096
MAX_PACKED_REFS = 64 << 20
MAX_BRANCHES = 10_000
_BAD_REF = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//|/\.|\.lock(?:/|\Z)|\.\Z|/\Z")


def _collect_env(gitdir: Path | None = None, worktree: Path | None = None) -> dict[str, str]:
    """The environment of git over the job's files: no system, global or XDG config."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",  # no ~/.gitconfig, ~/.config/git/{config,attributes,ignore}
        "XDG_CONFIG_HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": "",  # no transport at all
        "GIT_NO_LAZY_FETCH": "1",  # a missing object is an error, never a fetch
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_CONFIG_COUNT": str(len(_COLLECT_CONFIG)),
    }
    for i, (key, value) in enumerate(_COLLECT_CONFIG.items()):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    if gitdir is not None and worktree is not None:
        env["GIT_DIR"] = str(gitdir)
        env["GIT_WORK_TREE"] = str(worktree)
    return env


async def collect(
    repo: Path,
    base: str,
    outdir: Path,
    user: JobUser,
    workdir: Path,
    *,
    leave_out: Sequence[str] = (),
) -> None:
    """The job's new commits as outdir/repo.bundle, its changes as outdir/repo.patch.

    `leave_out`: names at the clone's top that berth put there (the job's inputs and code, which
    arrive beside its files): never part of the patch.

    Security: nothing the job wrote in its `.git` runs. Its HEAD and branches are read as data
    (by `_refs`, relative opens without following a link), and git runs, as the job's uid, in a
    repository made here: our config only (see _collect_env), no hooks,
    the job's object database as an alternate, the job's folder as the work tree. A filter,
    diff driver or textconv a `.gitattributes` names is defined nowhere git looks, so none
    runs; the job's index (which may carry an fsmonitor token) is not read: ours is made from
    HEAD.
    """
    head, branches = await asyncio.to_thread(_refs, repo, len(base))
    scratch = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=".berth-collect-", dir=workdir))
    try:
        await asyncio.to_thread(os.chown, scratch, user.uid, user.gid)
        init = ["init", "--quiet", "--bare", "--template="]  # no hooks, nothing copied in
        if len(base) == 64:
            init.append("--object-format=sha256")
        await _git(*init, str(scratch), cwd=scratch, env=_collect_env(), user=user)
        await asyncio.to_thread(_plant, scratch, repo, head, branches)
        await _outputs(base, outdir, scratch, _collect_env(scratch, repo), user, leave_out)
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, ignore_errors=True)


async def _outputs(  # noqa: PLR0917  (the parts of one collection)
    base: str,
    outdir: Path,
    scratch: Path,
    env: dict[str, str],
    user: JobUser,
    leave_out: Sequence[str],
) -> None:
    # No commit since `base`: git refuses an empty bundle, and there is nothing to keep.
    with contextlib.suppress(RepoError):
        await _git(
            "bundle",
            "create",
            "--quiet",
            str(outdir / "repo.bundle"),
            "HEAD",
            "--branches",
            "--not",
            base,
            cwd=scratch,
            env=env,
            user=user,
        )
    await _git("read-tree", "HEAD", cwd=scratch, env=env, user=user)
    # Literal, top-level pathspecs: a name is never a glob or magic of its own.
    skip = [f":(top,literal,exclude){name}" for name in leave_out]
    await _git("add", "--all", "--", ":(top)", *skip, cwd=scratch, env=env, user=user)
    changed, _, err = await _run(
        "diff",
        *_NO_DRIVERS,
        "--cached",
        "--quiet",
        "HEAD",
        cwd=scratch,
        env=env,
        user=user,
    )
    if changed not in (0, 1):
        raise RepoError(f"git diff: {err.strip()[-500:]}")
    if changed:
        # Written by the job's user (its folder): the upload walk takes only what it owns.
        await _git(
            "diff",
            *_NO_DRIVERS,
            "--cached",
            "--binary",
            f"--output={outdir / 'repo.patch'}",
            "HEAD",
            cwd=scratch,
            env=env,
            user=user,
        )


def _plant(scratch: Path, repo: Path, head: str, branches: dict[str, str]) -> None:
    """Give our repository the job's objects (as an alternate), branches and HEAD: data only."""
    lines = "".join(f"{branches[name]} {name}\n" for name in sorted(branches))
    _write_new(scratch / "packed-refs", lines)
    _write_new(scratch / "objects" / "info" / "alternates", f"{repo / '.git' / 'objects'}\n")
    (scratch / "HEAD").unlink()
    _write_new(scratch / "HEAD", f"ref: {head}\n" if head.startswith("refs/") else f"{head}\n")


def _write_new(path: Path, content: str) -> None:
    # Readable by the job's uid, which runs git here; O_EXCL: never through a planted link.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(content)


def _refs(repo: Path, id_length: int) -> tuple[str, dict[str, str]]:
    """HEAD (a commit id, or the branch it names) and every branch of the job's clone.

    Read as root from folders the job wrote: every open is relative to its parent's fd with
    O_NOFOLLOW, only regular files are read, and sizes and counts are bounded. Loose refs win
    over packed ones, as in git; a name git would refuse is skipped.
    """
    ident = re.compile(rf"\A[0-9a-f]{{{id_length}}}\Z")
    try:
        repo_fd = os.open(repo, _DIR)
    except OSError as exc:
        raise RepoError(f"the job's repository is gone ({exc.strerror})") from None
    try:
        try:
            git_fd = os.open(".git", _DIR, dir_fd=repo_fd)
        except OSError:
            raise RepoError("the job's repository has no .git folder any more") from None
        try:
            branches = _packed(_read(git_fd, "packed-refs", MAX_PACKED_REFS) or b"", ident)
            with contextlib.suppress(OSError):
                refs_fd = os.open("refs", _DIR, dir_fd=git_fd)
                try:
                    heads_fd = os.open("heads", _DIR, dir_fd=refs_fd)
                finally:
                    os.close(refs_fd)
                try:
                    _loose(heads_fd, "refs/heads/", branches, ident, depth=0)
                finally:
                    os.close(heads_fd)
            head = (_read(git_fd, "HEAD", MAX_REF_FILE) or b"").decode(errors="replace").strip()
        finally:
            os.close(git_fd)
    finally:
        os.close(repo_fd)
    if head.startswith("ref: "):
        head = head.removeprefix("ref: ").strip()
        if head not in branches:
            raise RepoError(f"the job's repository HEAD names {head[:200]!r}, not a branch")
    elif not ident.match(head):
        raise RepoError("the job's repository HEAD is neither a commit id nor a branch")
    return head, branches


def _packed(data: bytes, ident: re.Pattern[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in data.decode(errors="replace").splitlines():
        value, _, name = line.partition(" ")
        if ident.match(value) and name.startswith("refs/heads/") and _ref_name_ok(name):
            found[name] = value
            if len(found) > MAX_BRANCHES:
                raise RepoError(f"the job's repository has more than {MAX_BRANCHES} branches")
    return found


def _loose(
    dir_fd: int, prefix: str, found: dict[str, str], ident: re.Pattern[str], depth: int
) -> None:
    if depth > 32:
        return
    for name in sorted(os.listdir(dir_fd)):
        ref = prefix + name
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, _DIR, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                _loose(sub, ref + "/", found, ident, depth + 1)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode) and _ref_name_ok(ref):
            value = (_read(dir_fd, name, MAX_REF_FILE) or b"").decode(errors="replace").strip()
            if ident.match(value):  # a symbolic ref among the branches is not followed
                found[ref] = value
                if len(found) > MAX_BRANCHES:
                    raise RepoError(f"the job's repository has more than {MAX_BRANCHES} branches")


def _read(dir_fd: int, name: str, limit: int) -> bytes | None:
    """A regular file's bytes; None when it is absent, a link or not a regular file."""
    try:
        fd = os.open(name, _FILE, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = bytearray()
        while chunk := os.read(fd, 1 << 16):
            data += chunk
            if len(data) > limit:
                raise RepoError(f"the job's repository has a {name} larger than {limit} bytes")
        return bytes(data)
    finally:
        os.close(fd)


def _ref_name_ok(name: str) -> bool:
    """A branch name git accepts (check-ref-format's rules, more or less strictly)."""
    return not _BAD_REF.search(name) and not any(part.startswith(".") for part in name.split("/"))
