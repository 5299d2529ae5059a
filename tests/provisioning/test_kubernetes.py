"""The Kubernetes provider: its manifests against the official schemas, and the provider driven
through kubernetes-asyncio against a stand-in API server that validates every body it gets."""

import base64
import copy
import json
import re
import socket
import uuid
from pathlib import Path

import kubernetes_validate
import pytest

from service.config import Compute, Toleration
from service.provisioning.providers import kubernetes as kubernetes_provider
from service.provisioning.providers.base import (
    LABEL_INSTALLATION,
    LABEL_POOL,
    LABEL_WORKER,
    InstanceState,
    ProviderError,
    WorkerSpec,
)
from service.provisioning.providers.kubernetes import (
    WORKER_CAPABILITIES,
    KubernetesProvider,
    label_value,
    manifests,
    owned_by,
    pod_name,
    secret_name,
)
from tests.provisioning import k8s_standin

NS = "berth"
VERSIONS = ["1.28", k8s_standin.VERSION, "1.37"]  # an old release, the stand-in's, the newest known
TOKEN = "brt_join_5f1d0c2e9a7b4e8f"
LABEL_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def full_compute(**overrides) -> Compute:
    values = {
        "provider": "kubernetes",
        "image": "registry.example.com/berth:1.4.2",
        "namespace": NS,
        "cpu": "500m",
        "memory": "2Gi",
        "gpus": 2,
        "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
        "tolerations": [
            Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
            Toleration(key="dedicated", operator="Equal", value="berth", effect="NoExecute"),
        ],
        "service_account": "berth-worker",
        "env": {"BERTH_CONFIG_JSON": '{"executor": {"heartbeat_seconds": 5}}', "TZ": "UTC"},
    }
    return Compute(**{**values, **overrides})


def worker(installation: str = "inst-1", name: str = "gpu-1", pool: str = "gpu") -> WorkerSpec:
    return WorkerSpec(
        name=name,
        pool=pool,
        installation=installation,
        argv=("worker", "--server", "https://berth.example.com", "--pool", pool, "--name", name),
        env={"BERTH_SERVER": "https://berth.example.com"},
        secret_env={"BERTH_JOIN_TOKEN": TOKEN},
    )


def valid(obj: dict, version: str = k8s_standin.VERSION) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


