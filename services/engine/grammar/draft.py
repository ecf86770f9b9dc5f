"""Speculative drafts under a grammar: keep the prefix it allows, mask each position.

A drafted token the grammar forbids can never be accepted, so the draft is
cut before it; verification then sees, at every position, the logits masked
by the grammar's state after the draft tokens before it. The matcher walks
the draft to compute those masks and is rolled back: it advances for real
only on the tokens verification keeps (llm_engine appends them one by one).
"""

import torch

from maas_services.engine.grammar.bitmask import masked, new_bitmask
from maas_services.engine.grammar.matcher import GrammarState


def constrain_draft(
    grammar: GrammarState, draft: list[int], logits: torch.Tensor
) -> tuple[list[int], torch.Tensor]:
    """(the allowed prefix of draft, logits[: prefix + 1] masked position by position)."""
    bitmask = new_bitmask(len(draft) + 1, logits.shape[-1])
    kept = 0
    for token in draft:
        grammar.fill(bitmask, kept)
        if not grammar.accept(token):
            break
        kept += 1
    else:
        grammar.fill(bitmask, kept)
    grammar.rollback(kept)
    return draft[:kept], masked(logits[: kept + 1], bitmask[: kept + 1], list(range(kept + 1)))
