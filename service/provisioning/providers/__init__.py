"""Where provisioned workers run: local processes, Kubernetes pods, Modal sandboxes.

`open_provider` is the one way in: it imports a provider's module, and with it the provider's
client library, only when a pool is configured to use it, so a server without the `kubernetes`
or `modal` extra runs every other pool and says which package is missing for that one.
"""

import importlib
from pathlib import Path

from service.config import Compute
from service.provisioning.providers.base import Provider, ProviderError

# provider -> (the client library's top-level module, the extra that installs it)
_LIBRARIES = {
    "kubernetes": ("kubernetes_asyncio", "kubernetes"),
    "modal": ("modal", "modal"),
}


def open_provider(compute: Compute, *, home: Path, secret_key: bytes) -> Provider:
    """The provider `compute` names; ProviderError when its client library is not installed.

    `secret_key`: the installation's; the process provider proves its workers with it.
    """
    if compute.provider == "process":
        from service.provisioning.providers import process  # noqa: PLC0415  (no extra needed)

        env = compute.env if isinstance(compute.env, dict) else None
        command = compute.command if isinstance(compute.command, list) else None
        return process.ProcessProvider(home, secret_key=secret_key, env=env, command=command)
    library, extra = _LIBRARIES[compute.provider]
    try:
        client = importlib.import_module(library)
        if compute.provider == "kubernetes":
            from service.provisioning.providers import kubernetes  # noqa: PLC0415

            return kubernetes.KubernetesProvider(compute)
        from service.provisioning.providers import modal  # noqa: PLC0415

        return modal.ModalProvider(compute, modal=client)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing in {library, "aiohttp"}:  # aiohttp: kubernetes-asyncio's transport
            raise ProviderError(
                f"the {compute.provider} provider needs the {library} package, which is not "
                f"installed: pip install 'berth[{extra}]'"
            ) from None
        raise
