"""One sequence's position in its grammar.

The matcher advances only on tokens the sequence keeps. Each of a request's
n samples has its own. Preemption by recompute keeps a sequence's output
tokens, so its matcher stays where it was; speculative drafts are checked by
advancing through them and rolling back (spec/decoder.py).
"""

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import xgrammar


class GrammarState:
    def __init__(self, compiled: "xgrammar.CompiledGrammar"):
        # Imported here, not at the top: the sampler and the speculative
        # decoder import this module, and an engine that never sees a grammar
        # should not pay for xgrammar's import (it pulls in transformers).
        import xgrammar

        self._matcher = xgrammar.GrammarMatcher(compiled)

    def accept(self, token: int) -> bool:
        """Advance past token; False (and no change) if the grammar forbids it."""
        return self._matcher.accept_token(token)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._matcher.rollback(num_tokens)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into bitmask[row]."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    @property
    def terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted."""
        return self._matcher.is_terminated()
