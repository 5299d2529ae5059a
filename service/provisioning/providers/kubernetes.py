"""Provisioned workers as Kubernetes Pods, one per worker, through the Kubernetes API.

Client: kubernetes-asyncio, because it is generated from each Kubernetes release's OpenAPI (so it
tracks the API without discovery calls), ships type stubs, sends a dict body as it is, and
exposes `fieldValidation=Strict`, so a misspelled field is refused instead of silently dropped.

Contract:
- `manifests(spec, compute)` is pure and is exactly what is sent: a Pod running
  `berth <argv...>` (`restartPolicy: Never`: a worker that ends is replaced by the provisioning
  loop, not restarted in place) and a Secret holding `spec.secret_env`. The Pod names each secret
  variable through `secretKeyRef`; the credential is never a literal value in the Pod.
- The Pod is created first, then the Secret with an ownerReference to the Pod's uid, so the
  garbage collector removes the Secret with its Pod whoever deletes the Pod. Until the Secret
  exists the kubelet holds the container (CreateContainerConfigError, reported as starting).
- Security: the worker runs as root, so that each job runs as a uid of its own (SPEC section 4),
  with every capability dropped but `WORKER_CAPABILITIES` and the runtime's default seccomp
  profile. `allowPrivilegeEscalation` stays unset: Kubernetes documents it as true whenever
  SYS_ADMIN is added (a false would pass today only through a validation bug, kubernetes#119568);
  berth's image has no setuid programs instead (deploy/kubernetes/Dockerfile).
- Labels: the three `base.LABEL_*` on both objects. Label values allow 63 characters of
  `[A-Za-z0-9._-]`, starting and ending alphanumeric; a value that is not one is replaced by a
  cleaned prefix plus the first 10 hex digits of its SHA-256 (`label_value`). The exact values
  are kept in annotations of the same names, which is what `list` reports.
- Object names: `berth-<worker>` when that is a DNS label, else a cleaned prefix plus the same
  hash (`pod_name`); the Secret is `<pod>-credential`. `stop(name)` therefore needs no lookup.
- Connection: without `api_url`, the in-cluster service account, else the kubeconfig
  ($KUBECONFIG or ~/.kube/config, current context). With `api_url`, those credentials are used
  only when they are for that same server; any other URL gets none (an authenticating proxy
  such as `kubectl proxy`), so a token never goes to a server it was not issued for.
"""

import asyncio
import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

import aiohttp
import msgspec
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from service.config import Compute
from service.provisioning.providers.base import (
    LABEL_INSTALLATION,
    LABEL_POOL,
    LABEL_WORKER,
    Instance,
    InstanceState,
    ProviderError,
    WorkerSpec,
)

Manifest = dict[str, Any]
Render = Callable[[WorkerSpec, Compute], tuple[Manifest, Manifest]]

DEFAULT_NAMESPACE = "default"
CONTAINER = "worker"
GPU_RESOURCE = "nvidia.com/gpu"
GRACE_SECONDS = 30  # a deleted pod's SIGTERM before SIGKILL: its worker gives back its jobs
# Waiting reasons the kubelet will not get past by itself: the start failed.
FATAL_WAITING = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
    | {"CreateContainerError", "RunContainerError"}
)

# What a root worker needs for per-job isolation, and nothing else (Docker's default set also
# has FSETID, MKNOD, NET_RAW, SETFCAP, SETPCAP, NET_BIND_SERVICE, SYS_CHROOT and AUDIT_WRITE).
# deploy/kubernetes/README.md lists the same with the same reasons.
WORKER_CAPABILITIES = (
    "CHOWN",  # gives the job its folder, inputs and relay socket (chown to the job's uid)
    "DAC_OVERRIDE",  # reads the job's outputs and removes its folder: the job's uid's, 0700
    "FOWNER",  # removes what a job left in sticky folders of its own when it ends
    "KILL",  # signals the job's processes, which run as another uid
    "SETGID",  # starts the job with its own gid and no supplementary groups
    "SETUID",  # starts the job as its own uid
    "SYS_ADMIN",  # unshare(2) and mount(2): each job's private /tmp, /var/tmp, /dev/shm and IPC
)

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_MAX_NAME = 63

