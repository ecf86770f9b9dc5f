"""What the engine client yields for each engine message, to both fronts, and how
the deltas that are ready together become one per choice (merged)."""

from collections.abc import Sequence
from dataclasses import dataclass, replace

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


def merged(deltas: list[Delta]) -> list[Delta]:
    """One delta per choice for deltas that are ready together, in the order the
    choices first appear: the text and logprobs in order, the finish and the
    running totals of the choice's latest. A broken stream's "error" delta (always
    a stream's last) stays its own, after them, so the text before it is sent."""
    if len(deltas) == 1:
        return deltas  # a reader that keeps up: every time
    by_index: dict[int, Delta] = {}
    broken = []
    for delta in deltas:
        earlier = by_index.get(delta.index)
        if delta.finish_reason == "error":
            broken.append(delta)
        elif earlier is None:
            by_index[delta.index] = delta
        else:
            by_index[delta.index] = replace(
                delta,
                text=earlier.text + delta.text,
                logprobs=[*earlier.logprobs, *delta.logprobs],
            )
    return [*by_index.values(), *broken]
