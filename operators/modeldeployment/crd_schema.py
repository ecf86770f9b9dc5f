"""The ModelDeployment CRD's OpenAPI v3 schema: the one source of its shape.

The chart's CRD YAML is generated from here (`make crd`, checked fresh by a
test), and the operator and `maas operator simulate` apply the same defaults,
so a spec means the same thing in the API server, the operator and the
simulator.
"""

from typing import Any

from maas_services.common.block_hash import BLOCK_SIZE
from maas_services.common.defaults import (
    MAX_CPU_LORAS,
    MAX_LORA_RANK,
    MAX_LORAS,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
)
from maas_services.common.quantization_methods import QUANTIZATION_METHODS
from maas_services.common.routing_policies import (
    DEFAULT_ROUTING_POLICY,
    ROUTING_POLICIES,
    SCORER_NAMES,
)
from maas_services.common.serves import DEFAULT_SERVES, KINDS

# What `maas serve engine --backend` takes; the first is the default.
ENGINE_BACKENDS = ("native", "vllm")

GROUP = "maas.io"
VERSION = "v1alpha1"
KIND = "ModelDeployment"
PLURAL = "modeldeployments"
SINGULAR = "modeldeployment"
# Not `md`: Cluster API's MachineDeployment has it, and a cluster with both would
# answer `kubectl get md` with whichever CRD the discovery cache lists first.
# `mdep` is not a short name of Cluster API, Knative, KServe, Istio, Seldon (`sdep`),
# KubeRay, Kubeflow or Argo.
SHORT_NAMES = ["mdep"]

Schema = dict[str, Any]

# A Kubernetes quantity as the engine understands it (bytes, binary or decimal suffix).
QUANTITY_PATTERN = r"^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$"
# file:// is inside the image, pvc://CLAIM/PATH on a volume, http(s):// and s3:// are fetched.
SOURCE_PATTERN = r"^(file:///|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/|https?://|s3://).+"
# An adapter is loaded into running replicas, where no init container can fetch
# it any more: only what a pod already sees (the image, a model-store claim).
ADAPTER_SOURCE_PATTERN = r"^(file:///|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/).+"
# A name tenants send as `model`, a label value in metrics and billing: DNS-1123-like.
ADAPTER_NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$"
MAX_ADAPTERS = 64
PRELOAD, ON_DEMAND = "preload", "on-demand"
# The engine's own LoRA limits when the spec sets none; a vLLM server is given the same.
ENGINE_LORA_DEFAULTS = {
    "maxLoras": MAX_LORAS,
    "maxLoraRank": MAX_LORA_RANK,
    "maxCpuLoras": MAX_CPU_LORAS,
}
# The ranks vLLM's LoRA config accepts for --max-lora-rank.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _int(default: int | None = None, minimum: int | None = None, maximum: int | None = None, **kw):
    schema: Schema = {"type": "integer", **kw}
    if default is not None:
        schema["default"] = default
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def _num(default: float, minimum: float, maximum: float, description: str) -> Schema:
    return {
        "type": "number",
        "default": default,
        "minimum": minimum,
        "maximum": maximum,
        "description": description,
    }


def _str(description: str, **kw) -> Schema:
    return {"type": "string", "description": description, **kw}


def _obj(properties: dict[str, Schema], description: str = "", **kw) -> Schema:
    schema: Schema = {"type": "object", "properties": properties, **kw}
    if description:
        schema["description"] = description
    # Every nested object gets `{}` as its default so the API server fills
    # the nested defaults even when the user omits the whole block.
    schema.setdefault("default", {})
    return schema


def _string_map(description: str) -> Schema:
    return {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "description": description,
    }


MODEL = _obj(
    {
        "name": _str(
            "model id clients ask for (the engine's --model-id); defaults to the resource name",
            pattern=r"^[a-zA-Z0-9][a-zA-Z0-9._-]*$",
            maxLength=128,
        ),
        "source": _obj(
            {
                "uri": _str(
                    "where the weights are: file:///PATH baked in the image, "
                    "pvc://CLAIM/PATH on a volume, https://URL or s3://BUCKET/KEY fetched "
                    "by an init container; omitted = the SmolLM2 GGUF bundled in the image",
                    pattern=SOURCE_PATTERN,
                ),
                "fetchImage": _str("image of the init container that fetches http(s)/s3 URIs"),
                "credentialsSecret": _str(
                    "Secret whose keys become the fetch container's environment "
                    "(AWS_ACCESS_KEY_ID, ...)"
                ),
            }
        ),
    },
    "which model to serve",
)

