"""Where the serving process and the core meet: two ipc:// sockets in a private directory."""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CoreAddresses:
    inputs: str  # serving -> core
    outputs: str  # core -> serving

    @classmethod
    def under(cls, directory: str | Path) -> "CoreAddresses":
        return cls(f"ipc://{directory}/inputs", f"ipc://{directory}/outputs")
