"""What a load of an adapter answers (engine.proto's AdapterStatus).

Apart from the registry, so the serving process, which passes it on, imports no torch.
"""

from dataclasses import dataclass


@dataclass
class LoadedAdapter:
    name: str
    rank: int
    source: str