T = TypeVar("T")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def label_value(value: str) -> str:
    """`value` when it is a valid label value, else a cleaned prefix and a hash of it."""
    if len(value) <= _MAX_NAME and _LABEL_VALUE.fullmatch(value):
        return value
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:52].strip("-_.")
    return f"{cleaned}-{_digest(value)}" if cleaned else _digest(value)


def pod_name(worker: str) -> str:
    """The Pod of worker `worker`: `berth-<worker>`, or a cleaned prefix and a hash."""
    name = f"berth-{worker}"
    if len(name) <= _MAX_NAME and _DNS_LABEL.fullmatch(name):
        return name
    cleaned = re.sub(r"[^a-z0-9-]+", "-", worker.lower())[:46].strip("-")
    return f"berth-{cleaned}-{_digest(worker)}" if cleaned else f"berth-{_digest(worker)}"


def secret_name(worker: str) -> str:
    return f"{pod_name(worker)}-credential"


def namespace_of(compute: Compute) -> str:
    return compute.namespace if isinstance(compute.namespace, str) else DEFAULT_NAMESPACE


def manifests(spec: WorkerSpec, compute: Compute) -> tuple[Manifest, Manifest]:
    """The Pod and the Secret (without its ownerReference, which needs the Pod's uid)."""
    if not isinstance(compute.image, str) or not compute.image:
        raise ProviderError("kubernetes: compute.image is required (an image with berth in it)")
    secret = secret_name(spec.name)
    metadata = {
        "namespace": namespace_of(compute),
        "labels": {key: label_value(value) for key, value in spec.labels.items()},
        "annotations": dict(spec.labels),  # exact values; a label may hold only a hash
    }
    env: list[dict[str, Any]] = [
        {"name": key, "value": value} for key, value in spec.plain_env(compute.env).items()
    ]
    env += [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for key in sorted(spec.secret_env)
    ]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": compute.image,
        "command": ["berth", *spec.argv],
        "env": env,
        "securityContext": {
            # Security: root only to hand each job a uid of its own, and only the capabilities
            # that takes (see WORKER_CAPABILITIES and the module docstring).
            "runAsUser": 0,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"], "add": list(WORKER_CAPABILITIES)},
        },
    }
    if resources := _resources(compute):
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
    }
    if isinstance(compute.service_account, str):
        pod_spec["serviceAccountName"] = compute.service_account
    else:
        # The worker never calls the Kubernetes API; a token in its pod would only be
        # something its jobs could read.
        pod_spec["automountServiceAccountToken"] = False
    if isinstance(compute.node_selector, dict):
        pod_spec["nodeSelector"] = dict(compute.node_selector)
    if isinstance(compute.tolerations, list):
        pod_spec["tolerations"] = [
            {k: v for k, v in msgspec.structs.asdict(t).items() if v != ""}
            for t in compute.tolerations
        ]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name(spec.name), **metadata},
        "spec": pod_spec,
    }
    secret_manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": secret, **metadata},
        "type": "Opaque",
        "immutable": True,
        "stringData": dict(spec.secret_env),
    }
    return pod, secret_manifest


def _resources(compute: Compute) -> dict[str, dict[str, str]]:
    amounts = {
        key: value
        for key, value in (("cpu", compute.cpu), ("memory", compute.memory))
        if isinstance(value, str)
    }
    limits = dict(amounts)
    if isinstance(compute.gpus, int) and compute.gpus > 0:
        limits[GPU_RESOURCE] = str(compute.gpus)  # an extended resource: requests = limits
    resources: dict[str, dict[str, str]] = {}
    if amounts:
        resources["requests"] = amounts
    if limits:
        resources["limits"] = limits
    return resources


def owned_by(secret: Manifest, pod: str, uid: str) -> Manifest:
    """`secret` with an ownerReference to the Pod `pod` of uid `uid`."""
    owner = {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}
    return {**secret, "metadata": {**secret["metadata"], "ownerReferences": [owner]}}


