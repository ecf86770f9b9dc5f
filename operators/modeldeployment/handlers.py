"""kopf handlers for ModelDeployment, registered on a registry of their own.

A fresh registry per operator (not kopf's global one) lets the tests run the
real handlers against an emulated API server with their own login.

A spec the admission policy refuses (or whose pvc:// claim is no model store,
model_store.py) gets Ready=False with the reason and a Warning Event, and
nothing is created or changed (see status.ready). A ModelDeployment claiming a
model id an earlier one holds (maas_services.common.model_claims) is reconciled, but
gets ModelIdConflict=True and Ready=False: the router pools none of its
engines. kopf's index of every watched ModelDeployment by claimed id answers
that without an API call.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import kopf

from maas_operator.modeldeployment import crd_schema as s
from maas_operator.modeldeployment import metrics
from maas_operator.modeldeployment.admission import AdmissionPolicy, Refusal
from maas_operator.modeldeployment.autoscale import Dependencies, tick
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.kube import Credentials
from maas_operator.modeldeployment.model_store import CLAIM_REASONS, claim_refusal
from maas_operator.modeldeployment.reconcile import delete_owned, reconcile
from maas_operator.modeldeployment.resources import selector_string
from maas_operator.modeldeployment.routes import RoutesConfigMap
from maas_operator.modeldeployment.status import (
    conflict_refusal,
    merge_conditions,
    model_id_conflict,
    ready,
)
from maas_operator.modeldeployment.vllm_pod import DEFAULT_VLLM_IMAGE
from maas_services.common.model_claims import Claimant, Conflict, conflicts

FINALIZER = "maas.io/cleanup"
# A spec refused for its claim is looked at again after this many autoscaler intervals.
CLAIM_RECHECK_INTERVALS = 6


@dataclass
class OperatorContext:
    deps: Dependencies
    engine_image: str
    interval_seconds: float
    admission: AdmissionPolicy
    # The Secret whose service-token the engines demand, and whose vllm-api-key
    # vLLM servers do (docs/security.md); empty: none.
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


def _said(conditions: list[dict], refusal: Refusal) -> bool:
    """Ready already says this refusal: its Event was posted when it first did."""
    return any(
        c.get("type") == "Ready"
        and c.get("reason") == refusal.reason
        and c.get("message") == refusal.message
        for c in conditions
    )


def _conflict(body, model_claims: kopf.Index) -> Conflict | None:
    """The earlier ModelDeployment that holds one of this one's model ids, if any."""
    own = Claimant.of(dict(body))
    rivals = {c for model in own.ids for c in model_claims.get(model, [])}
    return conflicts(rivals | {own}).get(own.uid)


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

    async def refusal_of(body, spec: dict) -> Refusal | None:
        namespace = body["metadata"]["namespace"]
        return ctx.admission.refusal(spec) or await claim_refusal(ctx.deps.api, namespace, spec)

    def verdicts(refusal, conflict, available) -> list:
        summary = ready(refusal or conflict_refusal(conflict), available)
        return [model_id_conflict(conflict), summary]

    # Every watched ModelDeployment by the model ids it claims (kopf keeps it current);
    # the id names the handlers' kwarg (a nested function's would be its qualname).
    @kopf.index(**resource, id="model_claims")
    def model_claims(body, **_):
        claimant = Claimant.of(dict(body))
        return {model: claimant for model in claimant.ids}

    @kopf.on.create(**resource)
    @kopf.on.update(**resource)
    @kopf.on.resume(**resource)
    async def apply_spec(body, spec, status, patch, logger, model_claims: kopf.Index, **_):
        spec = defaulted_spec(dict(spec))

        refusal = await refusal_of(body, spec)
        conflict = _conflict(body, model_claims)
        previous = status.get("conditions") or []
        patch.status["conditions"] = merge_conditions(
            previous,
            verdicts(refusal, conflict, _available(previous)),
            body["metadata"].get("generation", 0),
            ctx.clock(),
        )
        if refusal is not None:
            if not _said(previous, refusal):
                kopf.event(body, type="Warning", reason=refusal.reason, message=refusal.message)
            # Below kopf's posting level: the Event above is the one the user sees.
            logger.info("refused: %s", refusal.message)
            if refusal.reason in CLAIM_REASONS:
                # The claim's labels change without the spec: look again later (the
                # status patch above is applied all the same).
                delay = ctx.interval_seconds * CLAIM_RECHECK_INTERVALS
                raise kopf.TemporaryError(refusal.message, delay=delay)
            return
        if conflict is not None:
            message = conflict_refusal(conflict).message
            kopf.event(body, type="Warning", reason="ModelIdConflict", message=message)
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
    async def autoscale(body, spec, patch, logger, model_claims: kopf.Index, **_):
        spec = defaulted_spec(dict(spec))
        result = await tick(ctx.deps, dict(body), spec, ctx.clock())
        if result is None:
            return
        conditions = result.status["conditions"]
        result.status["conditions"] = merge_conditions(
            conditions,
            verdicts(
                await refusal_of(body, spec),
                _conflict(body, model_claims),
                _available(conditions),
            ),
            body["metadata"].get("generation", 0),
            ctx.clock(),
        )
        patch.status.update(result.status)
        metrics.record(body["metadata"]["namespace"], body["metadata"]["name"], result.status)
        for kind, reason, message in result.events:
            kopf.event(body, type=kind, reason=reason, message=message)
            logger.info("%s: %s", reason, message)

    return registry