ENGINE = _obj(
    {
        "dtype": _str(
            "weights and activations dtype",
            enum=["auto", "float32", "bfloat16", "float16"],
            default="auto",
        ),
        "maxModelLen": _int(0, 0, description="context length cap; 0 = the model's own"),
        "kvCacheMemory": _str(
            "bytes for the KV cache (quantity, e.g. 8Gi); 0 = derive from memory utilization",
            pattern=QUANTITY_PATTERN,
            default="0",
        ),
        "gpuMemoryUtilization": _num(0.9, 0.05, 1.0, "fraction of device memory to use"),
        "maxNumSeqs": _int(MAX_NUM_SEQS, 1, 4096, description="sequences in one batch at most"),
        "maxNumBatchedTokens": _int(
            MAX_NUM_BATCHED_TOKENS, 16, description="tokens computed per step"
        ),
        "blockSize": _int(BLOCK_SIZE, 1, 256, description="tokens per KV-cache block"),
        # Enums from services/common, which the engine and the router read too: no drift.
        "quantization": _str(
            "weight-only quantization of the decoder's linear layers",
            enum=list(QUANTIZATION_METHODS),
            default="none",
        ),
        "prefixCacheSharing": _str(
            "tenant = a request hits only its own tenant's cached prefixes; global = "
            "requests the gateway's routing table marks share_prefix_cache share theirs "
            "across tenants, for public system prompts (a hit shows in cached_tokens)",
            enum=["tenant", "global"],
            default="tenant",
        ),
        "speculative": _obj(
            {
                "method": _str(
                    "speculative decoding proposer", enum=["none", "ngram", "draft"], default="none"
                ),
                "numTokens": _int(4, 1, 16, description="tokens proposed per step"),
                "draftModel": _str("draft model path, for method=draft"),
            },
            "speculative decoding",
        ),
        "extraArgs": {
            "type": "array",
            "items": {"type": "string"},
            "description": "passed verbatim to `maas serve engine` (backend vllm: the adapter)",
        },
        "backend": _str(
            "native = our engine; vllm = a vLLM server in the pod behind the maas adapter, "
            "which the router and gateway talk to as to a native engine",
            enum=list(ENGINE_BACKENDS),
            default=ENGINE_BACKENDS[0],
        ),
        "knownAnswerPerplexity": {
            "type": "number",
            "minimum": 1,
            "description": "the model's float32 reference perplexity on the engine's start-up "
            "known-answer texts (`python -m maas_services.engine.known_answer_reference MODEL`); "
            "a replica that scores more than the engine's --known-answer-tolerance (5%) off "
            "it stays not ready. Absent: only a sanity bound (docs/engine.md)",
        },
        "enforceEager": {
            "type": "boolean",
            "default": False,
            "description": "true = never compile the forward (a faster start): "
            "--enforce-eager to our engine and to vLLM; false = each engine's own default "
            "(vLLM compiles; ours runs eagerly, compiling with --no-enforce-eager in extraArgs)",
        },
        # No schema defaults: a flag goes to the engine only when the spec sets it
        # (engine_args.py), so a spec without adapters runs on any engine build.
        "maxLoras": _int(
            minimum=0,
            maximum=256,
            description="adapters one engine step may compute with; 0 = no adapters; "
            f"absent = the engine's {ENGINE_LORA_DEFAULTS['maxLoras']} (--max-loras)",
        ),
        "maxLoraRank": _int(
            minimum=1,
            maximum=512,
            description="adapters of a higher rank are refused at load (AdaptersReady "
            f"says so); absent = {ENGINE_LORA_DEFAULTS['maxLoraRank']} (--max-lora-rank)",
        ),
        "maxCpuLoras": _int(
            minimum=1,
            maximum=1024,
            description="adapters an engine keeps loaded, at least maxLoras; beyond it idle "
            "on-demand ones are unloaded, least recently used first; absent = "
            f"{ENGINE_LORA_DEFAULTS['maxCpuLoras']} (--max-cpu-loras)",
        ),
        "vllm": _obj(
            {
                "image": _str(
                    "vLLM server image; defaults to the operator's --vllm-image "
                    "(the chart's engine.vllm.image)"
                ),
                "args": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "passed verbatim to vLLM's OpenAI server after the "
                    "operator's own flags (e.g. --max-lora-rank=64)",
                },
                "env": _string_map("extra environment of the vLLM container (VLLM_* settings)"),
            },
            "the vLLM container, for backend vllm; the engine fields above map to vLLM's flags",
        ),
    },
    "engine arguments",
    **{
        "x-kubernetes-validations": [
            {
                "rule": "self.backend != 'vllm' || "
                "(self.quantization == 'none' && self.speculative.method == 'none')",
                "message": "quantization and speculative are the native engine's; "
                "give vLLM its own in vllm.args",
            },
            {
                "rule": "(has(self.maxCpuLoras) ? self.maxCpuLoras : "
                f"{ENGINE_LORA_DEFAULTS['maxCpuLoras']}) >= "
                f"(has(self.maxLoras) ? self.maxLoras : {ENGINE_LORA_DEFAULTS['maxLoras']})",
                "message": "maxCpuLoras counts the adapters in use too: at least maxLoras",
            },
            {
                "rule": "self.backend != 'vllm' || !has(self.maxLoraRank) || "
                f"self.maxLoraRank in {list(VLLM_LORA_RANKS)}",
                "message": "vLLM takes a maxLoraRank of "
                + ", ".join(str(r) for r in VLLM_LORA_RANKS),
            },
        ]
    },
)

