"""What the engine client yields for each engine message, to both fronts."""

from collections.abc import Sequence
from dataclasses import dataclass

from maas.v1 import engine_pb2


@dataclass
class Delta:
    """One engine message: a sample's new text; the usage fields are running totals."""

    text: str
    index: int = 0
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    logprobs: Sequence[engine_pb2.TokenLogprob] = ()