class TestManifests:
    @pytest.mark.parametrize("version", VERSIONS)
    def test_a_full_config_is_valid(self, version):
        """Pod and Secret for every compute key validate strictly against the official schema."""
        pod, secret = manifests(worker(), full_compute())
        valid(pod, version)
        valid(secret, version)
        valid(owned_by(secret, pod["metadata"]["name"], str(uuid.uuid4())), version)

    def test_a_full_config_says_what_was_configured(self):
        """Resources, GPUs, node selector, tolerations, service account and command are set."""
        spec = worker()
        pod, _ = manifests(spec, full_compute())
        pod_spec = pod["spec"]
        (container,) = pod_spec["containers"]
        assert pod["metadata"]["namespace"] == NS
        assert pod_spec["restartPolicy"] == "Never"
        assert container["image"] == "registry.example.com/berth:1.4.2"
        assert container["command"] == ["berth", *spec.argv]
        assert container["resources"] == {
            "requests": {"cpu": "500m", "memory": "2Gi"},
            "limits": {"cpu": "500m", "memory": "2Gi", "nvidia.com/gpu": "2"},
        }
        assert pod_spec["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
        assert pod_spec["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "dedicated", "operator": "Equal", "value": "berth", "effect": "NoExecute"},
        ]
        assert pod_spec["serviceAccountName"] == "berth-worker"
        assert "automountServiceAccountToken" not in pod_spec
        env = {e["name"]: e for e in container["env"]}
        assert env["TZ"] == {"name": "TZ", "value": "UTC"}
        assert env["BERTH_SERVER"]["value"] == "https://berth.example.com"

    def test_a_minimal_config_is_valid(self):
        """With only an image: namespace default, no resources, no service-account token."""
        pod, secret = manifests(worker(), Compute(provider="kubernetes", image="berth:dev"))
        valid(pod)
        valid(secret)
        assert pod["metadata"]["namespace"] == "default"
        assert "resources" not in pod["spec"]["containers"][0]
        assert pod["spec"]["automountServiceAccountToken"] is False

    @pytest.mark.parametrize(
        "compute", [full_compute(), Compute(provider="kubernetes", image="berth:dev")]
    )
    def test_the_worker_keeps_only_the_capabilities_isolation_needs(self, compute):
        """The worker runs as root (each job gets a uid of its own), unprivileged, under the
        runtime's seccomp profile, with every capability dropped but the seven it uses."""
        pod, _ = manifests(worker(), compute)
        (container,) = pod["spec"]["containers"]
        assert container["securityContext"] == {
            "runAsUser": 0,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "privileged": False,
            "capabilities": {
                "drop": ["ALL"],
                "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID", "SYS_ADMIN"],
            },
        }
        assert pod["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        for shared in ("hostPID", "hostIPC", "hostNetwork", "volumes"):
            assert shared not in pod["spec"]

    def test_the_readme_names_each_worker_capability_with_why(self):
        """deploy/kubernetes/README.md has a row, with a reason, for each capability a worker
        pod keeps, and none for another."""
        readme = (DEPLOY / "README.md").read_text()
        rows = dict(re.findall(r"^\| `([A-Z_]+)` \| (.+) \|$", readme, re.MULTILINE))
        assert set(rows) == set(WORKER_CAPABILITIES)
        assert all(len(why.split()) >= 5 for why in rows.values()), rows
        source = Path(kubernetes_provider.__file__).read_text()
        for capability in WORKER_CAPABILITIES:  # and a comment saying why in the provider
            assert re.search(rf'^\s+"{capability}",\s+# \S', source, re.MULTILINE), capability

    def test_the_credential_is_only_in_the_secret(self):
        """The Secret holds the token; the Pod names it through secretKeyRef, never by value."""
        spec = worker()
        # Even a pool env entry of the same name must not put a literal beside the reference.
        pod, secret = manifests(spec, full_compute(env={"BERTH_JOIN_TOKEN": "literal"}))
        assert TOKEN not in json.dumps(pod)
        assert "literal" not in json.dumps(pod)
        assert secret["stringData"] == {"BERTH_JOIN_TOKEN": TOKEN}
        assert secret["immutable"] is True
        (ref,) = [e for e in pod["spec"]["containers"][0]["env"] if e["name"] == "BERTH_JOIN_TOKEN"]
        assert ref == {
            "name": "BERTH_JOIN_TOKEN",
            "valueFrom": {
                "secretKeyRef": {"name": secret_name(spec.name), "key": "BERTH_JOIN_TOKEN"}
            },
        }

    def test_labels_and_annotations_name_the_worker(self):
        """Both objects carry the three labels; annotations keep the exact values."""
        spec = worker()
        pod, secret = manifests(spec, full_compute())
        for obj in (pod, secret):
            assert obj["metadata"]["labels"] == spec.labels
            assert obj["metadata"]["annotations"] == spec.labels

    def test_invalid_label_values_and_names_are_sanitised(self):
        """Names that are not valid label values or DNS labels get a clean prefix and a hash."""
        long_name = "Worker_" + "x" * 80
        odd_pool = "gpu pool/é"
        spec = worker(installation="0f3c" * 20, name=long_name, pool=odd_pool)
        pod, secret = manifests(spec, full_compute())
        valid(pod)
        valid(secret)
        labels = pod["metadata"]["labels"]
        for value in labels.values():
            assert len(value) <= 63
            assert LABEL_RE.fullmatch(value)
        assert labels[LABEL_WORKER] != long_name
        assert pod["metadata"]["annotations"][LABEL_WORKER] == long_name
        assert pod["metadata"]["annotations"][LABEL_POOL] == odd_pool
        name = pod["metadata"]["name"]
        assert len(name) <= 63
        assert DNS_LABEL_RE.fullmatch(name)
        assert label_value("gpu-1") == "gpu-1"  # a valid value is kept as it is
        assert pod_name("gpu-1") == "berth-gpu-1"
        assert label_value("a b") != label_value("a_b")  # the hash keeps them apart
        assert pod_name("GPU-1") != pod_name("gpu-1")

    def test_an_image_is_required(self):
        """Without an image there is nothing to run: ProviderError, before any call."""
        with pytest.raises(ProviderError, match="image"):
            manifests(worker(), Compute(provider="kubernetes"))


@pytest.fixture
def standin():
    with k8s_standin.running() as (url, cluster):
        yield url, cluster


@pytest.fixture
async def provider(standin, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not "in a cluster"
    url, _ = standin
    made = KubernetesProvider(full_compute(api_url=url))
    yield made
    await made.close()


def pods(cluster) -> dict:
    return cluster.store(NS, "pods")


def secrets(cluster) -> dict:
    return cluster.store(NS, "secrets")


def container_status(**state) -> dict:
    return {
        "name": "worker",
        "image": "registry.example.com/berth:1.4.2",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": state,
    }


STATES = {
    "unschedulable": (
        {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                }
            ],
        },
        InstanceState.STARTING,
        "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    ),
    "creating": (
        {
            "phase": "Pending",
            "containerStatuses": [container_status(waiting={"reason": "ContainerCreating"})],
        },
        InstanceState.STARTING,
        "ContainerCreating",
    ),
    "waiting for its secret": (
        {
            "phase": "Pending",
            "containerStatuses": [
                container_status(
                    waiting={
                        "reason": "CreateContainerConfigError",
                        "message": 'secret "berth-gpu-1-credential" not found',
                    }
                )
            ],
        },
        InstanceState.STARTING,
        'CreateContainerConfigError: secret "berth-gpu-1-credential" not found',
    ),
    "image pull back-off": (
        {
            "phase": "Pending",
            "containerStatuses": [
                container_status(
                    waiting={
                        "reason": "ImagePullBackOff",
                        "message": 'Back-off pulling image "registry.example.com/berth:1.4.2"',
                    }
                )
            ],
        },
        InstanceState.FAILED,
        'ImagePullBackOff: Back-off pulling image "registry.example.com/berth:1.4.2"',
    ),
    "image pull error": (
        {
            "phase": "Pending",
            "containerStatuses": [
                container_status(waiting={"reason": "ErrImagePull", "message": "manifest unknown"})
            ],
        },
        InstanceState.FAILED,
        "ErrImagePull: manifest unknown",
    ),
    "running": (
        {
            "phase": "Running",
            "containerStatuses": [container_status(running={"startedAt": "2026-11-30T10:00:00Z"})],
        },
        InstanceState.RUNNING,
        "",
    ),
    "out of memory": (
        {
            "phase": "Failed",
            "containerStatuses": [
                container_status(terminated={"exitCode": 137, "reason": "OOMKilled"})
            ],
        },
        InstanceState.FAILED,
        "OOMKilled (exit code 137)",
    ),
    "crashed": (
        {
            "phase": "Failed",
            "containerStatuses": [container_status(terminated={"exitCode": 2, "reason": "Error"})],
        },
        InstanceState.FAILED,
        "Error (exit code 2)",
    ),
    "evicted": (
        {
            "phase": "Failed",
            "reason": "Evicted",
            "message": "The node was low on resource: memory.",
        },
        InstanceState.FAILED,
        "Evicted: The node was low on resource: memory.",
    ),
    "exited cleanly": (
        {
            "phase": "Succeeded",
            "containerStatuses": [
                container_status(terminated={"exitCode": 0, "reason": "Completed"})
            ],
        },
        InstanceState.STOPPED,
        "Completed (exit code 0)",
    ),
}


class TestAgainstTheStandIn:
    async def test_start_list_stop(self, provider, standin):
        """start creates a labelled Pod and its owned Secret; list finds them; stop deletes both."""
        _, cluster = standin
        a, b = worker(name="gpu-1", pool="gpu"), worker(name="cpu-1", pool="cpu")
        started = await provider.start(a)
        assert (started.name, started.pool, started.provider_id) == ("gpu-1", "gpu", "berth-gpu-1")
        assert started.state is InstanceState.STARTING
        await provider.start(b)

        pod = pods(cluster)["berth-gpu-1"]
        secret = secrets(cluster)["berth-gpu-1-credential"]
        assert pod["metadata"]["labels"] == a.labels
        assert secret["metadata"]["labels"] == a.labels
        assert secret["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "berth-gpu-1",
                "uid": pod["metadata"]["uid"],
            }
        ]
        assert base64.b64decode(secret["data"]["BERTH_JOIN_TOKEN"]).decode() == TOKEN
        assert TOKEN not in json.dumps(pod)
        posts = [r for r in cluster.requests if r.method == "POST"]
        assert [r.path.rsplit("/", 1)[1] for r in posts] == ["pods", "secrets"] * 2
        assert all(r.query.get("fieldValidation") == "Strict" for r in posts)

        listed = {i.name: i for i in await provider.list(installation="inst-1")}
        assert set(listed) == {"gpu-1", "cpu-1"}
        assert listed["cpu-1"].pool == "cpu"
        assert listed["cpu-1"].provider_id == "berth-cpu-1"
        assert [i.name for i in await provider.list(installation="inst-1", pool="gpu")] == ["gpu-1"]
        assert await provider.list(installation="inst-2") == []
        selectors = [
            r.query["labelSelector"] for r in cluster.requests if "labelSelector" in r.query
        ]
        assert selectors[:2] == [
            f"{LABEL_INSTALLATION}=inst-1",
            f"{LABEL_INSTALLATION}=inst-1,{LABEL_POOL}=gpu",
        ]

        await provider.stop("gpu-1")
        assert set(pods(cluster)) == {"berth-cpu-1"}
        assert set(secrets(cluster)) == {"berth-cpu-1-credential"}
        deletes = [r for r in cluster.requests if r.method == "DELETE"]
        assert deletes[0].path == f"/api/v1/namespaces/{NS}/pods/berth-gpu-1"
        assert deletes[0].query["gracePeriodSeconds"] == "30"
        await provider.stop("gpu-1")  # gone: 404 is success
        await provider.stop("never-started")
        assert [i.name for i in await provider.list(installation="inst-1")] == ["cpu-1"]

    async def test_a_second_start_returns_the_running_pod(self, provider, standin):
        """Starting a name whose Pod exists returns it; nothing is created twice."""
        _, cluster = standin
        first = await provider.start(worker())
        cluster.set_pod_status(NS, "berth-gpu-1", STATES["running"][0])
        again = await provider.start(worker())
        assert again.provider_id == first.provider_id
        assert again.state is InstanceState.RUNNING
        assert len(pods(cluster)) == 1
        assert len(secrets(cluster)) == 1

    async def test_a_retried_start_adds_a_missing_secret(self, provider, standin):
        """A start that died between Pod and Secret is completed by the next start."""
        _, cluster = standin
        await provider.start(worker())
        del secrets(cluster)["berth-gpu-1-credential"]
        await provider.start(worker())
        secret = secrets(cluster)["berth-gpu-1-credential"]
        assert (
            secret["metadata"]["ownerReferences"][0]["uid"]
            == pods(cluster)["berth-gpu-1"]["metadata"]["uid"]
        )

    async def test_a_pod_of_another_installation_is_not_adopted(self, provider, standin):
        """A Pod of the same name from another installation is refused, not taken over."""
        await provider.start(worker(installation="inst-1"))
        with pytest.raises(ProviderError, match="not this installation's worker"):
            await provider.start(worker(installation="inst-2"))

    async def test_a_new_provider_adopts_the_pods(self, provider, standin):
        """A second provider object (a new leader) lists the Pods by their labels."""
        url, _ = standin
        await provider.start(worker(name="gpu-1"))
        await provider.start(worker(name="gpu-2"))
        leader = KubernetesProvider(full_compute(api_url=url))
        try:
            names = sorted(i.name for i in await leader.list(installation="inst-1", pool="gpu"))
            assert names == ["gpu-1", "gpu-2"]
        finally:
            await leader.close()

    async def test_deleting_the_pod_deletes_its_secret(self, provider, standin):
        """The Secret's ownerReference is the Pod's uid: deleting the Pod alone removes both."""
        _, cluster = standin
        await provider.start(worker())
        cluster.delete(NS, "pods", "berth-gpu-1")  # as `kubectl delete pod` would
        assert secrets(cluster) == {}
        assert await provider.list(installation="inst-1") == []

    async def test_sanitised_names_round_trip(self, provider, standin):
        """A worker whose names need hashing is listed and stopped under its exact names."""
        _, cluster = standin
        spec = worker(installation="i" * 70, name="Gpu_Worker.Ünïcode", pool="pool with spaces")
        await provider.start(spec)
        (listed,) = await provider.list(installation=spec.installation, pool=spec.pool)
        assert (listed.name, listed.pool) == (spec.name, spec.pool)
        await provider.stop(spec.name)
        assert pods(cluster) == {}
        assert secrets(cluster) == {}

    @pytest.mark.parametrize("case", list(STATES))
    async def test_pod_phases_map_to_states(self, provider, standin, case):
        """Phase, conditions and container states map to a state and a useful detail."""
        _, cluster = standin
        pod_status, state, detail = STATES[case]
        await provider.start(worker())
        cluster.set_pod_status(NS, "berth-gpu-1", pod_status)
        (instance,) = await provider.list(installation="inst-1")
        assert (instance.state, instance.detail) == (state, detail)

    async def test_a_wrong_manifest_is_refused_with_the_reason(self, standin, monkeypatch):
        """A misspelled field is refused with 422 Invalid, and start raises it as ProviderError."""
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        url, cluster = standin

        def misspelled(spec, compute):
            pod, secret = manifests(spec, compute)
            pod = copy.deepcopy(pod)
            pod["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
            return pod, secret

        provider = KubernetesProvider(full_compute(api_url=url), render=misspelled)
        try:
            with pytest.raises(ProviderError) as refused:
                await provider.start(worker())
        finally:
            await provider.close()
        message = str(refused.value)
        assert "create pod berth-gpu-1: 422 Invalid" in message
        assert "imagePullPolicyy" in message
        assert pods(cluster) == {}
        assert secrets(cluster) == {}

    async def test_a_refused_secret_takes_its_pod_back(self, standin, monkeypatch):
        """When the Secret is refused, the Pod just made is deleted: none waits for a credential."""
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        url, cluster = standin

        def broken_secret(spec, compute):
            pod, secret = manifests(spec, compute)
            return pod, {**secret, "immutible": True}

        provider = KubernetesProvider(full_compute(api_url=url), render=broken_secret)
        try:
            with pytest.raises(ProviderError, match="create secret berth-gpu-1-credential: 422"):
                await provider.start(worker())
        finally:
            await provider.close()
        assert pods(cluster) == {}
        assert secrets(cluster) == {}

    async def test_an_unreachable_api_server_is_a_provider_error(self, monkeypatch):
        """No server at api_url: ProviderError naming the URL, not a client exception."""
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: refused
            provider = KubernetesProvider(full_compute(api_url=url))
            try:
                with pytest.raises(ProviderError, match=f"cannot reach {url}"):
                    await provider.list(installation="inst-1")
            finally:
                await provider.close()


def kubeconfig(path: Path, server: str, token: str) -> Path:
    import yaml

    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "clusters": [{"name": "test", "cluster": {"server": server}}],
                "users": [{"name": "test", "user": {"token": token}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
            }
        )
    )
    return path


