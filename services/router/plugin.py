"""The routing plugin contract, in llm-d's shape: filters narrow the candidates,
scorers rate each survivor in [0, 1], a picker chooses from the weighted sums.

Each plugin lives in its own file under filters/, scorers/ or pickers/, and
registry.py names them for policies.py and for configured weights.
"""

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from maas_services.common.block_hash import prefix_block_hashes, request_salt
from maas_services.router.endpoints import Endpoint
from maas_services.router.pick_history import PickHistory
from maas_services.router.prefix_index import PrefixIndex
from maas_services.router.settings import RouterSettings

# Enough of the prompt to tell conversations apart, little enough to be cheap.
TIE_KEY_TOKENS = 256


@dataclass
class PickContext:
    request_id: str
    model: str
    token_ids: Sequence[int]
    session_id: str = ""
    # With the engine's sharing mode, which cached blocks the request can hit.
    tenant: str = ""
    share_prefix_cache: bool = False
    # The LoRA adapter the request names; empty: the base model.
    adapter: str = ""
    exclude: frozenset[str] = frozenset()
    now: float = field(default_factory=time.monotonic)
    _hashes: dict[tuple[int, str], list[int]] = field(default_factory=dict, repr=False)

    def block_hashes(self, endpoint: Endpoint) -> list[int]:
        """The prompt's chained block hashes as this endpoint's engine computes them
        for this request: only blocks the engine would let it hit can match."""
        block_size, engine_salt = endpoint.hash_params
        salt = request_salt(
            engine_salt,
            endpoint.prefix_cache_sharing,
            self.tenant,
            self.share_prefix_cache,
            self.adapter,
        )
        if (block_size, salt) not in self._hashes:
            self._hashes[block_size, salt] = prefix_block_hashes(self.token_ids, block_size, salt)
        return self._hashes[block_size, salt]

    @property
    def tie_key(self) -> bytes:
        """What decides between equal scores. Derived from the prompt, not from chance
        or arrival order, so router replicas agree and same-prefix prompts stay together."""
        head = self.token_ids[:TIE_KEY_TOKENS]
        return struct.pack(f"<{len(head)}I", *head) if head else self.request_id.encode()


@dataclass
class PluginDeps:
    """What a plugin may be built from."""

    index: PrefixIndex
    history: PickHistory
    settings: RouterSettings


class Filter(Protocol):
    def filter(self, ctx: PickContext, endpoints: list[Endpoint]) -> list[Endpoint]: ...


class Scorer(Protocol):
    def score(self, ctx: PickContext, endpoints: list[Endpoint]) -> list[float]:
        """One score in [0, 1] per endpoint, in order; higher is better."""
        ...


class Picker(Protocol):
    def pick(self, ctx: PickContext, ranked: list[tuple[Endpoint, float]]) -> Endpoint:
        """Choose from a non-empty list of (endpoint, weighted score)."""
        ...
