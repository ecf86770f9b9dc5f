"""One sequence in the engine: its tokens, how far its KV is computed, its blocks.

A request with n parallel samples becomes n sequences that share the prompt's
blocks (forked after the prompt is computed).
"""

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from maas_services.engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # the serving process imports this module (request.py), and no torch
    import torch

    from maas_services.engine.grammar.matcher import GrammarState


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


# eq=False: a sequence is itself, not its fields' values (the scheduler's list.remove
# and `in` then compare identities instead of building every field's tuple per element).
@dataclass(eq=False)
class Sequence:
    request_id: str
    index: int  # which of the request's n samples
    token_ids: list[int]  # prompt, then generated tokens
    num_prompt_tokens: int
    params: SamplingParams
    generator: "torch.Generator"
    priority: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    status: SequenceStatus = SequenceStatus.WAITING
    # Tokens whose keys and values are in the cache. Everything from here to
    # the end of token_ids is what the next steps must compute.
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    # Salts its block hashes, so the prefix cache is shared only where it may be
    # (services/common/block_hash.py: request_salt).
    cache_salt: str = ""
    # The LoRA adapter it runs with ("" = the base model; lora/registry.py).
    adapter: str = ""
    num_preemptions: int = 0
    finish_reason: str | None = None
    last_token_time: float | None = None
    # Speculative guesses appended to token_ids for this step only; verification
    # keeps the accepted ones and drops the rest.
    num_draft_tokens: int = 0
    # Moving average of the fraction of drafts accepted: low means stop guessing.
    draft_acceptance: float = 1.0
    # Where this sample stands in its request's grammar, if it has one.
    grammar: "GrammarState | None" = None

    def drop_drafts(self) -> None:
        if self.num_draft_tokens:
            del self.token_ids[-self.num_draft_tokens :]
            self.num_draft_tokens = 0

    @property
    def embeds(self) -> bool:
        """An embedding request: a prefill whose last hidden state is the answer."""
        return self.params.embedding is not None

    @property
    def seq_id(self) -> tuple[str, int]:
        return (self.request_id, self.index)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def in_prefill(self) -> bool:
        """Still computing tokens it was given rather than ones it sampled."""
        return self.num_uncomputed_tokens > 1 or not self.output_ids

    def sort_key(self) -> tuple[int, float, int]:
        """Higher priority first, then first come, first served."""
        return (-self.priority, self.arrival_time, self.index)
