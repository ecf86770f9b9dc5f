"""kopf handlers for ModelDeployment, registered on a registry of their own.

A fresh registry per operator (not kopf's global one) lets the tests run the
real handlers against an emulated API server with their own login.

A spec the admission policy refuses gets Ready=False with the reason and a
Warning Event, and nothing is created or changed (see status.ready).
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import kopf

from operators.modeldeployment import crd_schema as s
from operators.modeldeployment import metrics
from operators.modeldeployment.admission import AdmissionPolicy
from operators.modeldeployment.autoscale import Dependencies, tick
from operators.modeldeployment.defaults import defaulted_spec
from operators.modeldeployment.kube import Credentials
from operators.modeldeployment.reconcile import delete_owned, reconcile
from operators.modeldeployment.resources import selector_string
from operators.modeldeployment.routes import RoutesConfigMap
from operators.modeldeployment.status import merge_conditions, ready
from operators.modeldeployment.vllm_pod import DEFAULT_VLLM_IMAGE

FINALIZER = "maas.io/cleanup"


@dataclass
class OperatorContext:
    deps: Dependencies
    engine_image: str
    interval_seconds: float
    admission: AdmissionPolicy
    # The Secret whose service-token the engines demand (docs/security.md); empty: none.
    service_token_secret: str = ""
    # vLLM's image for backend-vllm specs that name none.
    vllm_image: str = DEFAULT_VLLM_IMAGE
    # Where the gateway's routes of every ModelDeployment go; None: nowhere (no gateway watches).
    routes: RoutesConfigMap | None = None
    login: Callable[..., kopf.ConnectionInfo | None] = kopf.login_via_client
    clock: Callable[[], float] = field(default=time.time)


def _initial_replicas(spec: dict, status: dict) -> int:
    """Keep the autoscaler's count across spec changes, inside the new bounds."""
    bounds = spec["replicas"]
    wanted = status.get("desiredReplicas", bounds["min"])
    return max(bounds["min"], min(bounds["max"], wanted))


def _available(conditions: list[dict]) -> bool | None:
    """The autoscaler's last Available verdict; None before its first."""
    found = [c["status"] == "True" for c in conditions if c.get("type") == "Available"]
    return found[0] if found else None


def build_registry(ctx: OperatorContext) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    resource = dict(group=s.GROUP, version=s.VERSION, plural=s.PLURAL, registry=registry)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_):
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="maas.io")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="maas.io")
        # Only our own Events and warnings become Events, not every handler's log line.
        settings.posting.level = logging.WARNING

    @kopf.on.login(registry=registry)
    def login(**kwargs):
        info = ctx.login(**kwargs)
        if info is not None:
            ctx.deps.api.update(Credentials.from_connection_info(info))
        return info

    @kopf.on.create(**resource)
    @kopf.on.update(**resource)
    @kopf.on.resume(**resource)
    async def apply_spec(body, spec, status, patch, logger, **_):
        spec = defaulted_spec(dict(spec))

        refusal = ctx.admission.refusal(spec)
        previous = status.get("conditions") or []
        patch.status["conditions"] = merge_conditions(
            previous,
            [ready(refusal, _available(previous))],
            body["metadata"].get("generation", 0),
            ctx.clock(),
        )
        if refusal is not None:
            kopf.event(body, type="Warning", reason=refusal.reason, message=refusal.message)
            # Below kopf's posting level: the Event above is the one the user sees.
            logger.info("refused: %s", refusal.message)
            return
        image = spec.get("image") or ctx.engine_image
        outcomes = await reconcile(
            ctx.deps.api,
            dict(body),
            spec,
            image,
            _initial_replicas(spec, dict(status)),
            ctx.service_token_secret,
            ctx.vllm_image,
        )
        changed = {k: v for k, v in outcomes.items() if v != "unchanged"}
        if changed:
            message = ", ".join(f"{k} {v}" for k, v in sorted(changed.items()))
            kopf.event(body, type="Normal", reason="Reconciled", message=message)
            logger.info("reconciled %s", message)
        if ctx.routes is not None:
            meta = body["metadata"]
            await ctx.routes.publish(ctx.deps.api, meta["namespace"], meta["name"], spec)
        patch.status["selector"] = selector_string(body["metadata"]["name"])

    @kopf.on.delete(**resource)
    async def cleanup(body, logger, **_):
        meta = body["metadata"]
        if ctx.routes is not None:
            await ctx.routes.withdraw(ctx.deps.api, meta["namespace"], meta["name"])
        deleted = await delete_owned(ctx.deps.api, meta["namespace"], meta["name"])
        logger.info("deleted %s", ", ".join(deleted) or "nothing")

    # A failed tick (an API call that timed out) retries at the next interval, not
    # after kopf's default minute: scaling must not go blind that long.
    @kopf.timer(**resource, interval=ctx.interval_seconds, backoff=ctx.interval_seconds)
    async def autoscale(body, spec, patch, logger, **_):
        spec = defaulted_spec(dict(spec))
        result = await tick(ctx.deps, dict(body), spec, ctx.clock())
        if result is None:
            return
        conditions = result.status["conditions"]
        result.status["conditions"] = merge_conditions(
            conditions,
            [ready(ctx.admission.refusal(spec), _available(conditions))],
            body["metadata"].get("generation", 0),
            ctx.clock(),
        )
        patch.status.update(result.status)
        metrics.record(body["metadata"]["namespace"], body["metadata"]["name"], result.status)
        for kind, reason, message in result.events:
            kopf.event(body, type=kind, reason=reason, message=message)
            logger.info("%s: %s", reason, message)

    return registry
