"""What `engine.vllm.args` and `engine.vllm.env` may say: tuning, never trust.

vLLM's server takes flags that change who may call it (`--api-key`, `--host`,
`--port`), what it may read or run (`--trust-remote-code` runs Python from the
model folder, `--middleware` and `--tool-parser-plugin` import Python files,
`--allowed-local-media-path` serves the container's files to any prompt,
`--chat-template` reads a file) and what the adapter relies on (`--model`,
`--served-model-name`, `--kv-events-config`). The operator runs the container
with the platform's Secrets beside it, so whoever may write a ModelDeployment
may pass only flags that tune serving: the ones the platform itself sets
(engine_args.common_args, vllm_pod.vllm_args) and their neighbours (LoRA,
parallelism, caching, scheduling, speculative decoding, parsers of the
model's output). Everything else is refused at admission, naming the flag.

Flags are read as vLLM's parser reads them: `--name=value` or `--name value
...`, `_` and `-` alike, `--name.key` (vLLM's dotted JSON arguments) as
`--name`. A short option (`-tp`, `-O`) is refused: its long form is checked
instead. A value with no flag before it is refused too.

Environment: names under the prefixes vLLM and its libraries read for tuning,
less those that open vLLM up or that the platform sets itself (the API key).
"""

import re

ALLOWED_FLAGS = frozenset(
    {
        # What the platform sets from the spec, or a spec sets in their place.
        "dtype",
        "max-model-len",
        "gpu-memory-utilization",
        "max-num-seqs",
        "max-num-batched-tokens",
        "block-size",
        "enforce-eager",
        "kv-cache-memory-bytes",
        "tensor-parallel-size",
        "pipeline-parallel-size",
        "data-parallel-size",
        "enable-expert-parallel",
        "quantization",
        "kv-cache-dtype",
        "calculate-kv-scales",
        # LoRA adapters (paths inside the container or its model mount).
        "enable-lora",
        "max-loras",
        "max-lora-rank",
        "max-cpu-loras",
        "lora-dtype",
        "lora-modules",
        "fully-sharded-loras",
        # Caching and scheduling.
        "enable-prefix-caching",
        "no-enable-prefix-caching",
        "prefix-caching-hash-algo",
        "enable-chunked-prefill",
        "no-enable-chunked-prefill",
        "max-num-partial-prefills",
        "max-long-partial-prefills",
        "long-prefill-token-threshold",
        "scheduling-policy",
        "async-scheduling",
        "swap-space",
        "cpu-offload-gb",
        "num-gpu-blocks-override",
        "cuda-graph-sizes",
        "compilation-config",
        "speculative-config",
        # What the model's outputs are parsed as; seeds and logging.
        "reasoning-parser",
        "tool-call-parser",
        "enable-auto-tool-choice",
        "max-logprobs",
        "seed",
        "disable-log-stats",
        "enable-log-requests",
        "disable-log-requests",
        "uvicorn-log-level",
        "disable-uvicorn-access-log",
    }
)

ALLOWED_ENV_PREFIXES = ("VLLM_", "OMP_", "KMP_", "MKL_", "NCCL_", "PYTORCH_", "TORCH_")
ALLOWED_ENV_NAMES = frozenset({"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM"})
# Under an allowed prefix, but a key, a door or the platform's own setting.
REFUSED_ENV_NAMES = frozenset(
    {
        "VLLM_API_KEY",  # the platform's key for this server (vllm_pod.py)
        "VLLM_SERVER_DEV_MODE",  # debug endpoints: reset caches, sleep, collective RPC
        "VLLM_ALLOW_INSECURE_SERIALIZATION",  # pickle between processes
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING",  # load adapters from any path over HTTP
        "VLLM_NO_USAGE_STATS",  # the platform keeps vLLM from reporting home
    }
)

# A value that looks like an option but is a negative number (`--seed -1`).
_NEGATIVE_NUMBER = re.compile(r"-\d")


def flag_name(token: str) -> str:
    """'--max_loras=4' -> 'max-loras'; '--speculative-config.method' -> 'speculative-config'."""
    name = token.removeprefix("--").partition("=")[0]
    return name.partition(".")[0].replace("_", "-")


def refused_arg(args: list[str]) -> str | None:
    """Why an argument list may not reach vLLM, or None."""
    flag_seen = False
    for token in args:
        if token.startswith("--") and token != "--":
            name = flag_name(token)
            if name not in ALLOWED_FLAGS:
                return f"{token!r}: --{name} is not a flag a ModelDeployment may pass to vLLM"
            flag_seen = True
        elif token.startswith("-") and not _NEGATIVE_NUMBER.match(token):
            return f"{token!r}: short options are not accepted; use the long form"
        elif not flag_seen:
            return f"{token!r}: a value with no flag before it"
    return None


def refused_env(name: str) -> bool:
    if name in REFUSED_ENV_NAMES:
        return True
    return name not in ALLOWED_ENV_NAMES and not name.startswith(ALLOWED_ENV_PREFIXES)