class TestCredentials:
    """Which credential goes where: a token only ever reaches the server it was issued for."""

    @pytest.fixture(autouse=True)
    def outside_a_cluster(self, monkeypatch):
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    async def test_the_kubeconfig_is_used_without_api_url(self, standin, tmp_path):
        """With no api_url, the kubeconfig's server and token are used."""
        url, cluster = standin
        config = kubeconfig(tmp_path / "config", url, "token-for-this-server")
        provider = KubernetesProvider(full_compute(), kubeconfig=config)
        try:
            assert await provider.list(installation="inst-1") == []
        finally:
            await provider.close()
        assert [r.authorization for r in cluster.requests] == ["Bearer token-for-this-server"]

    async def test_api_url_of_the_same_server_keeps_the_token(self, standin, tmp_path):
        """An api_url naming the kubeconfig's own server is sent its token."""
        url, cluster = standin
        config = kubeconfig(tmp_path / "config", url, "token-for-this-server")
        provider = KubernetesProvider(full_compute(api_url=url + "/"), kubeconfig=config)
        try:
            await provider.list(installation="inst-1")
        finally:
            await provider.close()
        assert [r.authorization for r in cluster.requests] == ["Bearer token-for-this-server"]

    async def test_api_url_of_another_server_gets_no_token(self, standin, tmp_path):
        """An api_url that is not the kubeconfig's server (a proxy) is sent no credential."""
        url, cluster = standin
        config = kubeconfig(tmp_path / "config", "https://elsewhere.example:6443", "secret-token")
        provider = KubernetesProvider(full_compute(api_url=url), kubeconfig=config)
        try:
            await provider.list(installation="inst-1")
        finally:
            await provider.close()
        assert [r.authorization for r in cluster.requests] == [None]

    async def test_no_credentials_and_no_api_url_says_so(self, tmp_path):
        """Outside a cluster, without a kubeconfig or api_url: ProviderError saying what to set."""
        provider = KubernetesProvider(full_compute(), kubeconfig=tmp_path / "missing")
        try:
            with pytest.raises(ProviderError, match="no credentials"):
                await provider.list(installation="inst-1")
        finally:
            await provider.close()


