"""The model routing table: aliases -> deployments, with canary weights and tier pools.

Loaded from a YAML file (a ConfigMap in Kubernetes):

    tiers:                      # queue weight and engine priority per tenant tier
      standard: {weight: 1, priority: 0}
      premium: {weight: 4, priority: 10}
    models:
      smollm2:                  # the name tenants send
        routes:                 # the canary split
          - {deployment: smollm2-135m-instruct, weight: 90}
          - {deployment: smollm2-135m-instruct-canary, weight: 10}
        tiers:                  # tiers with a pool of their own
          premium: [{deployment: smollm2-premium}]
    deployments:
      smollm2-135m-instruct-canary:
        tokenizer: smollm2-135m-instruct   # whose chat template / vocabulary to use
        max_in_flight: 32                  # this replica's slots (default: pool capacity)
        share_prefix_cache: false          # true: tenants share cached prefixes (see below)
      smollm2-135m-instruct:
        scales_to_zero: true               # may have no replica: hold requests, do not refuse
    expose_deployments: true    # also serve each deployment under its own name

A deployment is a model id the router knows. Deployments that are not up
right now are skipped when picking, so a canary can be listed before it runs.
When none of an alias's deployments is up but one `scales_to_zero`, that one
is routed to: the gateway holds the request while a replica starts
(cold_start_hold.py) instead of answering 503.

The operator's routes (one fragment per ModelDeployment, from its ConfigMap)
are merged over this file's table with `merged`: the file keeps its tiers, and
a name the file already routes stays the file's.

A tier's pool is that tier's alone, however it is named: a deployment that
serves only tier pools (it is in no alias's routes) cannot be named directly
by a tenant of another tier, nor is it listed for one. Such a request is
answered as for an unknown model (404 model_not_found), OpenAI's answer for a
model the key may not use.

Each tenant's cached prefixes are its own: a hit would tell a tenant what
another sent (services/common/block_hash.py). `share_prefix_cache: true` asks a
deployment's engines to pool them across tenants (public system prompts); only
engines started with --prefix-cache-sharing=global (the ModelDeployment's
spec.engine.prefixCacheSharing) do.
"""

import hashlib
import random
from dataclasses import dataclass

import yaml
from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    # A typo in a config file should fail the load, not be silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Tier(_Strict):
    weight: float = Field(1.0, gt=0)
    priority: int = 0


class Target(_Strict):
    deployment: str = Field(min_length=1)
    weight: float = Field(1.0, gt=0)


class Alias(_Strict):
    routes: list[Target] = Field(min_length=1)
    tiers: dict[str, list[Target]] = {}


class DeploymentOptions(_Strict):
    tokenizer: str | None = None
    max_in_flight: int | None = Field(None, gt=0)
    share_prefix_cache: bool = False
    scales_to_zero: bool = False


DEFAULT_TIERS = {
    "free": Tier(weight=1, priority=0),
    "standard": Tier(weight=2, priority=1),
    "premium": Tier(weight=4, priority=2),
}


@dataclass(frozen=True)
class Route:
    alias: str
    deployment: str
    tokenizer: str
    max_in_flight: int | None
    tier: Tier
    share_prefix_cache: bool = False
    scales_to_zero: bool = False  # with no ready replica, hold the request until one is


class NoDeploymentUpError(LookupError):
    """The alias exists, but none of its deployments is running now."""


class RoutingTable(_Strict):
    tiers: dict[str, Tier] = DEFAULT_TIERS
    models: dict[str, Alias] = {}
    deployments: dict[str, DeploymentOptions] = {}
    expose_deployments: bool = True

    @classmethod
    def from_yaml(cls, text: str) -> "RoutingTable":
        return cls.model_validate(yaml.safe_load(text) or {})

    def merged(self, fragments: list["RoutingTable"]) -> tuple["RoutingTable", list[str]]:
        """This table with each fragment's aliases and deployments added; names
        already taken keep their first owner. Returns the table and those names."""
        models, deployments = dict(self.models), dict(self.deployments)
        clashes = []
        for fragment in fragments:
            for own, theirs in ((models, fragment.models), (deployments, fragment.deployments)):
                for name, entry in theirs.items():
                    if name in own:
                        clashes.append(name)
                    else:
                        own[name] = entry
        return self.model_copy(update={"models": models, "deployments": deployments}), clashes

    def scales_to_zero(self, deployment: str) -> bool:
        options = self.deployments.get(deployment)
        return options is not None and options.scales_to_zero

    def tier(self, name: str) -> Tier:
        return self.tiers.get(name) or Tier()

    def names(self, running: set[str], tier: str | None = None) -> list[str]:
        """What a tenant of `tier` may ask for now (any tier's names when None):
        aliases with a deployment up, and deployments."""
        # A deployment at zero replicas is still served: its requests are held.
        running = running | {d for d, o in self.deployments.items() if o.scales_to_zero}
        aliases = {
            name
            for name, alias in self.models.items()
            if any(t.deployment in running for t in self._targets(alias, tier))
        }
        exposed = {d for d in running if self._exposed(d, tier)}
        return sorted(aliases | exposed)

    @staticmethod
    def _targets(alias: Alias, tier: str | None) -> list[Target]:
        if tier is None:
            return [t for targets in (alias.routes, *alias.tiers.values()) for t in targets]
        return alias.tiers.get(tier, alias.routes)

    def _exposed(self, deployment: str, tier: str | None) -> bool:
        """May a tenant of `tier` name this deployment directly?"""
        if not self.expose_deployments:
            return False
        pools = {
            name
            for alias in self.models.values()
            for name, targets in alias.tiers.items()
            if any(t.deployment == deployment for t in targets)
        }
        routed = any(
            t.deployment == deployment for alias in self.models.values() for t in alias.routes
        )
        return routed or not pools or tier is None or tier in pools

    def resolve(self, model: str, tier: str, session: str, running: set[str]) -> Route | None:
        """The deployment for this request; None if `model` is unknown to this tier."""
        alias = self.models.get(model)
        if alias is None:
            known = model in running or self.scales_to_zero(model)
            if not (known and self._exposed(model, tier)):
                return None
            deployment = model
        else:
            targets = [t for t in self._targets(alias, tier) if t.deployment in running]
            # None up: one that scales to zero will be, once the held request starts it.
            targets = targets or [
                t for t in self._targets(alias, tier) if self.scales_to_zero(t.deployment)
            ]
            if not targets:
                raise NoDeploymentUpError(model)
            deployment = pick(targets, f"{model}/{session}" if session else None)
        options = self.deployments.get(deployment) or DeploymentOptions()
        return Route(
            alias=model,
            deployment=deployment,
            tokenizer=options.tokenizer or deployment,
            max_in_flight=options.max_in_flight,
            tier=self.tier(tier),
            share_prefix_cache=options.share_prefix_cache,
            scales_to_zero=options.scales_to_zero,
        )


def pick(targets: list[Target], sticky_key: str | None) -> str:
    """Weighted choice; a session always lands on the same deployment while the
    weights stay, so one conversation does not hop between model versions."""
    total = sum(t.weight for t in targets)
    if sticky_key is None:
        point = random.random() * total
    else:
        digest = hashlib.blake2b(sticky_key.encode(), digest_size=8).digest()
        point = int.from_bytes(digest, "little") / 2**64 * total
    for target in targets:
        point -= target.weight
        if point < 0:
            return target.deployment
    return targets[-1].deployment
