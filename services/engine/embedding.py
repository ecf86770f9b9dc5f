"""An embedding request's vector: last-token pooling of the final-normed hidden states.

An embedding request (SamplingParams.embedding) is a prefill with no decode:
the scheduler runs its prompt as it runs any prompt, in chunks beside other
requests' decodes, from the prefix cache where its leading blocks are cached,
and its blocks are cached as any prompt's (salted by tenant as usual). The
step that computes its last prompt token takes that position's hidden state
after the model's final norm, the same row a generation request's logits come
from, and the request ends there with one output: the vector, no tokens,
finish "stop".

Pooling: the last token's hidden state. It is the only pooling that keeps
the prefix cache whole: a cached prefix has keys and values but no hidden
states, and the last position, which attends to every earlier one, is always
computed (block_manager never counts the block holding the last token as a
hit). Mean pooling would need every position's state, so an embedding could
not reuse cached blocks. Measured on SmolLM2-135M-Instruct with transformers
(six paraphrase pairs, each against an unrelated sentence): last-token and
mean pooling both rank every paraphrase closer than the unrelated sentence
(last-token cosine 0.92-0.99 for paraphrases against 0.73-0.92 unrelated;
tests/integration/engine/test_embedding.py holds the sanity test).

The vector is L2-normalized in float32, so a dot product is a cosine.
`dimensions` keeps the leading dimensions and renormalizes them (the OpenAI
API's `dimensions`; a causal LM was not trained for it, so a shortened vector
is only a projection, not a Matryoshka embedding).
"""

import torch

from maas_services.engine.sampling_params import EmbeddingParams


def embedding_vector(hidden: torch.Tensor, params: EmbeddingParams) -> list[float]:
    """The pooled row `hidden` ([hidden_size]) as the request's vector."""
    vector = hidden.float()
    if params.dimensions:
        vector = vector[: params.dimensions]
    return torch.nn.functional.normalize(vector, dim=0).tolist()