def pod_state(pod: Mapping[str, Any]) -> tuple[InstanceState, str]:
    """A Pod (as JSON) -> its state and why, in Kubernetes' words."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    containers = status.get("containerStatuses") or []
    if phase == "Succeeded":
        return InstanceState.STOPPED, _terminated(containers) or "succeeded"
    if phase == "Failed":
        why = _terminated(containers) or _words(status.get("reason"), status.get("message"))
        return InstanceState.FAILED, why or "failed"
    if phase == "Running":
        terminating = (pod.get("metadata") or {}).get("deletionTimestamp")
        return InstanceState.RUNNING, "terminating" if terminating else ""
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in FATAL_WAITING:
            return InstanceState.FAILED, _words(reason, waiting.get("message"))
        if reason:
            return InstanceState.STARTING, _words(reason, waiting.get("message"))
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return InstanceState.STARTING, _words(condition.get("reason"), condition.get("message"))
    if phase == "Unknown":
        return InstanceState.STARTING, _words("Unknown", status.get("message"))
    return InstanceState.STARTING, ""


def _terminated(containers: list[Mapping[str, Any]]) -> str:
    for container in containers:
        ended = (container.get("state") or {}).get("terminated")
        if ended:
            words = _words(ended.get("reason"), ended.get("message"))
            return f"{words} (exit code {ended.get('exitCode')})".strip()
    return ""


def _words(reason: object, message: object) -> str:
    return ": ".join(str(part) for part in (reason, message) if part)


def _reason(exc: ApiException) -> str:
    """The API server's Status message, e.g. `422 Invalid: Pod "x" is invalid: ...`."""
    body: object = exc.body
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    try:
        status = json.loads(body) if isinstance(body, str) else {}
    except json.JSONDecodeError:
        status = {}
    if isinstance(status, dict) and status.get("message"):
        return f"{exc.status} {status.get('reason') or exc.reason}: {status['message']}"
    return f"{exc.status} {exc.reason}"


async def _configuration(api_url: str | None, kubeconfig: Path | None) -> client.Configuration:
    loaded = client.Configuration()
    found = True
    try:
        config.load_incluster_config(client_configuration=loaded)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        try:
            await config.load_kube_config(
                config_file=None if kubeconfig is None else str(kubeconfig),
                client_configuration=loaded,
                persist_config=False,  # never write refreshed tokens into the user's file
            )
        except (config.ConfigException, OSError):
            found = False
    if api_url is None:
        if not found:
            raise ProviderError(
                "kubernetes: no credentials: not running in a cluster and no kubeconfig "
                "($KUBECONFIG or ~/.kube/config); set compute.api_url"
            )
        return loaded
    if found and (loaded.host or "").rstrip("/") == api_url.rstrip("/"):
        return loaded
    return client.Configuration(host=api_url)