TOLERATION = {
    "type": "object",
    "properties": {
        "key": {"type": "string"},
        "operator": {"type": "string", "enum": ["Exists", "Equal"]},
        "value": {"type": "string"},
        "effect": {"type": "string", "enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
        "tolerationSeconds": {"type": "integer"},
    },
}

RESOURCES = _obj(
    {
        "gpus": _int(0, 0, 16, description="nvidia.com/gpu per replica"),
        "requests": _string_map("container requests, e.g. {cpu: '2', memory: 8Gi}"),
        "limits": _string_map("container limits"),
        "nodeSelector": _string_map("pod nodeSelector"),
        "tolerations": {"type": "array", "items": TOLERATION},
        "affinity": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
    "what one replica needs and where it may run",
)

REPLICAS = _obj(
    {
        "min": _int(1, 0, 1000, description="never fewer replicas (kubectl scale sets this)"),
        "max": _int(4, 1, 1000, description="never more replicas"),
    },
    "hard bounds for the autoscaler",
    **{
        "x-kubernetes-validations": [
            {"rule": "self.min <= self.max", "message": "min must not exceed max"}
        ]
    },
)

AUTOSCALING = _obj(
    {
        "queueCapacityPerReplica": _int(
            32, 1, description="waiting requests one replica absorbs before it is 'full'"
        ),
        "prewarmWatermark": _num(0.6, 0.01, 1.0, "utilisation that starts one more replica"),
        "scaleOutWatermark": _num(0.9, 0.01, 10.0, "utilisation that scales out at once"),
        "scaleInWatermark": _num(0.3, 0.0, 1.0, "utilisation under which replicas drain"),
        "stabilizationSeconds": _int(
            300, 0, description="how long utilisation must stay low before one replica drains"
        ),
        "cooldownSeconds": _int(60, 0, description="minimum time between pre-warm steps"),
        "drainTimeoutSeconds": _int(
            600, 1, description="remove a draining replica after this even if requests remain"
        ),
        "scaleToZeroAfterSeconds": _int(
            600,
            1,
            description="with replicas.min 0: remove the last replica after this long "
            "with no request; the gateway holds the next one while a replica starts",
        ),
    },
    "watermark autoscaling on queue depth",
    **{
        "x-kubernetes-validations": [
            {
                "rule": "self.scaleInWatermark < self.prewarmWatermark && "
                "self.prewarmWatermark <= self.scaleOutWatermark",
                "message": "need scaleInWatermark < prewarmWatermark <= scaleOutWatermark",
            }
        ]
    },
)

ROUTING = _obj(
    {
        "policy": _str(
            "how the router picks a replica",
            enum=sorted(ROUTING_POLICIES),
            default=DEFAULT_ROUTING_POLICY,
        ),
        "weights": {
            "type": "object",
            "additionalProperties": {"type": "number", "minimum": 0},
            # Bounds the CEL rule's cost, which the API server estimates at install.
            "maxProperties": len(SCORER_NAMES),
            "description": "scorer weights over the policy's, by scorer name: "
            + ", ".join(sorted(SCORER_NAMES))
            + "; 0 turns a scorer off",
            # A misspelt scorer would otherwise be dropped by the router in silence.
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(name, name in {sorted(SCORER_NAMES)!r})",
                    "message": f"unknown scorer; choose from {', '.join(sorted(SCORER_NAMES))}",
                }
            ],
        },
    },
    "router policy for this model",
)

