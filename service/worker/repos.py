"""`--repo URL[@REV]`: a clone for each job, made from one cached mirror per URL on the worker.

The cache is the worker's alone (0700, under its state directory); each job gets its own clone
copied out of it (`--no-hardlinks`: no object or ref is shared with the cache or another job),
checked out at REV, and handed to the job's uid. When the job ends, what it did comes back as two
of its outputs: the commits it made since REV as `repo.bundle` (`git fetch` takes it), and its
uncommitted changes as `repo.patch`.

Security: the URL is the tenant's choice and git runs as root for the cache, so only network
transports are allowed (`ext::` runs commands; `file://` would read any repository on this
machine), unless the worker was started with `--allow-local-repos`. Everything that runs inside
the job's clone afterwards (bundle, diff) runs as the job's uid: a repository config the job
wrote (hooks, fsmonitor, diff drivers) never runs as root.
"""

import asyncio
import contextlib
import hashlib
import os
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
        preexec_fn=become(user.uid, user.gid) if user is not None else None,
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


async def collect(repo: Path, base: str, outdir: Path, user: JobUser, workdir: Path) -> None:
    """As the job's user: its new commits as outdir/repo.bundle, its changes as repo.patch."""
    env = _env(workdir, allow_local=False) | {"GIT_DIR": str(repo / ".git")}
    env["GIT_WORK_TREE"] = str(repo)
    # No commit since `base`: git refuses an empty bundle, and there is nothing to keep.
    with contextlib.suppress(RepoError):
        await _git(
            "bundle",
            "create",
            str(outdir / "repo.bundle"),
            "HEAD",
            "--branches",
            "--not",
            base,
            cwd=repo,
            env=env,
            user=user,
        )
    await _git("add", "--all", cwd=repo, env=env, user=user)
    changed, _, err = await _run(
        "diff", "--cached", "--quiet", "HEAD", cwd=repo, env=env, user=user
    )
    if changed not in (0, 1):
        raise RepoError(f"git diff: {err.strip()[-500:]}")
    if changed:
        # Written by the job's user (its folder): the upload walk takes only what it owns.
        await _git(
            "diff",
            "--cached",
            "--binary",
            f"--output={outdir / 'repo.patch'}",
            "HEAD",
            cwd=repo,
            env=env,
            user=user,
        )
