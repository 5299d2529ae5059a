"""Bounds on what a job reaches through its relay, end to end (SPEC section 8): what one job
may save and queued jobs of its tenant when it submits jobs; past each the job is told the
bound by name and the worker's other work goes on. Relayed calls in flight per worker session
are bounded at the protocol, in process (tests/integration/test_relay.py)."""

import json
import textwrap

from tests.procs import wait_for

GPU = {"pools": {"gpu": {"slots": {"default": 2}}, "idle": {"slots": {"default": 1}}}}


def attached(s, name: str) -> bool:
    return any(w["name"] == name and w["attached"] for w in s.api("GET", "/api/v1/workers").json())


SAVING_JOB = textwrap.dedent(
    """
    import json, os, subprocess
    from berth_runtime import RelayError, save_artifact

    def save(name, size):
        with open(name, "wb") as f:
            f.write(os.urandom(size))
        try:
            return {"ref": save_artifact(name)}
        except RelayError as exc:
            return {"error": str(exc)}

    said = {"first": save("a.bin", 6000), "second": save("b.bin", 6000), "third": save("c.bin", 3000)}
    children = [
        subprocess.run(["berth", "job", "submit", "--pool", "idle", "--", "true"],
                       capture_output=True, text=True)
        for _ in range(2)
    ]
    said["children"] = [[c.returncode, c.stdout.strip(), c.stderr.strip()] for c in children]
    print(json.dumps(said))
    """
)


class TestRelayBounds:
    def test_a_job_saving_past_its_bound_is_told_and_its_worker_goes_on(
        self, server_factory, worker_factory, tmp_path
    ):
        """With relay_max_save_gb at 10 000 bytes, a job's second save of 6 000 bytes is refused
        naming executor.relay_max_save_gb while a smaller one still fits; its second child job
        past tenants.ml.max_queued is refused by name; the worker stays attached and runs the
        next job."""
        s = server_factory(
            {
                **GPU,
                "executor": {"relay_max_save_gb": 0.00001},
                "tenants": {"ml": {"max_queued": 1}},
            },
            builtin_worker=False,
        )
        worker_factory(
            s, s.worker_token("gpu1"), "gpu", "--python", "/usr/bin/python3", name="gpu1"
        )
        wait_for(lambda: attached(s, "gpu1"), 20, "gpu1 attached")
        script = tmp_path / "job.py"
        script.write_text(SAVING_JOB)
        r = s.cli(
            "job", "submit", "--wait", "--pool", "gpu", "--tenant", "ml", "--python", str(script),
            timeout=120,
        )  # fmt: skip
        assert r.code == 0, r.err
        said = json.loads(r.out.strip().splitlines()[-1])
        assert "ref" in said["first"] and "ref" in said["third"], said
        assert "executor.relay_max_save_gb" in said["second"]["error"], said
        assert "nothing was saved" in said["second"]["error"]
        for key in ("first", "third"):
            ref = said[key]["ref"]
            assert s.api("HEAD", f"/api/v1/cas/{ref}", params={"tenant": "ml"}).status_code == 200
        (first_code, child, _), (second_code, _, second_err) = said["children"]
        assert first_code == 0 and child.isdigit()
        assert second_code != 0 and "tenants.ml.max_queued = 1" in second_err, said
        queued = s.api("GET", "/api/v1/jobs", params={"state": "queued"}).json()
        assert [j["id"] for j in queued] == [int(child)]
        # The worker was never cut off: still attached, it runs the next job.
        assert attached(s, "gpu1")
        assert s.cli("job", "cancel", child).code == 0
        r = s.cli("job", "submit", "--wait", "--pool", "gpu", "--tenant", "ml", "--", "true")
        assert r.code == 0, r.err
