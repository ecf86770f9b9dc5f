"""Endpoint discovery: where the engine replicas are, behind one small interface.

A source yields whole snapshots, never deltas: the pool diffs each one against
what it has, so a source that reconnects and starts over can't leave a removed
replica behind.
"""

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from maas_services.router.settings import RouterSettings


@dataclass(frozen=True)
class Target:
    """One engine replica as discovery reports it."""

    endpoint_id: str
    address: str
    model: str = ""  # empty: learn it from the engine's GetLoad
    ready: bool = True
    terminating: bool = False


@dataclass(frozen=True)
class Routing:
    """A deployment's routing choice; empty policy means the router's default."""

    policy: str = ""
    weights: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    targets: list[Target]
    routing: dict[str, Routing] = field(default_factory=dict)  # by model


class EndpointSource(Protocol):
    def snapshots(self) -> AsyncIterator[Snapshot]:
        """The current snapshot at once, then a new one after every change."""
        ...

    async def close(self) -> None: ...


def _static(settings: RouterSettings) -> EndpointSource:
    from maas_services.router.discovery.static import StaticSource

    return StaticSource.from_settings(settings)


def _kubernetes(settings: RouterSettings) -> EndpointSource:
    # Imported only when chosen: the kubernetes client is slow to import.
    from maas_services.router.discovery.kubernetes import KubernetesSource

    return KubernetesSource.from_settings(settings)


SOURCES: dict[str, Callable[[RouterSettings], EndpointSource]] = {
    "static": _static,
    "kubernetes": _kubernetes,
}


def make_source(settings: RouterSettings) -> EndpointSource:
    return SOURCES[settings.discovery](settings)