class TestTheStandIn:
    """The stand-in answers as the API server documents, so passing against it means something."""

    def test_it_answers_like_the_api_server(self, standin):
        """201 with uid/resourceVersion/creationTimestamp, 409, 404 and 422 Status, a PodList."""
        import httpx

        url, _ = standin
        pod, _ = manifests(worker(), full_compute())
        base = f"{url}/api/v1/namespaces/{NS}/pods"
        with httpx.Client() as http:
            created = http.post(base, json=pod)
            assert created.status_code == 201
            meta = created.json()["metadata"]
            assert {"uid", "resourceVersion", "creationTimestamp"} <= set(meta)
            assert created.json()["status"]["phase"] == "Pending"
            conflict = http.post(base, json=pod)
            assert conflict.status_code == 409
            assert conflict.json()["kind"] == "Status"
            assert conflict.json()["reason"] == "AlreadyExists"
            missing = http.get(f"{base}/nope")
            assert (missing.status_code, missing.json()["reason"]) == (404, "NotFound")
            listed = http.get(base, params={"labelSelector": f"{LABEL_POOL}=gpu"}).json()
            assert listed["kind"] == "PodList"
            assert listed["apiVersion"] == "v1"
            assert "resourceVersion" in listed["metadata"]
            assert [p["metadata"]["name"] for p in listed["items"]] == ["berth-gpu-1"]
            other = http.get(base, params={"labelSelector": f"{LABEL_POOL}!=gpu"}).json()
            assert other["items"] == []
            wrong = copy.deepcopy(pod)
            wrong["metadata"]["name"] = "other"
            wrong["spec"]["restartPolicyy"] = "Never"
            invalid = http.post(base, json=wrong)
            assert invalid.status_code == 422
            assert invalid.json()["reason"] == "Invalid"
            assert "restartPolicyy" in invalid.json()["message"]


DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def documents(name: str) -> list[dict]:
    import yaml

    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


class TestDeployFiles:
    @pytest.mark.parametrize("version", VERSIONS)
    @pytest.mark.parametrize("name", ["rbac.yaml", "server.yaml"])
    def test_the_manifests_are_valid(self, name, version):
        """Every object in deploy/kubernetes validates strictly against the official schema."""
        docs = documents(name)
        assert docs
        for doc in docs:
            valid(doc, version)

    def test_the_server_pod_is_locked_down(self):
        """The server runs non-root on a read-only root filesystem with no capabilities, writes
        only to its emptyDirs (BERTH_HOME and /tmp), asks for resources and is probed on
        /healthz (startup, liveness) and /readyz (readiness)."""
        (deployment,) = [d for d in documents("server.yaml") if d["kind"] == "Deployment"]
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        (container,) = pod["containers"]
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        probes = {
            kind: (container[kind]["httpGet"]["path"], container[kind]["httpGet"]["port"])
            for kind in ("startupProbe", "livenessProbe", "readinessProbe")
        }
        assert probes == {
            "startupProbe": ("/healthz", "http"),
            "livenessProbe": ("/healthz", "http"),
            "readinessProbe": ("/readyz", "http"),
        }
        assert {p["name"] for p in container["ports"]} == {"http"}
        assert set(container["resources"]["requests"]) == {"cpu", "memory"}
        volumes = {v["name"]: v for v in pod["volumes"]}
        writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
        home = {e["name"]: e["value"] for e in container["env"]}["BERTH_HOME"]
        assert writable == {home, "/tmp"}
        for mount in container["volumeMounts"]:
            kind = "configMap" if mount.get("readOnly") else "emptyDir"
            assert kind in volumes[mount["name"]], mount

    def test_the_server_runs_no_builtin_worker(self):
        """The server (a non-root user who reads BERTH_HOME) runs no jobs itself."""
        import tomllib

        (config_map,) = [d for d in documents("server.yaml") if d["kind"] == "ConfigMap"]
        config = tomllib.loads(config_map["data"]["berth.toml"])
        assert config["pools"]["serve"]["builtin"] is False

    async def test_the_role_grants_what_the_provider_does(self, provider, standin):
        """Every (resource, verb) the provider used in a start/list/stop cycle is in the Role."""
        _, cluster = standin
        await provider.start(worker())
        await provider.start(worker())  # the adopt path: get
        await provider.list(installation="inst-1")
        await provider.stop("gpu-1")
        verb = {"POST": "create", "DELETE": "delete", "GET": "get"}
        used = set()
        for request in cluster.requests:
            parts = request.path.strip("/").split("/")  # api v1 namespaces NS plural [name]
            plural = parts[4]
            name = parts[5] if len(parts) > 5 else None
            used.add(
                (
                    plural,
                    "list" if request.method == "GET" and name is None else verb[request.method],
                )
            )
        (role,) = [d for d in documents("rbac.yaml") if d["kind"] == "Role"]
        granted = {
            (r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]
        }
        assert used <= granted
        assert {("pods", "create"), ("pods", "list"), ("secrets", "create")} <= used

    def test_the_readme_pool_section_is_valid_config(self):
        """The berth.toml in the README loads into berth's own Compute section."""
        import tomllib

        import msgspec

        from service.config import Config

        readme = (DEPLOY / "README.md").read_text()
        blocks = re.findall(r"```toml\n(.*?)```", readme, re.DOTALL)
        assert blocks
        for block in blocks:
            config = msgspec.convert(tomllib.loads(block), Config)
            computes = [p.provisioner.compute for p in config.pools.values() if p.provisioner]
            assert computes
            assert all(c.provider == "kubernetes" for c in computes)

    def test_the_readme_shows_the_servers_config(self):
        """The berth.toml shown in the README is the one server.yaml deploys."""
        readme = (DEPLOY / "README.md").read_text()
        (block,) = re.findall(r"```toml\n(.*?)```", readme, re.DOTALL)
        (config_map,) = [d for d in documents("server.yaml") if d["kind"] == "ConfigMap"]
        assert config_map["data"]["berth.toml"] == block
