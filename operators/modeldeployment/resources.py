"""The objects a ModelDeployment owns: engine Deployment(s), Service(s), PDB.

A canary is a deployment of its own (`<model>-canary`): its own Deployment,
headless Service and so router pool, so the gateway splits traffic between
the two by weight (routes.py) and billing prices each.

Pure builders from the owner's metadata and its defaulted spec; the handlers
apply them. The main Deployment's replicas are the autoscaler's
(replicas_only, applied under a field manager of its own).
"""

import json

from maas_operator.modeldeployment.adapter_spec import adapters
from maas_operator.modeldeployment.crd_schema import GROUP, KIND, VERSION
from maas_operator.modeldeployment.engine_args import engine_args
from maas_operator.modeldeployment.lora_modules_configmap import lora_modules_env
from maas_operator.modeldeployment.model_source import ModelMount, model_mount, with_adapter_claims
from maas_operator.modeldeployment.spec import track_model_id
from maas_operator.modeldeployment.vllm_pod import (
    ADAPTER_RESOURCES,
    DEFAULT_VLLM_IMAGE,
    STARTUP_SECONDS,
    adapter_args,
    api_key_env,
    vllm_container,
)
from maas_services.common.defaults import ENGINE_PORT, METRICS_PORT

OWNER_LABEL = "maas.io/model-deployment"
TRACK_LABEL = "maas.io/track"  # main or canary
# The ReplicaSet controller removes the pod with the lowest cost first.
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
RUN_AS = 10001
# Beyond the drain timeout, time for the engine to exit after its grace ends.
EXIT_MARGIN_SECONDS = 15
# Writable in every engine container (the root is read-only): MAAS_CACHE_DIR, vLLM's caches.
CACHE_DIR = "/var/cache/maas"
# A native engine's OpenAI HTTP front (services/engine/http_front), where an
# InferencePool points (docs/gie.md): vLLM's port, which a vLLM pod's server also uses.
ENGINE_HTTP_PORT = 8000


def names(name: str) -> dict[str, str]:
    return {
        "deployment": f"{name}-engine",
        "canary": f"{name}-engine-canary",
        "service": f"{name}-engine",
        "canary_service": f"{name}-engine-canary",
        "pdb": f"{name}-engine",
    }


def selector(name: str, track: str = "main") -> dict[str, str]:
    return {OWNER_LABEL: name, TRACK_LABEL: track}


def selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(name).items())


