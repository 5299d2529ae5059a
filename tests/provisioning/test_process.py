"""The process provider with real processes: a stand-in worker program started in its place.

Every test uses an installation id and worker names of its own, so a process left behind by an
earlier, interrupted run can never be listed or stopped by this one.
"""

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from service.provisioning.providers.base import InstanceState, ProviderError, WorkerSpec
from service.provisioning.providers.process import (
    MARKER,
    PROOF_ENV,
    ProcessProvider,
    marker,
    proof,
    proof_key,
)
from tests.provisioning.conditions import eventually

STANDIN = Path(__file__).with_name("standin_worker.py")
COMMAND = (sys.executable, str(STANDIN))
ROOT = Path(__file__).resolve().parents[2]
KEY = b"the installation's secret key...."  # what every server of the installation holds


@pytest.fixture
def installation() -> str:
    return f"inst-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def ready(tmp_path: Path) -> Path:
    path = tmp_path / "ready"
    path.mkdir()
    return path


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
async def provider(home: Path, installation: str):
    made = ProcessProvider(home, secret_key=KEY, command=COMMAND, grace=5.0)
    yield made
    # Whatever a test left running, including workers another provider object started.
    for instance in await made.list(installation=installation):
        await made.stop(instance.name)


def spec(installation: str, ready: Path, *, pool: str = "cpu", name: str = "", **env: str):
    return WorkerSpec(
        name=name or f"w-{uuid.uuid4().hex[:8]}",
        pool=pool,
        installation=installation,
        argv=("worker", "--server", "http://127.0.0.1:1", "--pool", pool),
        env={"STANDIN_READY": str(ready), **env},
    )


async def started(provider: ProcessProvider, worker: WorkerSpec, ready: Path) -> int:
    """Start `worker` and wait until its SIGTERM handler is in place; return its pid."""
    instance = await provider.start(worker)
    pid = int(instance.provider_id)
    await eventually((ready / str(pid)).exists, what=f"{worker.name} to be ready")
    return pid


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode().partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


