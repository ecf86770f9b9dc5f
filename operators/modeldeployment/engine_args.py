"""`maas serve engine` arguments from spec.engine (vLLM's own: vllm_pod.py).

Flags for optional features (quantization, speculative decoding, prefix-cache
sharing across tenants) are only passed when the spec turns them on, so the
default spec runs on any engine build, including one from before those features.
"""

import re

from maas_services.common.defaults import ENGINE_PORT, METRICS_PORT

_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_UNITS |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity_bytes(quantity: str) -> int:
    match = re.fullmatch(r"([0-9]+)(Ki|Mi|Gi|Ti|k|M|G|T)?", quantity)
    if not match:
        raise ValueError(f"not a byte quantity: {quantity!r}")
    return int(match.group(1)) * _UNITS[match.group(2) or ""]


def serving_args(model_id: str, shutdown_grace_seconds: int) -> list[str]:
    """What every `maas serve engine` gets, whichever backend it fronts."""
    # The image's entrypoint is `maas serve`.
    return [
        "engine",
        "--host=0.0.0.0",
        f"--port={ENGINE_PORT}",
        f"--metrics-port={METRICS_PORT}",
        f"--model-id={model_id}",
        f"--shutdown-grace-seconds={shutdown_grace_seconds}",
    ]


def prefix_cache_args(engine: dict) -> list[str]:
    if engine["prefixCacheSharing"] == "tenant":
        return []
    return [f"--prefix-cache-sharing={engine['prefixCacheSharing']}"]


def serves_args(serves: list[str] | None) -> list[str]:
    """spec.serves; absent, the engine's own default for its backend (common/serves.py)."""
    return [f"--serves={','.join(serves)}"] if serves else []


def known_answer_args(engine: dict) -> list[str]:
    """The start-up known-answer check's reference (services/engine/known_answer.py): the
    spec's, else the sanity bound; a pod never loads a float32 copy of its model for one."""
    reference = engine.get("knownAnswerPerplexity")
    return [f"--known-answer={reference if reference else 'bound'}"]


# spec.engine's LoRA limits and the flag each is, spelt alike by our engine and vLLM.
LORA_FLAGS = {
    "maxLoras": "max-loras",
    "maxLoraRank": "max-lora-rank",
    "maxCpuLoras": "max-cpu-loras",
}


def lora_args(engine: dict) -> list[str]:
    """The LoRA limits the spec sets; the engine's own defaults (ENGINE_LORA_DEFAULTS) else.
    Preload adapters are no flag: a change would restart the pods (lora_modules_configmap.py)."""
    return [f"--{flag}={engine[field]}" for field, flag in LORA_FLAGS.items() if field in engine]


def common_args(engine: dict) -> list[str]:
    """Flags our engine and vLLM's server spell alike."""
    args = [
        f"--dtype={engine['dtype']}",
        f"--gpu-memory-utilization={engine['gpuMemoryUtilization']}",
        f"--max-num-seqs={engine['maxNumSeqs']}",
        f"--max-num-batched-tokens={engine['maxNumBatchedTokens']}",
        f"--block-size={engine['blockSize']}",
    ]
    if engine["maxModelLen"]:
        args.append(f"--max-model-len={engine['maxModelLen']}")
    if engine["enforceEager"]:
        args.append("--enforce-eager")
    return args


def engine_args(
    model_id: str,
    model_path: str,
    engine: dict,
    shutdown_grace_seconds: int,
    serves: list[str] | None = None,
) -> list[str]:
    args = [
        *serving_args(model_id, shutdown_grace_seconds),
        *common_args(engine),
        *serves_args(serves),
    ]
    if model_path:
        args.append(f"--model-path={model_path}")
    kv_bytes = quantity_bytes(engine["kvCacheMemory"])
    if kv_bytes:
        args.append(f"--kv-cache-memory={kv_bytes}")
    if engine["quantization"] != "none":
        args.append(f"--quantization={engine['quantization']}")
    args += prefix_cache_args(engine) + known_answer_args(engine) + lora_args(engine)
    speculative = engine["speculative"]
    if speculative["method"] != "none":
        args.append(f"--speculative-method={speculative['method']}")
        args.append(f"--num-speculative-tokens={speculative['numTokens']}")
        if speculative.get("draftModel"):
            args.append(f"--speculative-draft-model={speculative['draftModel']}")
    return args + list(engine.get("extraArgs") or [])