CANARY = _obj(
    {
        "version": _str("version label of the canary replicas", maxLength=63),
        "image": _str("engine image of the canary; defaults to the main image"),
        "weight": _int(0, 0, 100, description="percent of traffic for the canary"),
    },
    "a one-replica canary beside the main replicas",
)

# No schema default: it depends on the backend (DEFAULT_SERVES), which the
# engine applies itself when the operator passes no --serves.
SERVES = {
    "type": "array",
    "minItems": 1,
    "maxItems": len(KINDS),
    "x-kubernetes-list-type": "set",
    "items": {"type": "string", "enum": list(KINDS)},
    "description": "what the replicas serve: generate (completions, chat, responses), "
    "embed (/v1/embeddings), or both; absent = "
    + "; ".join(f"{backend}: {', '.join(kinds)}" for backend, kinds in DEFAULT_SERVES.items())
    + " (the gateway answers 400 to a request of a kind the model does not serve)",
}

ADAPTER = {
    "type": "object",
    "required": ["name", "source"],
    "properties": {
        "name": _str(
            "the name tenants send as `model` (the engines' adapter name); not the "
            "model's id or an alias",
            pattern=ADAPTER_NAME_PATTERN,
            maxLength=63,
        ),
        "source": {
            "type": "object",
            "required": ["uri"],
            "description": "the PEFT folder (adapter_config.json + adapter_model.safetensors)",
            "properties": {
                "uri": _str(
                    "file:///PATH in the image, or pvc://CLAIM/PATH on a model-store claim "
                    "(mounted as a model's is; a claim no pod mounts yet rolls the pods once)",
                    pattern=ADAPTER_SOURCE_PATTERN,
                    maxLength=1024,
                ),
            },
        },
        "tenants": {
            "type": "array",
            "maxItems": 256,
            "x-kubernetes-list-type": "set",
            "items": {"type": "string", "minLength": 1, "maxLength": 128},
            "description": "tenants who may use it; empty = every tenant (another tenant "
            "gets 404 model_not_found, as for a model that does not exist)",
        },
        "load": _str(
            "preload = the operator loads it onto every replica (at start and as the "
            "spec changes); on-demand = loaded onto the replica a request lands on",
            enum=[PRELOAD, ON_DEMAND],
            default=PRELOAD,
        ),
    },
}

ADAPTERS = {
    "type": "array",
    "maxItems": MAX_ADAPTERS,
    # The API server refuses two adapters of one name.
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["name"],
    "items": ADAPTER,
    "description": "LoRA adapters served on this model's replicas, each under its own name "
    "(docs/operator.md, Adapters)",
}

