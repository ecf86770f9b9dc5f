"""A request as the engine tracks it: its samples and its timings."""

import time
from dataclasses import dataclass, field

from maas_services.common.detokenizer import IncrementalDetokenizer
from maas_services.engine.logprobs import TokenLogprob
from maas_services.engine.sampling_params import SamplingParams
from maas_services.engine.sequence import Sequence
from maas_services.engine.stop_strings import StopStringMatcher


@dataclass
class SampleText:
    """Per-sample text state: detokenizer and stop-string matcher."""

    detokenizer: IncrementalDetokenizer
    stops: StopStringMatcher


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    priority: int
    cache_salt: str = ""  # every sample's block-hash salt
    adapter: str = ""  # the LoRA adapter every sample runs with; "" = the base model
    seqs: list[Sequence] = field(default_factory=list)
    texts: dict[int, SampleText] = field(default_factory=dict)
    arrival_time: float = field(default_factory=time.monotonic)
    cached_prompt_tokens: int | None = None  # from the first admission
    scheduled_time: float | None = None  # the first admission into a batch
    first_token_time: float | None = None
    grammar: object = None  # xgrammar's CompiledGrammar, when params.grammar is set

    @property
    def finished(self) -> bool:
        return len(self.seqs) == self.params.n and all(s.finish_reason for s in self.seqs)


@dataclass
class SeqOutput:
    """What one step produced for one sample of a request."""

    request_id: str
    index: int
    token_ids: list[int]
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    # Prompt tokens whose KV is computed (cache hits included): all of them
    # once a token is sampled, fewer for a request aborted during prefill.
    computed_prompt_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # The request's timeline (time.monotonic()), for the engine's trace span.
    arrival_time: float = 0.0
    scheduled_time: float | None = None
    first_token_time: float | None = None
    # Set, with finish_reason "error", when the request made a step raise.
    error: str | None = None
    # An embedding request's one output: its vector (services/engine/embedding.py).
    embedding: list[float] = field(default_factory=list)
