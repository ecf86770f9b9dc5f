"""Content hashes of KV-cache blocks, shared by the engine's prefix cache and the router.

The router predicts which engine already holds a prompt's prefix by hashing the
prompt's token ids itself, so both sides must get bit-identical values in
different processes, Python versions and machines. Python's hash() is salted per
process, hence blake2b over a fixed byte encoding.

Each block's hash covers its parent's hash, so equal hashes mean equal whole
prefixes, not merely equal blocks: KV values depend on every earlier token.
"""

import hashlib
import struct
from collections.abc import Sequence


def hash_block(parent: int | None, token_ids: Sequence[int], salt: str = "") -> int:
    """Unsigned 64-bit hash of one block of token ids following the block hashed `parent`.

    `parent` is None for a sequence's first block. `salt` separates caches whose
    KV differs for the same tokens (another model, LoRA adapter or dtype).
    """
    digest = hashlib.blake2b(digest_size=8)
    # A flag byte rather than 0 for "no parent", so a real parent hash of 0 can't collide.
    if parent is None:
        digest.update(b"\x00" + bytes(8))
    else:
        digest.update(b"\x01" + parent.to_bytes(8, "little"))
    salt_bytes = salt.encode()
    # Length-prefixed so the salt's bytes can never be read as token ids.
    digest.update(len(salt_bytes).to_bytes(4, "little") + salt_bytes)
    digest.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    return int.from_bytes(digest.digest(), "little")


def prefix_block_hashes(token_ids: Sequence[int], block_size: int, salt: str = "") -> list[int]:
    """Chained hashes of every full block of `token_ids`; a partial last block has none."""
    hashes: list[int] = []
    parent = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size], salt)
        hashes.append(parent)
    return hashes
