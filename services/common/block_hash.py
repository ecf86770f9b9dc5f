"""Content hashes of KV-cache blocks, shared by the engine's prefix cache and the router.

The router predicts which engine already holds a prompt's prefix by hashing the
prompt's token ids itself, so both sides must get bit-identical values in
different processes, Python versions and machines. Python's hash() is salted per
process, hence blake2b over a fixed byte encoding.

Each block's hash covers its parent's hash, so equal hashes mean equal whole
prefixes, not merely equal blocks: KV values depend on every earlier token.

Tenants do not share cached blocks unless a deployment opts in. A shared hit
shows in `cached_tokens` and in the time to first token, so tenant A could
learn whether tenant B recently sent a given prefix. Each request's salt is
therefore the engine's salt plus its tenant (`request_salt`), computed by the
engine for its own cache and by the router for its prefix index, so the index
stays exact: it finds a tenant's own blocks and never another's. Sharing (for
public system prompts) takes two keys: the engine must allow it
(`--prefix-cache-sharing=global`, the ModelDeployment's
`spec.engine.prefixCacheSharing`, reported in GetLoad so the router follows)
and the request must ask for it (`share_prefix_cache`, which the gateway sets
for deployments its routing table marks `share_prefix_cache: true`). The
engine enforces it, as the router is only a hint; a request that does not ask
(an older gateway, a direct caller) or has no tenant is never pooled with
anyone else's.
"""

import hashlib
import struct
from collections.abc import Sequence

# Tokens per block unless an engine is set up otherwise (--block-size): the
# engine's default and the router's until an engine reports its own.
BLOCK_SIZE = 16


def hash_block(parent: int | None, token_ids: Sequence[int], salt: str = "") -> int:
    """Unsigned 64-bit hash of one block of token ids following the block hashed `parent`.

    `parent` is None for a sequence's first block. `salt` separates caches whose
    KV differs for the same tokens (another model, LoRA adapter or dtype) or
    that must not be shared (another tenant's: `request_salt`).
    """
    head = _FIRST if parent is None else _CHILD + parent.to_bytes(8, "little")
    ids = struct.pack(f"<{len(token_ids)}I", *token_ids)
    return int.from_bytes(_digest(head, _salted(salt), ids), "little")


def prefix_block_hashes(token_ids: Sequence[int], block_size: int, salt: str = "") -> list[int]:
    """Chained hashes of every full block of `token_ids`; a partial last block has none.

    hash_block's values, with the ids packed once and each digest fed to the next
    block as it is: the router hashes every prompt it picks for, and this took
    0.97 -> 0.60 ms of CPU for 4,096 tokens (thread time, AMD EPYC).
    """
    salted = _salted(salt)
    full = len(token_ids) - len(token_ids) % block_size
    packed = memoryview(struct.pack(f"<{full}I", *token_ids[:full]))
    step = block_size * 4
    hashes: list[int] = []
    head = _FIRST
    for start in range(0, full * 4, step):
        value = _digest(head, salted, packed[start : start + step])
        hashes.append(int.from_bytes(value, "little"))
        head = _CHILD + value
    return hashes


# A flag byte rather than 0 for "no parent", so a real parent hash of 0 can't collide.
_FIRST = b"\x00" + bytes(8)
_CHILD = b"\x01"


def _salted(salt: str) -> bytes:
    # Length-prefixed so the salt's bytes can never be read as token ids.
    salt_bytes = salt.encode()
    return len(salt_bytes).to_bytes(4, "little") + salt_bytes


def _digest(head: bytes, salted: bytes, ids: bytes | memoryview) -> bytes:
    """The one encoding both functions hash: parent flag and hash, salt, packed ids."""
    digest = hashlib.blake2b(head, digest_size=8)
    digest.update(salted)
    digest.update(ids)
    return digest.digest()


def request_salt(
    engine_salt: str, sharing: str, tenant: str, share_requested: bool, adapter: str = ""
) -> str:
    """The salt of one request's blocks: its tenant's own, or the engine's own when shared,
    and its LoRA adapter's.

    `sharing` is the engine's --prefix-cache-sharing; only "global" lets a
    request that asks share. NUL separates the tenant because a configured
    salt, from a flag or the environment, cannot hold one: no tenant's salt
    equals the shared salt or another tenant's, the empty tenant's included.
    An adapter changes every layer's keys and values, so its blocks are its
    own (a second NUL, then its name); the base model's salt is unchanged.
    """
    salt = engine_salt if sharing == "global" and share_requested else f"{engine_salt}\x00{tenant}"
    return f"{salt}\x00\x00{adapter}" if adapter else salt
