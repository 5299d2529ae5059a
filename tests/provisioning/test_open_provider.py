"""open_provider: the provider a pool's compute names, its client library imported only then."""

import subprocess
import sys
from pathlib import Path

import pytest

from service.config import Compute
from service.provisioning.providers import open_provider
from service.provisioning.providers.base import ProviderError
from service.provisioning.providers.kubernetes import KubernetesProvider
from service.provisioning.providers.modal import ModalProvider
from service.provisioning.providers.process import ProcessProvider

KEY = b"k" * 32

ROOT = Path(__file__).resolve().parents[2]


class TestOpenProvider:
    def test_each_provider_by_name(self, tmp_path):
        """Each compute.provider value gives its provider."""
        assert isinstance(open_provider(Compute(), home=tmp_path, secret_key=KEY), ProcessProvider)
        kubernetes = Compute(provider="kubernetes", image="berth:dev")
        assert isinstance(
            open_provider(kubernetes, home=tmp_path, secret_key=KEY), KubernetesProvider
        )
        modal = Compute(provider="modal", image="berth:dev")
        assert isinstance(open_provider(modal, home=tmp_path, secret_key=KEY), ModalProvider)

    @pytest.mark.parametrize(
        ("provider", "library"), [("kubernetes", "kubernetes_asyncio"), ("modal", "modal")]
    )
    def test_a_missing_library_says_what_to_install(self, tmp_path, monkeypatch, provider, library):
        """Without the client library: one line naming the package and the extra to install."""
        monkeypatch.setitem(sys.modules, library, None)  # makes `import library` fail
        with pytest.raises(ProviderError) as missing:
            open_provider(
                Compute(provider=provider, image="berth:dev"), home=tmp_path, secret_key=KEY
            )
        message = str(missing.value)
        assert "\n" not in message
        assert f"pip install 'berth[{provider}]'" in message
        assert library in message

    def test_client_libraries_load_only_when_configured(self, tmp_path):
        """A server with process pools only never imports kubernetes-asyncio or modal."""
        script = (
            "import sys; from pathlib import Path; from service.config import Compute; "
            "from service.provisioning.providers import open_provider; "
            f'open_provider(Compute(), home=Path({str(tmp_path)!r}), secret_key=b"k"); '
            "print(sorted(m for m in ('kubernetes_asyncio', 'modal', 'aiohttp') if m in sys.modules))"
        )
        out = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == "[]"
