"""The Modal provider through the same interface, against a stand-in of the `modal` package, and
that stand-in against the installed `modal`'s own signatures."""

import inspect
import re

import msgspec
import pytest

from service.config import Compute
from service.provisioning.providers.base import InstanceState, ProviderError, WorkerSpec
from service.provisioning.providers.modal import (
    DEFAULT_APP,
    SANDBOX_TIMEOUT_SECONDS,
    ModalProvider,
    mebibytes,
    sandbox_name,
)
from tests.provisioning import modal_standin

TOKEN = "brt_join_0a1b2c3d4e5f"


def compute(**overrides) -> Compute:
    values = {
        "provider": "modal",
        "image": "ghcr.io/example/berth:1.4.2",
        "app": "berth-test",
        "gpu": "L4:2",
        "cpu": "4",
        "memory": "16Gi",
        "region": "us-east",
        "env": {"TZ": "UTC"},
    }
    return Compute(**{**values, **overrides})


def worker(name: str = "gpu-1", pool: str = "gpu", installation: str = "inst-1") -> WorkerSpec:
    return WorkerSpec(
        name=name,
        pool=pool,
        installation=installation,
        argv=("worker", "--server", "https://berth.example.com", "--pool", pool, "--name", name),
        env={"BERTH_SERVER": "https://berth.example.com"},
        secret_env={"BERTH_JOIN_TOKEN": TOKEN},
    )


@pytest.fixture
def modal():
    return modal_standin.make()


@pytest.fixture
def provider(modal):
    module, _ = modal
    return ModalProvider(compute(), modal=module)


