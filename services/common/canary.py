"""How a canary's deployment is named, for the operator that creates it and billing that prices it.

A ModelDeployment's canary serves as a deployment of its own, `<model>-canary`
(its own router pool and routes), so a request it served is billed under that
name. Until the price table lists the canary itself, it costs what its model
costs: a canary is the same product on new code, and a rollout should not need
a second price entry to bill correctly.
"""

SUFFIX = "-canary"


def canary_deployment(model: str) -> str:
    return model + SUFFIX


def canary_of(deployment: str) -> str | None:
    """The model a canary deployment belongs to; None for a deployment that is no canary."""
    base = deployment.removesuffix(SUFFIX)
    return base if base != deployment and base else None
