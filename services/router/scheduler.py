"""Runs a policy: filters, then weighted scorers, then the picker.

One Profile (built plugins) per deployment, kept while its policy and weights
stay the same, so stateful plugins such as the round-robin turn carry over.
"""

from dataclasses import dataclass

from maas_services.common.logging import get_logger
from maas_services.router.discovery import Routing
from maas_services.router.endpoints import Endpoint
from maas_services.router.plugin import PickContext, PluginDeps
from maas_services.router.policies import Policy, resolve
from maas_services.router.registry import FILTERS, PICKERS, SCORERS

log = get_logger(__name__)


@dataclass
class Decision:
    endpoint: Endpoint
    # Each scorer's unweighted score for the chosen endpoint.
    scores: dict[str, float]


class Profile:
    def __init__(self, policy: Policy, deps: PluginDeps):
        self.policy = policy
        self._filters = [FILTERS[name](deps) for name in policy.filters]
        # Scores only matter to a picker that reads them.
        weights = policy.weights if policy.picker == "max_score" else {}
        self._scorers = [(name, SCORERS[name](deps), w) for name, w in sorted(weights.items())]
        self._picker = PICKERS[policy.picker](deps)

    def pick(self, ctx: PickContext, endpoints: list[Endpoint]) -> Decision | None:
        for plugin in self._filters:
            endpoints = plugin.filter(ctx, endpoints)
        if not endpoints:
            return None
        totals = [0.0] * len(endpoints)
        raw: dict[str, list[float]] = {}
        for name, scorer, weight in self._scorers:
            raw[name] = scorer.score(ctx, endpoints)
            totals = [t + weight * s for t, s in zip(totals, raw[name], strict=True)]
        chosen = self._picker.pick(ctx, list(zip(endpoints, totals, strict=True)))
        position = endpoints.index(chosen)
        return Decision(chosen, {name: scores[position] for name, scores in raw.items()})


class Scheduler:
    def __init__(self, deps: PluginDeps):
        self._deps = deps
        settings = deps.settings
        self._default = resolve(settings.routing_policy, settings.routing_weights)
        # model -> (the routing it was built for, its profile)
        self._profiles: dict[str, tuple[Routing | None, Profile]] = {}

    def profile(self, model: str, routing: Routing | None) -> Profile:
        cached = self._profiles.get(model)
        if cached is not None and cached[0] == routing:
            return cached[1]
        policy = self._policy_for(model, routing)
        if cached is None or cached[1].policy != policy:
            profile = Profile(policy, self._deps)
        else:
            profile = cached[1]  # same plugins, same state (the round-robin turn)
        self._profiles[model] = (routing, profile)
        return profile

    def _policy_for(self, model: str, routing: Routing | None) -> Policy:
        if routing is None or not (routing.policy or routing.weights):
            return self._default
        try:
            return resolve(routing.policy or self._default.name, routing.weights)
        except ValueError as exc:
            # A deployment's bad setting falls back to the router's default, loudly.
            log.warning("bad_deployment_routing", model=model, error=str(exc))
            return self._default