class TestStartListStop:
    async def test_start_creates_a_tagged_sandbox_with_a_secret(self, provider, modal):
        """start creates one sandbox running berth, tagged, with the credential as a Secret."""
        _, workspace = modal
        spec = worker()
        instance = await provider.start(spec)
        (sandbox,) = workspace.sandboxes.values()
        assert instance.provider_id == sandbox.object_id
        assert instance.state is InstanceState.RUNNING
        assert sandbox.command == ("berth", *spec.argv)
        options = sandbox.options
        assert options["app"].name == "berth-test"
        assert options["tags"] == spec.labels
        assert options["name"] == sandbox_name("inst-1", "gpu-1")
        assert options["image"].tag == "ghcr.io/example/berth:1.4.2"
        (secret,) = options["secrets"]
        assert secret.env_dict == {"BERTH_JOIN_TOKEN": TOKEN}
        assert TOKEN not in repr(options["env"])
        assert options["env"] == {"TZ": "UTC", "BERTH_SERVER": "https://berth.example.com"}
        assert (options["gpu"], options["cpu"], options["memory"]) == ("L4:2", 4.0, 16384)
        assert options["region"] == "us-east"
        assert options["timeout"] == SANDBOX_TIMEOUT_SECONDS

    async def test_list_filters_and_a_new_provider_adopts(self, provider, modal):
        """list finds sandboxes by installation and pool tags, also from a new provider object."""
        module, _ = modal
        await provider.start(worker("gpu-1", "gpu"))
        await provider.start(worker("cpu-1", "cpu"))
        await provider.start(worker("gpu-1", "gpu", installation="inst-2"))
        listed = {i.name: i for i in await provider.list(installation="inst-1")}
        assert set(listed) == {"gpu-1", "cpu-1"}
        assert listed["cpu-1"].pool == "cpu"
        assert {i.state for i in listed.values()} == {InstanceState.RUNNING}
        leader = ModalProvider(compute(), modal=module)
        assert [i.name for i in await leader.list(installation="inst-1", pool="gpu")] == ["gpu-1"]
        assert await leader.list(installation="inst-3") == []

    async def test_a_second_start_returns_the_running_sandbox(self, provider, modal):
        """Starting a running name again returns it and creates nothing."""
        _, workspace = modal
        first = await provider.start(worker())
        again = await provider.start(worker())
        assert again.provider_id == first.provider_id
        assert len(workspace.sandboxes) == 1

    async def test_a_name_held_by_an_untagged_sandbox_is_refused(self, provider, modal):
        """A running sandbox holding the name without our tags is reported, not doubled."""
        module, workspace = modal
        app = await module.App.lookup.aio("berth-test", create_if_missing=True)
        await module.Sandbox.create.aio(
            "sleep",
            "infinity",
            app=app,
            name=sandbox_name("inst-1", "gpu-1"),
            image=module.Image.from_registry("debian"),
        )
        with pytest.raises(ProviderError, match="exists but is not listed"):
            await provider.start(worker())
        assert len(workspace.sandboxes) == 1

    async def test_an_ended_sandbox_is_reported_with_its_code(self, provider, modal):
        """A sandbox that exited 1 is FAILED for the provider that started it, absent for others."""
        module, workspace = modal
        started = await provider.start(worker())
        workspace.exit(started.provider_id, 1)
        (instance,) = await provider.list(installation="inst-1")
        assert (instance.state, instance.detail) == (InstanceState.FAILED, "exited with code 1")
        assert await ModalProvider(compute(), modal=module).list(installation="inst-1") == []

    async def test_stop_terminates_and_is_idempotent(self, provider, modal):
        """stop terminates the worker's sandbox; again, or for an unknown name, is no error."""
        _, workspace = modal
        started = await provider.start(worker())
        await provider.start(worker("gpu-2"))
        await provider.stop("gpu-1")
        assert workspace.sandboxes[started.provider_id].returncode is not None
        assert [i.name for i in await provider.list(installation="inst-1")] == ["gpu-2"]
        await provider.stop("gpu-1")
        await provider.stop("never-started")

    async def test_a_modal_failure_is_a_provider_error(self, provider, modal):
        """An error from Modal (quota, auth, network) surfaces as ProviderError with its words."""
        _, workspace = modal
        workspace.fail_next = modal_standin.Error("Sandbox quota exceeded")
        with pytest.raises(ProviderError, match="Sandbox quota exceeded"):
            await provider.start(worker())

    async def test_the_default_app_is_created(self, modal):
        """Without compute.app the sandboxes go to the app berth-workers, made when missing."""
        module, workspace = modal
        await ModalProvider(compute(app=msgspec.UNSET), modal=module).start(worker())
        assert set(workspace.apps) == {DEFAULT_APP}


class TestConfig:
    def test_an_image_is_required(self, modal):
        """Without an image there is nothing to run: ProviderError at once."""
        module, _ = modal
        with pytest.raises(ProviderError, match="image"):
            ModalProvider(Compute(provider="modal"), modal=module)

    @pytest.mark.parametrize(
        ("text", "mib"),
        [
            ("16Gi", 16384),
            ("16G", 15259),
            ("512Mi", 512),
            ("512M", 488),
            ("2048", 2048),
            ("1.5Gi", 1536),
            ("1GB", 954),
        ],
    )
    def test_memory_sizes(self, text, mib):
        """Memory sizes read as Kubernetes writes them (binary and decimal units), bare = MiB."""
        assert mebibytes(text) == mib

    async def test_a_bad_size_is_refused(self, modal):
        """A memory size that is not one is a ProviderError naming the key."""
        module, workspace = modal
        with pytest.raises(ProviderError, match=r"compute\.memory"):
            await ModalProvider(compute(memory="lots"), modal=module).start(worker())
        assert workspace.sandboxes == {}

    def test_sandbox_names_are_valid_object_names(self):
        """Sandbox names fit Modal's object names and differ per installation and worker."""
        names = {
            sandbox_name("inst-1", "gpu-1"),
            sandbox_name("inst-2", "gpu-1"),
            sandbox_name("inst-1", "w/" + "é" * 80),
        }
        assert len(names) == 3
        assert all(re.fullmatch(r"[A-Za-z0-9._-]{1,63}", n) for n in names)


