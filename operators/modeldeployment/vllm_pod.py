"""The engine pod of a `backend: vllm` ModelDeployment: vLLM's server beside the maas adapter.

The adapter (`maas serve engine --backend vllm`) is the container named
`engine`, on the ports and probes of a native engine, so the Service, the
router, the gateway and the autoscaler's drain see no difference. vLLM serves
the adapter alone: its HTTP port and KV-event publisher are in no Service, and
the chart's NetworkPolicy admits only the gRPC and metrics ports (vLLM binds
every address: the kubelet's probe comes to the pod's IP, and its publisher
binds only a wildcard). On SIGTERM the
adapter drains while vLLM's preStop hook holds vLLM up until the adapter has
exited, so the streams it finishes still have a server.

vLLM demands a key on its API (VLLM_API_KEY, from the release's Secret,
key `vllm-api-key`); the adapter reads the same variable and is the only
other holder, so a pod that reaches vLLM's port past the NetworkPolicy gets 401.

On a CPU node vLLM never runs eager bf16 (services/common/vllm_cpu_mode.py:
wrong on AMX, and the node's CPU is not known here), and the adapter checks
vLLM's answers before it reports ready (--known-answer: the spec's
knownAnswerPerplexity, else the sanity bound).

The spec's engine fields become vLLM's flags of the same meaning; what only
vLLM knows goes in `engine.vllm.args` and `engine.vllm.env`, within the
admission allow-list (vllm_allowlist.py).
"""

import json
import math

from maas_operator.modeldeployment.adapter_spec import lora_wanted
from maas_operator.modeldeployment.crd_schema import ENGINE_LORA_DEFAULTS
from maas_operator.modeldeployment.engine_args import (
    common_args,
    known_answer_args,
    lora_args,
    prefix_cache_args,
    quantity_bytes,
    serves_args,
    serving_args,
)
from maas_operator.modeldeployment.model_source import ModelMount
from maas_services.common.defaults import ENGINE_PORT
from maas_services.common.serves import EMBED
from maas_services.common.vllm_cpu_mode import vllm_cpu_mode

DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"
VLLM_PORT = 8000
KV_EVENTS_PORT = 5557
VLLM_URL = f"http://127.0.0.1:{VLLM_PORT}"
# The key in the release's internal Secret that holds vLLM's API key.
API_KEY_SECRET_KEY = "vllm-api-key"
# vLLM's publisher binds only an endpoint with a wildcard (else it connects);
# the adapter subscribes in the pod.
KV_EVENTS_BIND = f"tcp://*:{KV_EVENTS_PORT}"
KV_EVENTS_ENDPOINT = f"tcp://127.0.0.1:{KV_EVENTS_PORT}"
KV_EVENTS_TOPIC = "kv-events"
# A vLLM server runs one runner: an embedding deployment runs the pooling one,
# the generative model's hidden states pooled into embeddings (vLLM's --convert embed).
POOLING_ARGS = ["--runner=pooling", "--convert=embed"]
# The image's entrypoint differs between vLLM's images (`vllm serve`, a shell);
# the module is the same in every build, the CPU one included.
COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
# The adapter proxies token ids: a tenth of a core and a tokenizer's memory.
ADAPTER_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"}}
# A 70B model loads and compiles for many minutes: this long before liveness
# applies to vLLM, and the adapter waits as long for vLLM's /health.
STARTUP_SECONDS = 1800
# Waits until the adapter's gRPC port closes (it has drained and exited);
# the pod's grace period bounds the wait.
_WAIT_FOR_ADAPTER = """import socket, sys, time
while True:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()
    except OSError:
        break
    time.sleep(1)
"""


def adapter_args(
    model_id: str,
    model_path: str,
    engine: dict,
    shutdown_grace_seconds: int,
    serves: list[str] | None = None,
) -> list[str]:
    return [
        *serving_args(model_id, shutdown_grace_seconds),
        "--backend=vllm",
        # embed: the adapter answers through vLLM's pooling runner (vllm_args).
        *serves_args(serves),
        f"--vllm-url={VLLM_URL}",
        f"--vllm-kv-events-endpoint={KV_EVENTS_ENDPOINT}",
        f"--vllm-startup-timeout={STARTUP_SECONDS}",
        # The adapter refuses to serve when vLLM's tokenizer is not this model's.
        f"--model-path={model_path}",
        # vLLM does not publish its batch limit; the adapter reports this one as its load's.
        f"--max-num-seqs={engine['maxNumSeqs']}",
        *prefix_cache_args(engine),
        # A vLLM that computes the model wrongly on this node stays not ready.
        *known_answer_args(engine),
        *(engine.get("extraArgs") or []),
    ]