class TestStartAndList:
    async def test_two_workers_listed_by_installation_and_pool(self, provider, installation, ready):
        """Two started workers are listed as running, filtered by installation and by pool."""
        a = spec(installation, ready, pool="cpu")
        b = spec(installation, ready, pool="gpu")
        pid_a = await started(provider, a, ready)
        pid_b = await started(provider, b, ready)

        listed = {i.name: i for i in await provider.list(installation=installation)}
        assert set(listed) == {a.name, b.name}
        assert listed[a.name].provider_id == str(pid_a)
        assert listed[b.name].provider_id == str(pid_b)
        assert {i.state for i in listed.values()} == {InstanceState.RUNNING}
        assert listed[a.name].pool == "cpu"
        gpu = await provider.list(installation=installation, pool="gpu")
        assert [i.name for i in gpu] == [b.name]
        assert await provider.list(installation=f"{installation}-other") == []

    async def test_a_new_provider_adopts_running_workers(
        self, provider, installation, ready, tmp_path
    ):
        """A new provider object (a new leader) finds the workers from the process table alone."""
        a = spec(installation, ready, pool="cpu")
        b = spec(installation, ready, pool="gpu")
        pids = {
            a.name: await started(provider, a, ready),
            b.name: await started(provider, b, ready),
        }

        leader = ProcessProvider(tmp_path / "another-home", secret_key=KEY, command=COMMAND)
        listed = {i.name: i for i in await leader.list(installation=installation)}
        assert {name: int(i.provider_id) for name, i in listed.items()} == pids
        assert {i.state for i in listed.values()} == {InstanceState.RUNNING}
        assert [i.name for i in await leader.list(installation=installation, pool="cpu")] == [
            a.name
        ]

        await leader.stop(a.name)
        assert not alive(pids[a.name])
        # The first provider still knows it started `a`, and now sees it ended.
        states = {i.name: i.state for i in await provider.list(installation=installation)}
        assert states == {a.name: InstanceState.STOPPED, b.name: InstanceState.RUNNING}

    async def test_starting_a_running_name_returns_it(self, provider, installation, ready):
        """A second start of a running name returns that worker and starts no other."""
        worker = spec(installation, ready)
        pid = await started(provider, worker, ready)
        again = await provider.start(worker)
        assert again.provider_id == str(pid)
        assert len(await provider.list(installation=installation)) == 1

    async def test_a_name_of_another_installation_is_refused(self, provider, installation, ready):
        """Starting a name that another installation's worker holds here is refused, not shared."""
        worker = spec(installation, ready)
        await started(provider, worker, ready)
        clash = WorkerSpec(name=worker.name, pool="cpu", installation=f"{installation}-b", argv=())
        with pytest.raises(ProviderError, match="another installation"):
            await provider.start(clash)

    async def test_argv_carries_the_labels_and_output_goes_to_the_log(
        self, provider, installation, ready, home
    ):
        """The worker runs the command with the spec's argv and the marker; its output is logged."""
        worker = spec(installation, ready, pool="p/1")
        pid = await started(provider, worker, ready)
        cmdline = psutil.Process(pid).cmdline()
        assert cmdline[: len(COMMAND)] == list(COMMAND)
        assert cmdline[len(COMMAND) :] == [
            *worker.argv,
            MARKER,
            marker(installation, "p/1", worker.name),
        ]
        assert "%2F" in marker(installation, "p/1", worker.name)  # a / in a label is escaped
        listed = await provider.list(installation=installation, pool="p/1")
        assert [i.name for i in listed] == [worker.name]
        log = provider.log_path(worker.name)
        assert log.parent == home / "provisioned"
        await eventually(lambda: "argv" in log.read_text(), what="the worker's output in its log")

    async def test_a_crash_is_failed_with_its_exit_code(
        self, provider, installation, ready, tmp_path
    ):
        """A worker that exits 3 is FAILED with its code here, and absent for another provider."""
        worker = spec(installation, ready, STANDIN_EXIT="3")
        await provider.start(worker)

        async def failed():
            listed = await provider.list(installation=installation)
            return listed and listed[0].state is InstanceState.FAILED and listed[0]

        instance = await eventually(failed, what="the crash to be seen")
        assert instance.detail == "exited with code 3"
        leader = ProcessProvider(tmp_path / "other", secret_key=KEY, command=COMMAND)
        assert await leader.list(installation=installation) == []
        await provider.stop(worker.name)  # forgets it
        assert await provider.list(installation=installation) == []

    async def test_a_clean_exit_is_stopped(self, provider, installation, ready):
        """A worker that exits 0 (an orphan giving up) is STOPPED."""
        worker = spec(installation, ready, STANDIN_EXIT="0")
        await provider.start(worker)

        async def ended():
            listed = await provider.list(installation=installation)
            return listed and listed[0].state is not InstanceState.RUNNING and listed[0]

        instance = await eventually(ended, what="the exit to be seen")
        assert instance.state is InstanceState.STOPPED

    async def test_a_killed_worker_leaves_the_list(self, provider, installation, ready, tmp_path):
        """A worker killed with SIGKILL is no longer running: FAILED here, absent elsewhere."""
        worker = spec(installation, ready)
        pid = await started(provider, worker, ready)
        os.kill(pid, signal.SIGKILL)

        async def not_running():
            listed = await provider.list(installation=installation)
            return all(i.state is not InstanceState.RUNNING for i in listed) and listed

        (instance,) = await eventually(not_running, what="the killed worker to leave RUNNING")
        assert instance.state is InstanceState.FAILED
        assert instance.detail == "killed by SIGKILL"
        leader = ProcessProvider(tmp_path / "other", secret_key=KEY, command=COMMAND)
        assert await leader.list(installation=installation) == []


