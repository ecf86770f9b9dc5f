"""The order in which an A/B benchmark runs its sides: A B, B A, A B, ...

A host that drifts (a neighbour's load, the CPU's clock) then drifts under every
side alike, instead of favouring whichever side ran in the quieter half.
"""

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def in_turn(sides: Iterable[T], round_: int) -> list[T]:
    """The sides in their own order on even rounds, reversed on odd ones."""
    ordered = list(sides)
    return ordered if round_ % 2 == 0 else ordered[::-1]
