"""Prompt-lookup proposer: no draft model, just the text already there.

Summaries, edits and code completions repeat spans of their context. Find the
most recent earlier occurrence of the sequence's last n tokens (longest n
first) and propose the tokens that followed it.
"""

from maas_services.engine.spec.proposer import DraftRequest, register


@register("ngram")
class NgramProposer:
    def __init__(self, min_n: int = 2, max_n: int = 4):
        self.min_n = min_n
        self.max_n = max_n

    @classmethod
    def from_config(cls, config, target) -> "NgramProposer":
        return cls()

    def propose(self, requests: list[DraftRequest]) -> list[list[int]]:
        return [self.lookup(r.token_ids, r.max_tokens) for r in requests]

    def lookup(self, token_ids: list[int], max_tokens: int) -> list[int]:
        if max_tokens <= 0:
            return []
        length = len(token_ids)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            pattern = token_ids[length - n :]
            # Most recent match first: nearby context predicts best.
            for start in range(length - n - 1, -1, -1):
                if token_ids[start : start + n] == pattern:
                    follow = token_ids[start + n : start + n + max_tokens]
                    if follow:
                        return follow
        return []