class KubernetesProvider:
    """A Pod per worker in `compute.namespace`.

    `kubeconfig` replaces $KUBECONFIG or ~/.kube/config; `render` replaces `manifests` (tests).
    """

    def __init__(
        self,
        compute: Compute,
        *,
        kubeconfig: Path | None = None,
        render: Render = manifests,
    ) -> None:
        self._compute = compute
        self._kubeconfig = kubeconfig
        self._namespace = namespace_of(compute)
        self._api_url = compute.api_url if isinstance(compute.api_url, str) else None
        self._render = render
        self._api: client.ApiClient | None = None
        self._connecting = asyncio.Lock()

    async def _core(self) -> client.CoreV1Api:
        async with self._connecting:
            if self._api is None:
                try:
                    configuration = await _configuration(self._api_url, self._kubeconfig)
                except ProviderError:
                    raise
                except Exception as exc:
                    # A kubeconfig can fail in many ways (YAML, exec plugins, files it names);
                    # each is a reason to show in `pool list`, not a crash of the loop.
                    raise ProviderError(f"kubernetes: cannot load credentials: {exc}") from None
                self._api = client.ApiClient(configuration)
            return client.CoreV1Api(self._api)

    async def _call(
        self, what: str, call: Awaitable[T], *, ok: frozenset[int] = frozenset()
    ) -> T | None:
        """Await `call`; a status in `ok` gives None, any other failure a ProviderError."""
        try:
            return await call
        except ApiException as exc:
            if exc.status in ok:
                return None
            raise ProviderError(f"kubernetes: {what}: {_reason(exc)}") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            where = self._api_url or "the API server"
            raise ProviderError(f"kubernetes: {what}: cannot reach {where}: {exc}") from None
        except config.ConfigException as exc:  # a credential refresh (exec plugin, OIDC) failed
            raise ProviderError(f"kubernetes: {what}: credentials: {exc}") from None

    async def start(self, spec: WorkerSpec) -> Instance:
        pod, secret = self._render(spec, self._compute)
        name = pod["metadata"]["name"]
        core = await self._core()
        ns = self._namespace
        created = await self._call(
            f"create pod {name}",
            # The generated client serialises a dict body as it is: what was validated is sent.
            core.create_namespaced_pod(ns, cast("client.V1Pod", pod), field_validation="Strict"),
            ok=frozenset({409}),
        )
        made = created is not None
        if not made:  # it exists: adopt it if it is this installation's worker
            created = await self._call(f"read pod {name}", core.read_namespaced_pod(name, ns))
        assert created is not None
        existing = self._json(created)
        meta = existing.get("metadata") or {}
        owner = (meta.get("annotations") or {}).get(LABEL_INSTALLATION)
        if owner != spec.installation:
            raise ProviderError(
                f"kubernetes: pod {ns}/{name} exists and is not this installation's worker "
                f"(installation {owner!r})"
            )
        try:
            await self._call(
                f"create secret {secret['metadata']['name']}",
                core.create_namespaced_secret(
                    ns,
                    cast("client.V1Secret", owned_by(secret, name, meta["uid"])),
                    field_validation="Strict",
                ),
                ok=frozenset({409}),  # a retried start: the credential is already there
            )
        except ProviderError:
            # A pod made now without its credential would wait for it forever: take it back.
            # One adopted is left alone: it may be running on the credential it already had.
            if made:
                await self._delete_pod(core, name)
            raise
        return self._instance(existing)

    async def stop(self, name: str) -> None:
        core = await self._core()
        await self._delete_pod(core, pod_name(name))
        # The garbage collector would delete it with the pod; deleting it now frees the
        # credential at once, and keeps a cluster without the collector clean.
        await self._call(
            f"delete secret {secret_name(name)}",
            core.delete_namespaced_secret(secret_name(name), self._namespace),
            ok=frozenset({404}),
        )

    async def _delete_pod(self, core: client.CoreV1Api, pod: str) -> None:
        await self._call(
            f"delete pod {pod}",
            core.delete_namespaced_pod(pod, self._namespace, grace_period_seconds=GRACE_SECONDS),
            ok=frozenset({404}),
        )

    async def list(self, *, installation: str, pool: str | None = None) -> list[Instance]:
        selector = f"{LABEL_INSTALLATION}={label_value(installation)}"
        if pool is not None:
            selector += f",{LABEL_POOL}={label_value(pool)}"
        core = await self._core()
        found = await self._call(
            "list pods", core.list_namespaced_pod(self._namespace, label_selector=selector)
        )
        assert found is not None
        pods = self._json(found).get("items") or []
        # A label may hold a hash; the annotation holds the exact installation.
        return [
            self._instance(pod)
            for pod in pods
            if _annotation(pod, LABEL_INSTALLATION) in {installation, None}
        ]

    def _json(self, model: object) -> dict[str, Any]:
        assert self._api is not None
        return cast("dict[str, Any]", self._api.sanitize_for_serialization(model))

    @staticmethod
    def _instance(pod: Mapping[str, Any]) -> Instance:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        state, detail = pod_state(pod)
        return Instance(
            name=_annotation(pod, LABEL_WORKER) or labels.get(LABEL_WORKER, ""),
            pool=_annotation(pod, LABEL_POOL) or labels.get(LABEL_POOL, ""),
            provider_id=meta.get("name", ""),
            state=state,
            detail=detail,
        )

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None


def _annotation(pod: Mapping[str, Any], key: str) -> str | None:
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(key)
    return value if isinstance(value, str) else None