def owner_reference(owner: dict) -> dict:
    meta = owner["metadata"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(owner: dict, name: str, labels: dict, annotations: dict | None = None) -> dict:
    meta = {
        "name": name,
        "namespace": owner["metadata"]["namespace"],
        "labels": labels,
        "ownerReferences": [owner_reference(owner)],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def _labels(owner: dict, spec: dict, track: str, version: str) -> dict:
    name = owner["metadata"]["name"]
    return {
        "app.kubernetes.io/name": "maas-engine",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "engine",
        "app.kubernetes.io/managed-by": "maas-operator",
        "maas.io/model": track_model_id(name, spec, track),
        "maas.io/version": version,
        **selector(name, track),
    }


def _container_resources(resources: dict) -> dict:
    requests = dict(resources.get("requests") or {})
    limits = dict(resources.get("limits") or {})
    if resources["gpus"]:
        # Extended resources must have requests equal to limits.
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(resources["gpus"])
    out = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _grpc_probe(period: int, failures: int) -> dict:
    return {"grpc": {"port": ENGINE_PORT}, "periodSeconds": period, "failureThreshold": failures}


def _service_token_env(token_secret: str) -> list[dict]:
    """The token callers must show (maas_services.common.service_token), from the Secret
    of that name in the engine's own namespace (the chart puts one in each it manages)."""
    if not token_secret:
        return []
    ref = {"secretKeyRef": {"name": token_secret, "key": "service-token"}}
    return [{"name": "MAAS_SERVICE_TOKEN", "valueFrom": ref}]


def _containers(
    owner: dict,
    spec: dict,
    model_id: str,
    mount: ModelMount,
    image: str,
    token_secret: str,
    vllm_image: str,
) -> list[dict]:
    """The engine container, and for backend vllm the vLLM server it fronts."""
    drain_timeout = spec["autoscaling"]["drainTimeoutSeconds"]
    engine = spec["engine"]
    vllm = engine["backend"] == "vllm"
    if vllm:
        args = adapter_args(model_id, mount.model_path, engine, drain_timeout, spec.get("serves"))
        resources = ADAPTER_RESOURCES
    else:
        args = engine_args(model_id, mount.model_path, engine, drain_timeout, spec.get("serves"))
        resources = _container_resources(spec["resources"])
    container = {
        "name": "engine",
        "image": image,
        "args": args,
        "env": [
            {"name": "MAAS_ENGINE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "MAAS_LOG_FORMAT", "value": "json"},
            # Writable caches (torch, triton) under a writable mount.
            {"name": "HOME", "value": "/tmp"},
            # Derived model files and compiled kernels: a restart of the container reuses them.
            {"name": "MAAS_CACHE_DIR", "value": CACHE_DIR},
            *_service_token_env(token_secret),
            *(api_key_env(token_secret) if vllm else []),
            *([] if vllm else [{"name": "MAAS_HTTP_PORT", "value": str(ENGINE_HTTP_PORT)}]),
            *lora_modules_env(owner["metadata"]["name"], spec),
        ],
        "ports": [
            {"name": "grpc", "containerPort": ENGINE_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
            *([] if vllm else [{"name": "http", "containerPort": ENGINE_HTTP_PORT}]),
        ],
        # Loading weights takes minutes: the startup probe allows 20 (a vLLM
        # server's start more) before liveness applies.
        "startupProbe": _grpc_probe(10, STARTUP_SECONDS // 10 if vllm else 120),
        "readinessProbe": _grpc_probe(5, 2),
        "livenessProbe": _grpc_probe(10, 6),
        "resources": resources,
    }
    containers = [container]
    if vllm:
        server = vllm_container(spec, vllm_image, model_id, mount, CACHE_DIR)
        server["env"] += api_key_env(token_secret)
        server["resources"] = _container_resources(spec["resources"])
        containers.append(server)
    return [
        {
            **c,
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
            "volumeMounts": [
                {"name": "tmp", "mountPath": "/tmp"},
                {"name": "dshm", "mountPath": "/dev/shm"},
                {"name": "cache", "mountPath": CACHE_DIR},
                *(dict(m) for m in mount.volume_mounts),
            ],
        }
        for c in containers
    ]


def pod_template(
    owner: dict,
    spec: dict,
    image: str,
    track: str,
    version: str,
    token_secret: str = "",
    vllm_image: str = DEFAULT_VLLM_IMAGE,
) -> dict:
    drain_timeout = spec["autoscaling"]["drainTimeoutSeconds"]
    mount = with_adapter_claims(
        model_mount(spec["model"]["source"]), [a.uri for a in adapters(spec)]
    )
    resources = spec["resources"]
    pod_spec = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": drain_timeout + EXIT_MARGIN_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": _containers(
            owner,
            spec,
            track_model_id(owner["metadata"]["name"], spec, track),
            mount,
            image,
            token_secret,
            vllm_image,
        ),
        "volumes": [
            {"name": "tmp", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            {"name": "cache", "emptyDir": {}},
            *mount.volumes,
        ],
    }
    if mount.init_containers:
        pod_spec["initContainers"] = mount.init_containers
    if resources.get("nodeSelector"):
        pod_spec["nodeSelector"] = resources["nodeSelector"]
    if resources.get("tolerations"):
        pod_spec["tolerations"] = resources["tolerations"]
    if resources.get("affinity"):
        pod_spec["affinity"] = resources["affinity"]
    return {
        "metadata": {
            "labels": _labels(owner, spec, track, version),
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(METRICS_PORT),
            },
        },
        "spec": pod_spec,
    }


def deployment(
    owner: dict,
    spec: dict,
    image: str,
    replicas: int,
    track: str = "main",
    token_secret: str = "",
    vllm_image: str = DEFAULT_VLLM_IMAGE,
) -> dict:
    name = owner["metadata"]["name"]
    version = spec["canary"]["version"] if track == "canary" else spec["version"]
    image = (spec["canary"].get("image") or image) if track == "canary" else image
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(
            owner,
            names(name)["canary" if track == "canary" else "deployment"],
            _labels(owner, spec, track, version),
        ),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector(name, track)},
            # Surge, never cut: a new pod is ready before an old one drains away.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": pod_template(owner, spec, image, track, version, token_secret, vllm_image),
        },
    }


def replicas_only(owner: dict, replicas: int) -> dict:
    """The autoscaler's applied configuration: the main Deployment's replicas, nothing else."""
    meta = owner["metadata"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": names(meta["name"])["deployment"], "namespace": meta["namespace"]},
        "spec": {"replicas": replicas},
    }


def service(owner: dict, spec: dict, track: str = "main") -> dict:
    name = owner["metadata"]["name"]
    canary = track == "canary"
    # Routing intent for the router's Kubernetes discovery.
    annotations = {
        "maas.io/routing-policy": spec["routing"]["policy"],
        "maas.io/routing-weights": json.dumps(spec["routing"].get("weights") or {}, sort_keys=True),
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(
            owner,
            names(name)["canary_service" if canary else "service"],
            _labels(owner, spec, track, spec["canary"]["version"] if canary else spec["version"]),
            annotations,
        ),
        "spec": {
            # Headless: the router talks to each replica, never to a virtual IP.
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": selector(name, track),
            "ports": [
                {"name": "grpc", "port": ENGINE_PORT, "targetPort": "grpc"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"},
            ],
        },
    }


def pod_disruption_budget(owner: dict, spec: dict) -> dict:
    name = owner["metadata"]["name"]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(
            owner, names(name)["pdb"], _labels(owner, spec, "main", spec["version"])
        ),
        # One replica at a time for node drains; each one drains itself on SIGTERM.
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {OWNER_LABEL: name}}},
    }


def canary_wanted(spec: dict) -> bool:
    return bool(spec["canary"].get("version")) and spec["canary"]["weight"] > 0