class TestStop:
    async def test_stop_terms_the_worker_and_is_idempotent(self, provider, installation, ready):
        """stop sends SIGTERM, the worker exits on it, and a second stop is not an error."""
        worker = spec(installation, ready)
        pid = await started(provider, worker, ready)
        await provider.stop(worker.name)
        assert not alive(pid)
        assert "TERM received" in provider.log_path(worker.name).read_text()
        assert await provider.list(installation=installation) == []
        await provider.stop(worker.name)
        await provider.stop("never-started")

    async def test_a_worker_that_ignores_term_is_killed_after_the_grace(
        self, home, installation, ready
    ):
        """A worker that ignores SIGTERM gets SIGKILL once the grace has passed, not before."""
        provider = ProcessProvider(home, secret_key=KEY, command=COMMAND, grace=0.5)
        worker = spec(installation, ready, STANDIN_IGNORE_TERM="1")
        pid = await started(provider, worker, ready)
        began = time.monotonic()
        await provider.stop(worker.name)
        assert time.monotonic() - began >= 0.5
        assert not alive(pid)
        assert "TERM ignored" in provider.log_path(worker.name).read_text()
        assert await provider.list(installation=installation) == []


class TestEnvironment:
    async def test_the_secret_is_in_the_environment_not_the_command_line(
        self, provider, installation, ready
    ):
        """The credential reaches the child's environment and never its argv or log."""
        token = f"brt_join_{uuid.uuid4().hex}"
        worker = WorkerSpec(
            name=f"w-{uuid.uuid4().hex[:8]}",
            pool="cpu",
            installation=installation,
            argv=("worker", "--pool", "cpu"),
            env={"STANDIN_READY": str(ready)},
            secret_env={"BERTH_JOIN_TOKEN": token},
        )
        pid = await started(provider, worker, ready)
        assert environ_of(pid)["BERTH_JOIN_TOKEN"] == token
        assert token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert token not in provider.log_path(worker.name).read_text()

    async def test_berth_variables_of_the_server_do_not_leak(
        self, home, installation, ready, monkeypatch
    ):
        """The server's BERTH_* variables stay out; the pool's and spec's env come in, in order."""
        monkeypatch.setenv("BERTH_DATABASE_URL", "postgresql://server:secret@db/berth")
        monkeypatch.setenv("BERTH_CONFIG_JSON", '{"database": {"url": "x"}}')
        monkeypatch.setenv("BERTH_HOME", "/srv/berth")
        monkeypatch.setenv("KEPT_FROM_SERVER", "yes")
        provider = ProcessProvider(
            home, secret_key=KEY, command=COMMAND, env={"POOL_ENV": "pool", "BOTH": "pool"}
        )
        worker = WorkerSpec(
            name=f"w-{uuid.uuid4().hex[:8]}",
            pool="cpu",
            installation=installation,
            argv=(),
            env={"STANDIN_READY": str(ready), "BOTH": "spec", "BERTH_SERVER": "http://s"},
            secret_env={"BERTH_JOIN_TOKEN": "brt_x"},
        )
        pid = await started(provider, worker, ready)
        try:
            env = environ_of(pid)
            assert {k for k in env if k.startswith("BERTH_")} == {
                "BERTH_SERVER",
                "BERTH_JOIN_TOKEN",
                PROOF_ENV,  # the provider's own, last: see TestForgery
            }
            assert env["KEPT_FROM_SERVER"] == "yes"
            assert env["POOL_ENV"] == "pool"
            assert env["BOTH"] == "spec"
        finally:
            await provider.stop(worker.name)