SPEC = {
    "type": "object",
    # Rules across spec.engine and the fields a vLLM pod needs elsewhere.
    "x-kubernetes-validations": [
        {
            "rule": "self.engine.backend != 'vllm' || has(self.model.source.uri)",
            "message": "backend vllm needs model.source.uri: the bundled model is only in "
            "the maas image",
        },
        {
            "rule": "self.engine.backend != 'vllm' || self.resources.gpus > 0 || "
            "self.engine.kvCacheMemory != '0'",
            "message": "backend vllm on CPU needs engine.kvCacheMemory, or vLLM reserves "
            "most of the node's memory",
        },
        {
            "rule": "self.engine.backend != 'vllm' || !has(self.serves) || size(self.serves) == 1",
            "message": "a vLLM server runs its generation runner or its pooling runner, "
            "not both: serves is [generate] or [embed]",
        },
        {
            "rule": "!has(self.adapters) || size(self.adapters) == 0 || "
            "!has(self.engine.maxLoras) || self.engine.maxLoras > 0",
            "message": "adapters need engine.maxLoras above 0 (0 serves no adapters)",
        },
        {
            "rule": "!has(self.adapters) || size(self.adapters.filter(a, a.load == "
            f"'{PRELOAD}')) <= (has(self.engine.maxCpuLoras) ? self.engine.maxCpuLoras : "
            f"{ENGINE_LORA_DEFAULTS['maxCpuLoras']})",
            "message": "more preload adapters than engine.maxCpuLoras: an engine could not "
            "hold them all",
        },
    ],
    "properties": {
        "model": MODEL,
        "image": _str("engine image; defaults to the operator's --engine-image"),
        "version": _str("version label of the main replicas", default="v1", maxLength=63),
        "engine": ENGINE,
        "resources": RESOURCES,
        "replicas": REPLICAS,
        "autoscaling": AUTOSCALING,
        "routing": ROUTING,
        "canary": CANARY,
        "serves": SERVES,
        # Routes in the gateway: each alias splits between the model and its canary.
        "aliases": {
            "type": "array",
            "maxItems": 16,
            "description": "more names tenants may send for this model (the gateway's routes)",
            "items": {
                "type": "string",
                "pattern": r"^[a-zA-Z0-9][a-zA-Z0-9._-]*$",
                "maxLength": 128,
            },
        },
        "adapters": ADAPTERS,
    },
}

CONDITION = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": {
            "type": "string",
            "enum": [
                "Ready",
                "Available",
                "Progressing",
                "ScalingLimited",
                "ModelIdConflict",
                "Synced",
                "AdaptersReady",
            ],
        },
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string"},
        "message": {"type": "string"},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "observedGeneration": {"type": "integer"},
    },
}

STATUS = {
    "type": "object",
    "properties": {
        "replicas": {"type": "integer", "description": "engine pods that exist"},
        "readyReplicas": {"type": "integer", "description": "replicas taking requests"},
        "desiredReplicas": {"type": "integer", "description": "the autoscaler's target"},
        "queueDepth": {"type": "integer", "description": "waiting requests in the pool"},
        "utilization": {"type": "number", "description": "queue depth / ready capacity"},
        "lastScaleTime": {"type": "string", "format": "date-time"},
        "lastAction": {"type": "string", "description": "the autoscaler's last decision"},
        "selector": {"type": "string", "description": "engine pods' label selector"},
        "canaryWeight": {
            "type": "integer",
            "description": "percent of traffic routed to the canary",
        },
        "scaledToZero": {
            "type": "boolean",
            "description": "no replica asked for; requests are held",
        },
        "heldRequests": {"type": "integer", "description": "requests gateways hold for a replica"},
        "coldStartSeconds": {
            "type": "number",
            "description": "the last start from zero, in seconds",
        },
        "observedGeneration": {"type": "integer"},
        "conditions": {"type": "array", "items": CONDITION},
        "adapters": {
            "type": "array",
            "description": "each adapter of the spec (and one being removed), and the "
            "replicas it is loaded on (adapter_sync.py)",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "source": {"type": "string", "description": "the folder the engines load"},
                    "load": {"type": "string"},
                    "state": {
                        "type": "string",
                        "enum": ["Loaded", "Loading", "OnDemand", "Failed", "Unloading"],
                    },
                    "replicas": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "the replicas (pods) that report it loaded",
                    },
                    "reason": {"type": "string"},
                    "message": {"type": "string"},
                    "lastFailureTime": {"type": "string", "format": "date-time"},
                },
            },
        },
        # The autoscaler's memory lives in status so an operator restart
        # resumes a stabilisation window or a drain instead of forgetting it.
        "autoscaler": {
            "type": "object",
            "properties": {
                "lowSince": {"type": "string", "format": "date-time"},
                "idleSince": {"type": "string", "format": "date-time"},
                "coldStartSince": {"type": "string", "format": "date-time"},
                "drain": {
                    "type": "object",
                    "properties": {
                        "endpointId": {"type": "string"},
                        "address": {"type": "string"},
                        "pod": {"type": "string"},
                        "startedAt": {"type": "string", "format": "date-time"},
                    },
                },
            },
        },
    },
}

OPENAPI_SCHEMA = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": SPEC,
        "status": STATUS,
    },
    "required": ["spec"],
}
