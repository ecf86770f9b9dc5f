"""What a deployment serves: generation, embeddings, or both.

Shared by the operator (ModelDeployment `spec.serves`, passed to the engines as
`--serves`), the engines (LoadReport.serves), the router (DeploymentStats.serves,
the union over ready replicas) and the gateway, which refuses with a 400 what
no ready replica can do.
"""

GENERATE = "generate"
EMBED = "embed"
KINDS = (GENERATE, EMBED)

# A vLLM server runs either its generation runner or its pooling runner, never
# both; the native engine batches embeddings beside generation.
DEFAULT_SERVES = {"native": [GENERATE, EMBED], "vllm": [GENERATE]}

# vLLM's flags for a server that embeds (the operator's pod, the tests): its
# pooling runner over the causal LM converted to an embedding model, pooled
# as the native engine pools (services/engine/embedding.py: the last token's
# final-normed hidden state, L2-normalized by the activation).
VLLM_POOLING_ARGS = [
    "--runner=pooling",
    "--convert=embed",
    '--pooler-config={"seq_pooling_type": "LAST", "use_activation": true}',
]


def offered(serves) -> set[str]:
    """What a report's `serves` means: empty is generation only (a report from
    before the field existed)."""
    return set(serves) or {GENERATE}
