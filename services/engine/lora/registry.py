"""The adapters an engine holds: loading, use counts, unloading, and room by LRU.

At most max_cpu_loras adapters are resident. Loading one more makes room by dropping
the least recently used adapter that is idle (no running request uses it) and was
loaded on demand (pinned ones, from --lora-modules, are never dropped); when every
resident adapter is pinned or busy, the load is refused (AdapterSlotsFull) and
nothing changes. Unloading an adapter that requests still use refuses new requests
for it at once (AdapterNotFound) and lets the running ones finish; it is dropped when
the last one ends. How many adapters one step computes with is the scheduler's
bound (max_loras), not this one's.

Single-threaded, as the engine that owns it (llm_engine.py), but for read(): a load
is prepare (refusals that need no reading), read (the folder, the slow part), then
install, so the engine core can read on a worker thread between its steps.
"""

from collections import OrderedDict
from dataclasses import dataclass

import torch

from maas_services.engine.lora.adapter import AdapterWeights, load_adapter_weights
from maas_services.engine.lora.errors import (
    AdapterInvalid,
    AdapterNotFound,
    AdapterSlotsFull,
    LoraDisabled,
)
from maas_services.engine.lora.loaded import LoadedAdapter
from maas_services.engine.model_config import ModelConfig


@dataclass
class _Resident:
    loaded: LoadedAdapter
    weights: AdapterWeights
    pinned: bool
    users: int = 0  # requests running with it
    unloading: bool = False


class AdapterRegistry:
    def __init__(
        self,
        model_config: ModelConfig,
        max_loras: int,
        max_lora_rank: int,
        max_cpu_loras: int,
        device: torch.device | str,
        dtype: torch.dtype,
    ):
        self.model_config = model_config
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self.device = device
        self.dtype = dtype
        # Least recently used first: a load or a request moves an adapter to the end.
        self._resident: OrderedDict[str, _Resident] = OrderedDict()
        # Each serving adapter's weights, for the model runner (model_runner.execute).
        self.weights: dict[str, AdapterWeights] = {}

    def names(self) -> list[str]:
        """The adapters new requests may use, sorted."""
        return sorted(name for name, r in self._resident.items() if not r.unloading)

    def prepare(self, name: str, source: str, pinned: bool = False) -> LoadedAdapter | None:
        """What a load is refused for before its folder is read (a full engine at once), or
        the adapter itself when `name` is resident from `source` already: the load is then
        a no-op (it also cancels an unload in progress). None: read the folder, then install."""
        if not self.max_loras:
            raise LoraDisabled("this engine serves no adapters (--max-loras 0)")
        if not name:
            raise AdapterInvalid("an adapter needs a name")
        resident = self._resident.get(name)
        if resident is None:
            self._victim()
            return None
        if resident.loaded.source != source:
            raise AdapterInvalid(
                f"adapter {name!r} is loaded from {resident.loaded.source!r}; "
                f"unload it before loading {source!r} under that name"
            )
        resident.unloading = False
        resident.pinned |= pinned
        self._resident.move_to_end(name)
        return resident.loaded

    def read(self, source: str) -> AdapterWeights:
        """The folder's weights, checked, on the engine's device in its dtype (AdapterInvalid).
        It touches nothing of the registry, so any thread may read: the engine core reads
        on a worker while its steps go on (core/engine_core.py)."""
        weights = load_adapter_weights(source, self.model_config, self.max_lora_rank)
        return weights.to(self.device, self.dtype)

    def install(
        self, name: str, source: str, weights: AdapterWeights, pinned: bool = False
    ) -> LoadedAdapter:
        """Make read weights resident as `name`, which prepare() found absent, making room
        (module docstring): AdapterSlotsFull if requests took every slot since then."""
        victim = self._victim()
        if victim is not None:
            self._drop(victim)
        loaded = LoadedAdapter(name, weights.rank, source)
        self._resident[name] = _Resident(loaded, weights, pinned)
        self.weights[name] = weights
        return loaded

    def unload(self, name: str) -> bool:
        """Whether `name` was loaded; its running requests finish first (module docstring)."""
        resident = self._resident.get(name)
        if resident is None or resident.unloading:
            return False
        if resident.users:
            resident.unloading = True
        else:
            self._drop(name)
        return True

    def acquire(self, name: str) -> None:
        """A request starts using `name`: AdapterNotFound unless it is loaded."""
        if not self.max_loras:
            raise LoraDisabled(f"adapter {name!r}: this engine serves no adapters (--max-loras 0)")
        resident = self._resident.get(name)
        if resident is None or resident.unloading:
            known = ", ".join(self.names()) or "none"
            raise AdapterNotFound(f"adapter {name!r} is not loaded here (loaded: {known})")
        resident.users += 1
        self._resident.move_to_end(name)

    def release(self, name: str) -> None:
        """A request using `name` ended."""
        resident = self._resident[name]
        resident.users -= 1
        if resident.unloading and not resident.users:
            self._drop(name)

    def _victim(self) -> str | None:
        """The adapter a new load replaces (None while there is room), or AdapterSlotsFull."""
        if len(self._resident) < self.max_cpu_loras:
            return None
        for name, resident in self._resident.items():
            if not resident.pinned and not resident.users:
                return name
        raise AdapterSlotsFull(
            f"all {self.max_cpu_loras} adapter slots hold adapters that are pinned or in use"
        )

    def _drop(self, name: str) -> None:
        del self._resident[name]
        del self.weights[name]
