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
    adapters:                   # LoRA adapters (issue #34), named as a model
      sql-upper:                # the name tenants send as `model`
        deployment: smollm2-135m-instruct   # the base whose engines serve it
        source: /models/adapters/sql-upper  # its PEFT folder, as the engines see it
        tenants: [acme]         # who may use it; absent or empty: every tenant
        load: on-demand         # or preload (the operator loads it onto every replica)

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

An adapter is served by its base deployment's engines: a request naming it
goes to that deployment with the adapter's name (Route.adapter), which the
engine runs it with. An adapter with `tenants` is a 404 model_not_found for
any other tenant, as a tier's pool is, never a 403 that says it exists.
Adapters an engine was started with (--lora-modules), which the router
reports in DeploymentStats.adapters and this table does not list, are shared:
every tenant may use them, under the deployment reporting them
(`resolve`'s `shared`), except a name an earlier table listed as private
(`retiring`): engines report it until every replica has unloaded it, and
meanwhile it is no one's. An adapter must name a deployment this table
knows (in `deployments` or an alias's routes), and its name may be no
alias's or deployment's: a typo fails the load rather than routing nowhere.

Each tenant's cached prefixes are its own: a hit would tell a tenant what
another sent (services/common/block_hash.py). `share_prefix_cache: true` asks a
deployment's engines to pool them across tenants (public system prompts); only
engines started with --prefix-cache-sharing=global (the ModelDeployment's
spec.engine.prefixCacheSharing) do.
"""

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator


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


class Adapter(_Strict):
    """A LoRA adapter served on a base deployment's engines, under its own name."""

    deployment: str = Field(min_length=1)
    source: str = Field(min_length=1)
    tenants: tuple[str, ...] = ()
    # preload: the operator loads it onto every replica; on-demand: the gateway
    # loads it onto the replica picked for a request that finds it missing.
    load: Literal["on-demand", "preload"] = "on-demand"

    def visible_to(self, tenant: str) -> bool:
        return not self.tenants or tenant in self.tenants


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
    # The LoRA adapter the deployment's engines run the request with ("": the base),
    # and its PEFT folder when the gateway may load it on demand ("": it may not).
    adapter: str = ""
    adapter_source: str = ""


class NoDeploymentUpError(LookupError):
    """The alias exists, but none of its deployments is running now."""


class RoutingTable(_Strict):
    tiers: dict[str, Tier] = DEFAULT_TIERS
    models: dict[str, Alias] = {}
    deployments: dict[str, DeploymentOptions] = {}
    expose_deployments: bool = True
    adapters: dict[str, Adapter] = {}
    # Private adapters earlier tables listed and this one does not: never shared, though
    # engines report them until every replica has unloaded them. Not a field, so no
    # routes file can set it; RoutesWatcher carries it from table to table.
    _retired: frozenset[str] = PrivateAttr(frozenset())

    @model_validator(mode="after")
    def _adapters_known(self) -> "RoutingTable":
        known = self._named_deployments()
        for name, adapter in self.adapters.items():
            if adapter.deployment not in known:
                raise ValueError(
                    f"adapter {name!r} names deployment {adapter.deployment!r}, which this "
                    "table does not know (list it under `deployments` or an alias's routes)"
                )
            if name in self.models or name in known:
                raise ValueError(f"adapter {name!r} has the name of a model or deployment")
        return self

    def _named_deployments(self) -> set[str]:
        """Deployments the table names: its options' and its aliases' targets."""
        targets = {t.deployment for alias in self.models.values() for t in self._targets(alias)}
        return set(self.deployments) | targets

    @classmethod
    def from_yaml(cls, text: str) -> "RoutingTable":
        return cls.model_validate(yaml.safe_load(text) or {})

    def merged(self, fragments: list["RoutingTable"]) -> tuple["RoutingTable", list[str]]:
        """This table with each fragment's aliases and deployments added; names
        already taken keep their first owner. Returns the table and those names."""
        models, deployments = dict(self.models), dict(self.deployments)
        adapters = dict(self.adapters)
        clashes = []
        for fragment in fragments:
            # Aliases and adapters are both names a tenant sends: one namespace.
            for own, theirs, other in (
                (models, fragment.models, adapters),
                (deployments, fragment.deployments, {}),
                (adapters, fragment.adapters, models),
            ):
                for name, entry in theirs.items():
                    if name in own or name in other:
                        clashes.append(name)
                    else:
                        own[name] = entry
        update = {"models": models, "deployments": deployments, "adapters": adapters}
        return self.model_copy(update=update), clashes

    def retiring(self, previous: "RoutingTable") -> "RoutingTable":
        """This table, remembering the private adapters `previous` routed (or remembered)
        that it does not list; a name listed again takes this table's visibility."""
        private = {name for name, adapter in previous.adapters.items() if adapter.tenants}
        table = self.model_copy()
        table._retired = frozenset((previous._retired | private) - set(self.adapters))
        return table

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

    def adapter_names(
        self, running: set[str], tier: str, tenant: str, shared: Mapping[str, str]
    ) -> dict[str, str]:
        """The adapters a tenant may send now, each with its base deployment:
        this table's that it may see, and the shared ones (module docstring)."""
        listed = {
            name: adapter.deployment
            for name, adapter in self.adapters.items()
            if adapter.visible_to(tenant) and self._adapter_base(adapter.deployment, tier, running)
        }
        for name, deployment in shared.items():
            # A name the table or a running deployment owns resolves to that; one the
            # table once kept private, to nothing.
            owned = name in self.adapters or name in self.models or name in running
            withheld = owned or name in self._retired
            if not withheld and self._adapter_base(deployment, tier, running):
                listed[name] = deployment
        return listed

    def _adapter_base(self, deployment: str, tier: str, running: set[str]) -> bool:
        """May a tenant of `tier` reach this adapter's base deployment now?"""
        up = deployment in running or self.scales_to_zero(deployment)
        return up and self._pool_allows(deployment, tier)

    @staticmethod
    def _targets(alias: Alias, tier: str | None = None) -> list[Target]:
        if tier is None:
            return [t for targets in (alias.routes, *alias.tiers.values()) for t in targets]
        return alias.tiers.get(tier, alias.routes)

    def _exposed(self, deployment: str, tier: str | None) -> bool:
        """May a tenant of `tier` name this deployment directly?"""
        return self.expose_deployments and self._pool_allows(deployment, tier)

    def _pool_allows(self, deployment: str, tier: str | None) -> bool:
        """Is this deployment some alias's, or a pool of `tier`'s (or of no tier)?"""
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

    def resolve(
        self,
        model: str,
        tier: str,
        session: str,
        running: set[str],
        tenant: str = "",
        shared: Mapping[str, str] | None = None,
    ) -> Route | None:
        """The deployment for this request; None if `model` is unknown to this
        tier or tenant. `shared`: adapter -> deployment of the adapters engines
        were started with (module docstring)."""
        alias = self.models.get(model)
        if alias is None:
            adapter = self.adapters.get(model)
            if adapter is not None:
                if not adapter.visible_to(tenant):
                    return None
                return self._adapter_route(model, adapter.deployment, adapter.source, tier, running)
            known = model in running or self.scales_to_zero(model)
            if not known and shared and model in shared and model not in self._retired:
                return self._adapter_route(model, shared[model], "", tier, running)
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
        return self._route(model, deployment, tier)

    def _adapter_route(
        self, model: str, deployment: str, source: str, tier: str, running: set[str]
    ) -> Route | None:
        """The base deployment's route, with the adapter; None where its base is
        another tier's pool. `source` "": an adapter the gateway may not load."""
        if not self._pool_allows(deployment, tier):
            return None
        if deployment not in running and not self.scales_to_zero(deployment):
            raise NoDeploymentUpError(model)
        return replace(self._route(model, deployment, tier), adapter=model, adapter_source=source)

    def _route(self, model: str, deployment: str, tier: str) -> Route:
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
