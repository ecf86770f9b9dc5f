"""Mask logits to what a grammar allows next, a batch's rows in one call.

Rows without a grammar are left as they are: constrained and free requests
share a batch, and only the constrained rows pay for a mask. The masked
logits are a copy, so the caller's still give unconstrained log-probabilities.

Per step this costs a fill per constrained row (~15 us each on the bench's
JSON schema) and one apply over those rows; nothing scales with the free
rows. The bitmask is allocated uninitialised: every row that is applied is
filled first, and xgrammar's own allocator writes all-ones into every row
of the batch, a parallel region that cost milliseconds per step on a loaded
2-core machine (benchmarks/structured_bench.py).
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from maas_services.engine.grammar.matcher import GrammarState


def apply_grammars(logits: torch.Tensor, grammars: Sequence["GrammarState | None"]) -> torch.Tensor:
    """logits [rows, vocab], one optional grammar per row, each masked at its own state."""
    rows = [i for i, grammar in enumerate(grammars) if grammar is not None]
    if not rows:
        return logits
    bitmask = new_bitmask(len(grammars), logits.shape[-1])
    for row in rows:
        grammars[row].fill(bitmask, row)
    return masked(logits, bitmask, rows)


def new_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """Uninitialised: the caller fills every row it will apply."""
    import xgrammar  # on first use, as in matcher.py

    return torch.empty(xgrammar.get_bitmask_shape(rows, vocab_size), dtype=xgrammar.bitmask_dtype)


def masked(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    import xgrammar

    out = logits.clone()
    xgrammar.apply_token_bitmask_inplace(out, bitmask.to(out.device), indices=rows)
    return out
