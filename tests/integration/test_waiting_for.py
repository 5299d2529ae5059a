"""What a queued job says it waits for, in a provisioned pool (SPEC section 2: `job show`)."""

from tests.integration.conftest import Api

CPU = {
    "pools": {
        "cpu": {
            "slots": {"default": 1},
            "provisioner": {"max": 2, "labels": ["ssd"], "compute": {"provider": "process"}},
        }
    }
}


async def waiting_for(api: Api, **body: object) -> str:
    r = await api.call("POST", "/api/v1/jobs", json={"command": ["true"], "pool": "cpu", **body})
    assert r.status_code == 201, r.text
    return str((await api.call("GET", f"/api/v1/jobs/{r.json()['id']}")).json()["waiting_for"])


class TestProvisionedPool:
    async def test_a_label_its_workers_do_not_carry(self, api_with):
        """A required label the provisioner's workers lack: it says it starts none for it;
        labels they carry, or `prefer`: workers start when jobs wait."""
        api = await api_with(CPU)
        said = await waiting_for(api, labels=["gpu", "ssd"])
        assert said == (
            "no worker of pool cpu with default slots is attached; pool cpu starts no worker "
            "for it: its provisioner's workers do not carry label gpu (they carry: ssd; "
            "[pools.cpu.provisioner] labels)"
        )
        starts = (
            "no worker of pool cpu with default slots is attached; "
            "pool cpu starts workers when jobs wait"
        )
        assert await waiting_for(api, labels=["ssd"]) == starts
        assert await waiting_for(api, labels=["gpu"], device_policy="prefer") == starts
