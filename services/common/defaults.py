"""Defaults two or more places must agree on: ports, batch limits, max_tokens.

Each service's settings, the local stack, the operator and the
ModelDeployment CRD read these instead of restating the numbers, and
tests/k8s/test_crd_defaults.py checks the chart and the CRD against them
(YAML and the Dockerfile cannot import). The KV block size lives beside the
block hash it shapes (services/common/block_hash.py: BLOCK_SIZE).
"""

# Ports in a pod (and the gateway's locally); a local stack picks free ones
# instead (tools/local/ports.py).
GATEWAY_HTTP_PORT = 8080
GATEWAY_GRPC_PORT = 50050
TOKENIZER_PORT = 50051
ROUTER_PORT = 50052
BILLING_PORT = 50053
# Engines run in pods of their own, so they take the tokenizer's number.
ENGINE_PORT = 50051
OPERATOR_HEALTH_PORT = 8080
METRICS_PORT = 9090

# An engine's batch: sequences in one step and tokens computed per step.
MAX_NUM_SEQS = 64
MAX_NUM_BATCHED_TOKENS = 2048
# An engine's LoRA limits: distinct adapters in one step, the highest rank it loads,
# adapters it keeps loaded (the operator gives a vLLM server the same).
MAX_LORAS = 8
MAX_LORA_RANK = 16
MAX_CPU_LORAS = 32


def default_max_tokens(max_model_len: int, prompt_tokens: int) -> int:
    """max_tokens when a request sets none: the room left in the context, at least 1."""
    return max(max_model_len - prompt_tokens, 1)
