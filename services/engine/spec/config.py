"""How speculative decoding is set up for one engine (flags --speculative-*)."""

from dataclasses import dataclass


@dataclass
class SpecConfig:
    method: str = ""  # a registered proposer ("ngram", "draft"); empty: off
    num_tokens: int = 4  # draft tokens per step at most
    max_batch: int = 8  # no speculation when more sequences than this are running
    min_acceptance: float = 0.3  # a sequence below this acceptance pauses speculating
    draft_model: str = ""  # the draft proposer's weights: an HF folder or GGUF file
    # Tokens of context the draft model keeps per sequence; longer sequences are
    # seen through a window of the most recent tokens.
    draft_context: int = 1024