THROWAWAY = """
import asyncio, sys
from pathlib import Path
from service.provisioning.providers.base import WorkerSpec
from service.provisioning.providers.process import ProcessProvider

async def main():
    home, standin, installation, name, ready, key = sys.argv[1:]
    provider = ProcessProvider(
        Path(home), secret_key=key.encode(), command=(sys.executable, standin)
    )
    spec = WorkerSpec(name=name, pool="cpu", installation=installation, argv=("worker",),
                      env={"STANDIN_READY": ready})
    instance = await provider.start(spec)
    print(instance.provider_id, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


class TestSession:
    async def test_the_worker_has_a_session_of_its_own(self, provider, installation, ready):
        """The worker leads its own session and process group, apart from the server's."""
        pid = await started(provider, spec(installation, ready), ready)
        assert os.getsid(pid) == pid
        assert os.getpgid(pid) == pid
        assert os.getsid(pid) != os.getsid(0)

    async def test_the_worker_outlives_the_process_that_started_it(
        self, provider, installation, ready, tmp_path
    ):
        """Killing the starting process with SIGKILL leaves the worker running and adoptable."""
        name = f"w-{uuid.uuid4().hex[:8]}"
        starter = subprocess.Popen(
            [
                sys.executable,
                "-c",
                THROWAWAY,
                str(tmp_path / "h"),
                str(STANDIN),
                installation,
                name,
                str(ready),
                KEY.decode(),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        try:
            assert starter.stdout is not None
            line = await asyncio.to_thread(starter.stdout.readline)
            pid = int(line)
            await eventually((ready / str(pid)).exists, what="the worker to be ready")
            assert psutil.Process(pid).ppid() == starter.pid
        finally:
            starter.kill()
            starter.wait()
        await eventually(lambda: psutil.Process(pid).ppid() != starter.pid, what="reparenting")
        assert alive(pid)
        assert os.getsid(pid) == pid
        (instance,) = await provider.list(installation=installation)
        assert (instance.name, instance.provider_id) == (name, str(pid))
        assert instance.state is InstanceState.RUNNING
        await provider.stop(name)
        assert not alive(pid)


class TestForgery:
    async def test_a_copy_of_a_workers_command_line_is_never_taken_for_it(
        self, provider, installation, ready, tmp_path
    ):
        """Processes with a worker's exact argv, or the marker of a name never started (what
        any local process can read and copy), are not listed, not adopted by another leader,
        not returned by start, and not signalled by stop; nor is a process of another uid,
        even with the right proof in its environment."""
        worker = spec(installation, ready)
        pid = await started(provider, worker, ready)
        argv = psutil.Process(pid).cmdline()
        label = marker(installation, "cpu", "ghost")
        ghost = [*argv[:-1], label]
        forged_env = {"STANDIN_READY": str(ready), "PATH": os.environ["PATH"]}
        forgers = [
            subprocess.Popen(argv, env=forged_env),
            subprocess.Popen(ghost, env={**forged_env, PROOF_ENV: "0" * 64}),
            subprocess.Popen(  # the right proof, but not the server's user (as a job's uid)
                ["/bin/sh", "-c", "read line", "sh", MARKER, label],
                stdin=subprocess.PIPE,
                env={PROOF_ENV: proof(proof_key(KEY), label)},
                user=65534,
                group=65534,
                extra_groups=[],
            ),
        ]
        try:
            for forger in forgers[:2]:
                await eventually((ready / str(forger.pid)).exists, what="a forger ready")
            assert psutil.Process(forgers[2].pid).cmdline()[-2:] == [MARKER, label]
            forged = {f.pid for f in forgers}

            listed = await provider.list(installation=installation)
            assert [(i.name, i.provider_id) for i in listed] == [(worker.name, str(pid))]
            leader = ProcessProvider(tmp_path / "leader", secret_key=KEY, command=COMMAND)
            listed = await leader.list(installation=installation)
            assert [(i.name, i.provider_id) for i in listed] == [(worker.name, str(pid))]

            again = await leader.start(worker)
            assert again.provider_id == str(pid)
            fresh = await leader.start(spec(installation, ready, name="ghost"))
            assert int(fresh.provider_id) not in forged
            await eventually((ready / fresh.provider_id).exists, what="the real ghost ready")

            await leader.stop("ghost")
            await provider.stop(worker.name)
            assert not alive(int(fresh.provider_id)) and not alive(pid)
            assert all(forger.poll() is None for forger in forgers)
            assert await leader.list(installation=installation) == []
        finally:
            for forger in forgers:
                forger.kill()
                forger.wait()