def vllm_lora_args(spec: dict) -> list[str]:
    """LoRA on when the spec asks for it, with our engine's limits where the spec sets none
    (vLLM's own defaults differ), so both backends hold the same adapters. No
    --lora-modules: preload adapters reach vLLM through the adapter (its
    MAAS_LORA_MODULES at start, LoadAdapter after), so a change of them restarts no pod."""
    if not lora_wanted(spec):
        return []
    return ["--enable-lora", *lora_args({**ENGINE_LORA_DEFAULTS, **spec["engine"]})]


def vllm_args(
    model_id: str,
    model_path: str,
    engine: dict,
    gpus: int,
    serves: list[str] | None = None,
    lora: list[str] | None = None,
) -> list[str]:
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": KV_EVENTS_BIND,
        "topic": KV_EVENTS_TOPIC,
    }
    if not gpus:
        # The node's CPU is not known here: vllm_cpu_mode reads it as one that may
        # have AMX, where vLLM 0.32's eager bf16 is wrong (issue #32).
        mode = vllm_cpu_mode(None, engine["dtype"], engine["enforceEager"])
        engine = {**engine, "dtype": mode.dtype, "enforceEager": mode.enforce_eager}
    args = [
        f"--model={model_path}",
        f"--served-model-name={model_id}",
        "--host=0.0.0.0",
        f"--port={VLLM_PORT}",
        "--kv-events-config=" + json.dumps(kv_events, separators=(",", ":")),
        # Cached prompt tokens in usage, as the native engine reports them.
        "--enable-prompt-tokens-details",
        *common_args(engine),
        *(POOLING_ARGS if serves == [EMBED] else []),
        *(lora or []),
    ]
    kv_bytes = quantity_bytes(engine["kvCacheMemory"])
    if gpus and kv_bytes:
        args.append(f"--kv-cache-memory-bytes={kv_bytes}")
    if gpus > 1:
        args.append(f"--tensor-parallel-size={gpus}")
    return args + list(engine["vllm"].get("args") or [])


def _env(engine: dict, gpus: int, cache_dir: str, lora: bool) -> list[dict]:
    env = {
        # Read-only root: every cache (Hugging Face, vLLM's compiled graphs,
        # Triton, torch) under the writable mounts.
        "HOME": "/tmp",
        "XDG_CACHE_HOME": cache_dir,
        "VLLM_NO_USAGE_STATS": "1",
    }
    kv_bytes = quantity_bytes(engine["kvCacheMemory"])
    if not gpus and kv_bytes:
        # vLLM's CPU build sizes its KV cache in whole GiB from this alone.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(math.ceil(kv_bytes / 2**30))
    if lora:
        # Load and unload adapters at run time; only the adapter, which holds the
        # server's key, reaches vLLM's API (the module docstring).
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    env |= engine["vllm"].get("env") or {}
    return [{"name": name, "value": value} for name, value in env.items()]


def api_key_env(secret: str) -> list[dict]:
    """vLLM's key for both containers of the pod, from the Secret in the pod's namespace
    (the chart's internal-auth copy); none without one, as a test's operator runs."""
    if not secret:
        return []
    ref = {"secretKeyRef": {"name": secret, "key": API_KEY_SECRET_KEY}}
    return [{"name": "VLLM_API_KEY", "valueFrom": ref}]


def _health_probe(period: int, failures: int) -> dict:
    return {
        "httpGet": {"path": "/health", "port": "vllm-http"},
        "periodSeconds": period,
        "failureThreshold": failures,
    }


def vllm_container(
    spec: dict, default_image: str, model_id: str, mount: ModelMount, cache_dir: str
) -> dict:
    """The vLLM container, less what every engine container gets (resources.py)."""
    engine, gpus = spec["engine"], spec["resources"]["gpus"]
    return {
        "name": "vllm",
        "image": engine["vllm"].get("image") or default_image,
        "command": COMMAND,
        "args": vllm_args(
            model_id, mount.model_path, engine, gpus, spec.get("serves"), vllm_lora_args(spec)
        ),
        "env": _env(engine, gpus, cache_dir, lora_wanted(spec)),
        "ports": [{"name": "vllm-http", "containerPort": VLLM_PORT}],
        "startupProbe": _health_probe(10, STARTUP_SECONDS // 10),
        "readinessProbe": _health_probe(5, 2),
        "livenessProbe": _health_probe(10, 6),
        "lifecycle": {
            "preStop": {"exec": {"command": ["python3", "-c", _WAIT_FOR_ADAPTER, str(ENGINE_PORT)]}}
        },
    }
