"""The worker's stored credential against the one it is given: the same worker's, or an error."""

import json
import stat

import pytest

from service.worker import credential

JOIN = "brj_" + "j" * 43
STORED = "brt_" + "s" * 43
OTHER = "brt_" + "o" * 43


class TestChoose:
    def test_nothing_stored_takes_the_given(self, tmp_path):
        """A fresh state directory: the given credential, and its digest as the origin."""
        assert credential.choose(tmp_path, OTHER) == (OTHER, credential.digest(OTHER))

    def test_the_join_token_it_came_from_is_the_same_worker(self, tmp_path):
        """The join token given again after a restart: the stored credential it was traded for."""
        credential.store(tmp_path, STORED, name="box-1", origin=credential.digest(JOIN))
        assert credential.choose(tmp_path, JOIN) == (STORED, credential.digest(JOIN))
        assert credential.choose(tmp_path, STORED) == (STORED, credential.digest(JOIN))
        assert credential.choose(tmp_path, "") == (STORED, credential.digest(JOIN))

    @pytest.mark.parametrize("given", [OTHER, "brj_" + "k" * 43])
    def test_another_credential_is_an_error_naming_both(self, tmp_path, given):
        """A stored credential and a different one given: Disagree, naming both, no secrets."""
        credential.store(tmp_path, STORED, name="box-1", origin=credential.digest(JOIN))
        with pytest.raises(credential.Disagree) as err:
            credential.choose(tmp_path, given)
        text = str(err.value)
        assert "worker box-1" in text and given[:8] in text and "BERTH_TOKEN" in text
        assert "--home" in text
        assert STORED not in text and given not in text and STORED[4:12] not in text

    def test_a_credential_stored_before_its_description_was(self, tmp_path):
        """An older state directory (a credential, no description) still refuses another."""
        (tmp_path / "credential").write_text(STORED + "\n")
        assert credential.choose(tmp_path, STORED)[0] == STORED
        with pytest.raises(credential.Disagree, match="token brt_ssss…"):
            credential.choose(tmp_path, OTHER)

    def test_stored_0600_and_described_without_secrets(self, tmp_path):
        """Both files are the worker's alone; the description holds a name and a digest."""
        credential.store(tmp_path, STORED, name="box-1", origin=credential.digest(JOIN))
        for name in ("credential", "credential.json"):
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
        meta = json.loads((tmp_path / "credential.json").read_text())
        assert meta == {"name": "box-1", "origin": credential.digest(JOIN)}