# The members of `modal` the provider uses: async ones through `.aio`, then plain ones.
ASYNC_MEMBERS = [
    ("App", "lookup"),
    ("Sandbox", "create"),
    ("Sandbox", "list"),
    ("Sandbox", "terminate"),
    ("Sandbox", "poll"),
    ("Sandbox", "get_tags"),
]
PLAIN_MEMBERS = [("Image", "from_registry"), ("Secret", "from_dict")]


def assert_compatible(fake: inspect.Signature, real: inspect.Signature, where: str) -> None:
    """Every call the stand-in accepts, the real function accepts the same way."""
    real_params = real.parameters
    for name, param in fake.parameters.items():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            assert any(p.kind is param.kind for p in real_params.values()), f"{where}: no *{name}"
            continue
        assert name in real_params, f"{where}: modal has no parameter {name!r}"
        kind = real_params[name].kind
        if param.kind is inspect.Parameter.KEYWORD_ONLY:
            assert kind in {kind.KEYWORD_ONLY, kind.POSITIONAL_OR_KEYWORD}, (
                f"{where}: {name} {kind}"
            )
        else:
            assert kind is param.kind, f"{where}: {name} is {kind} in modal, {param.kind} here"
    for name, param in real_params.items():
        required = param.default is param.empty and param.kind not in {
            param.VAR_POSITIONAL,
            param.VAR_KEYWORD,
        }
        assert not required or name in fake.parameters, f"{where}: modal requires {name!r}"


class TestTheStandInMatchesModal:
    """The installed modal has every member the provider calls, with compatible parameters."""

    @pytest.fixture
    def real(self):
        return pytest.importorskip("modal")

    @pytest.mark.parametrize(("owner", "member"), ASYNC_MEMBERS)
    def test_async_members(self, real, modal, owner, member):
        """Each `.aio` call of the stand-in exists in modal with the parameters we pass."""
        fake = getattr(getattr(modal[0], owner), member)
        actual = getattr(getattr(real, owner), member)
        assert hasattr(actual, "aio"), f"modal.{owner}.{member} has no .aio"
        assert_compatible(
            inspect.signature(fake.aio), inspect.signature(actual.aio), f"modal.{owner}.{member}"
        )

    @pytest.mark.parametrize(("owner", "member"), PLAIN_MEMBERS)
    def test_plain_members(self, real, modal, owner, member):
        """Each plain call of the stand-in exists in modal, not async, with our parameters."""
        fake = getattr(getattr(modal[0], owner), member)
        actual = getattr(getattr(real, owner), member)
        assert not hasattr(actual, "aio"), f"modal.{owner}.{member} became async"
        assert_compatible(
            inspect.signature(fake), inspect.signature(actual), f"modal.{owner}.{member}"
        )

    def test_attributes_and_errors(self, real):
        """The attributes and exceptions the provider reads exist in modal."""
        assert isinstance(inspect.getattr_static(real.Sandbox, "object_id"), property)
        assert isinstance(inspect.getattr_static(real.App, "app_id"), property)
        assert issubclass(real.exception.AlreadyExistsError, real.exception.Error)
        for name in ("Error", "AlreadyExistsError", "NotFoundError", "InvalidError"):
            assert hasattr(real.exception, name), f"modal.exception.{name} is gone"

    def test_the_provider_accepts_the_real_module(self, real):
        """The real module can be handed to the provider (nothing is called until start)."""
        provider = ModalProvider(compute(), modal=real)
        assert provider is not None

    def test_the_tagged_sandbox_name_passes_modals_own_check(self, real):
        """Modal's own name check accepts the names the provider makes."""
        from modal._utils.name_utils import is_valid_object_name

        for name in (sandbox_name("inst-1", "gpu-1"), sandbox_name("i" * 40, "w/" + "é" * 80)):
            assert is_valid_object_name(name), name
