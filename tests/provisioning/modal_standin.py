"""A stand-in for the part of the `modal` package the Modal provider uses, with a workspace.

`make()` returns a fresh module object (what the provider is given instead of `modal`) and the
`Workspace` behind it. Only the members the provider calls exist, with the parameters it passes,
declared with the same names and kinds as in the real package; `test_modal.py` checks them
against the installed `modal` with `inspect.signature`, so an API change there breaks the tests.
As in modal, the blocking form of each call is not used: the provider awaits `.aio`.

Behaviour kept from Modal: `App.lookup(create_if_missing=True)` creates the app; a sandbox name is
a Modal object name and unique among an app's running sandboxes (AlreadyExistsError); `list`
returns running sandboxes of the app that carry at least the given tags; `poll` is None while
running, else the exit code; `terminate` of an ended sandbox does nothing.
"""

import itertools
import re
import types
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

_OBJECT_NAME = re.compile(r"[a-zA-Z0-9._-]{1,64}")
TERMINATED = 137  # what the stand-in reports for a terminated sandbox


class Error(Exception):
    pass


class AlreadyExistsError(Error):
    pass


class NotFoundError(Error):
    pass


class InvalidError(Error):
    pass


class aio:  # noqa: N801  (named for what it stands in for: synchronicity's `.aio` interface)
    """A function or method offered, as modal does, through `.aio` (the async form)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __get__(self, instance: object, owner: type | None = None) -> "_Aio":
        return _Aio(self.fn if instance is None else types.MethodType(self.fn, instance))


@dataclass(frozen=True)
class _Aio:
    aio: Callable[..., Any]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the provider must use the async form (.aio) of modal's calls")


@dataclass
class Workspace:
    """What the stand-in's Modal account holds, for tests to look at and change."""

    apps: dict[str, Any] = field(default_factory=dict)  # name -> App
    sandboxes: dict[str, Any] = field(default_factory=dict)  # object_id -> Sandbox
    fail_next: Error | None = None  # raised by the next API call, as a Modal failure would be
    ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def call(self) -> None:
        if self.fail_next is not None:
            failure, self.fail_next = self.fail_next, None
            raise failure

    def exit(self, object_id: str, code: int) -> None:
        """The sandbox's command ended with `code`."""
        self.sandboxes[object_id].returncode = code


def make() -> tuple[types.ModuleType, Workspace]:
    workspace = Workspace()

    async def lookup(name: str, *, create_if_missing: bool = False) -> "App":
        workspace.call()
        if name not in workspace.apps:
            if not create_if_missing:
                raise NotFoundError(f"App '{name}' not found")
            workspace.apps[name] = App(name)
        return workspace.apps[name]

    class App:
        def __init__(self, name: str) -> None:
            self.name = name
            self.app_id = f"ap-{next(workspace.ids):022d}"

    App.lookup = aio(lookup)

    @dataclass(frozen=True)
    class Image:
        tag: str

        @staticmethod
        def from_registry(tag: str) -> "Image":
            return Image(tag)

    @dataclass(frozen=True)
    class Secret:
        env_dict: dict[str, str | None]

        @staticmethod
        def from_dict(env_dict: dict[str, str | None]) -> "Secret":
            return Secret(dict(env_dict))

    class Sandbox:
        def __init__(self, command: tuple[str, ...], **options: Any) -> None:
            self.object_id = f"sb-{next(workspace.ids):022d}"
            self.command = command
            self.options = options
            self.tags: dict[str, str] = dict(options["tags"] or {})
            self.returncode: int | None = None

        @aio
        async def create(
            *args: str,
            app: App | None = None,
            name: str | None = None,
            tags: dict[str, str] | None = None,
            image: Image | None = None,
            env: dict[str, str | None] | None = None,
            secrets: list[Secret] | None = None,
            timeout: int | None = 300,
            gpu: str | None = None,
            region: str | None = None,
            cpu: float | None = None,
            memory: int | None = None,
        ) -> "Sandbox":
            workspace.call()
            assert isinstance(app, App), "a sandbox needs an app"
            assert isinstance(image, Image)
            assert all(isinstance(s, Secret) for s in secrets or [])
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in (tags or {}).items())
            if name is not None:
                if not _OBJECT_NAME.fullmatch(name) or name.startswith("ap-"):
                    raise InvalidError(f"Invalid Sandbox name: '{name}'.")
                for other in workspace.sandboxes.values():
                    running = other.returncode is None
                    if running and other.options["app"] is app and other.options["name"] == name:
                        raise AlreadyExistsError(f"Sandbox with name '{name}' already exists")
            sandbox = Sandbox(
                args,
                app=app,
                name=name,
                tags=tags,
                image=image,
                env=env,
                secrets=list(secrets or []),
                timeout=timeout,
                gpu=gpu,
                region=region,
                cpu=cpu,
                memory=memory,
            )
            workspace.sandboxes[sandbox.object_id] = sandbox
            return sandbox

        @aio
        async def list(
            *, app_id: str | None = None, tags: dict[str, str] | None = None
        ) -> AsyncIterator["Sandbox"]:
            workspace.call()
            wanted = (tags or {}).items()
            for sandbox in list(workspace.sandboxes.values()):
                if sandbox.returncode is not None:
                    continue  # as modal: running sandboxes only
                if app_id is not None and sandbox.options["app"].app_id != app_id:
                    continue
                if wanted <= sandbox.tags.items():
                    yield sandbox

        @aio
        async def terminate(self, *, wait: bool = False) -> int | None:
            workspace.call()
            if self.returncode is None:
                self.returncode = TERMINATED
            return self.returncode if wait else None

        @aio
        async def poll(self) -> int | None:
            workspace.call()
            return self.returncode

        @aio
        async def get_tags(self) -> dict[str, str]:
            workspace.call()
            return dict(self.tags)

    module = types.ModuleType("modal", "A stand-in for the modal package (tests only).")
    module.App = App
    module.Image = Image
    module.Secret = Secret
    module.Sandbox = Sandbox
    exception = types.ModuleType("modal.exception")
    exception.Error = Error
    exception.AlreadyExistsError = AlreadyExistsError
    exception.NotFoundError = NotFoundError
    exception.InvalidError = InvalidError
    module.exception = exception
    return module, workspace
