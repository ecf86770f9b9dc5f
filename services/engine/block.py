"""One fixed-size slot of the engine's KV-cache pool."""

from dataclasses import dataclass


@dataclass
class Block:
    block_id: int
    # How many sequences' block tables hold this block; 0 means free or cached.
    ref_count: int = 0
    # Chained hash of the full, computed prefix ending in this block, while it is
    # in the prefix cache; None for partial blocks and for free ones.
    hash: int | None = None
