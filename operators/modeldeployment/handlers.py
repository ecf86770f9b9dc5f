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

Drift: every engine Deployment the operator owns is watched too (drift.py).
When one is edited or deleted, what was last applied for its ModelDeployment
is applied again (server-side apply restores what the operator sets and
recreates what is gone), with a DriftRepaired or Recreated Event and the
Synced condition saying so. The autoscaler's timer is the safety net for what
the watch can miss (a delete while the watch was down): a Deployment it finds
gone is recreated the same way.

Adapters: each autoscaler tick starts a task beside it that loads
spec.adapters onto the replicas the tick saw and the canary's (their own
pool, asked in that task), and writes where each is from the last one that
finished (adapter_sync.py); a refused spec's are left as they are.
"""

import asyncio
import copy
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import kopf

from maas_operator.modeldeployment import crd_schema as s
from maas_operator.modeldeployment import metrics
from maas_operator.modeldeployment.adapter_spec import adapter_refusal, adapters
from maas_operator.modeldeployment.adapter_sync import (
    AdapterCalls,
    AdapterReport,
    AdapterSyncs,
    canary_replicas,
    sync_adapters,
)
from maas_operator.modeldeployment.admission import AdmissionPolicy, Refusal
from maas_operator.modeldeployment.autoscale import Dependencies, TickResult, tick
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.drift import DriftWatch, Repair, synced
from maas_operator.modeldeployment.kube import Credentials
from maas_operator.modeldeployment.model_store import CLAIM_REASONS, claim_refusal
from maas_operator.modeldeployment.reconcile import delete_owned, reconcile
from maas_operator.modeldeployment.resources import OWNER_LABEL, canary_wanted, selector_string
from maas_operator.modeldeployment.routes import RoutesConfigMap
from maas_operator.modeldeployment.spec import canary_model_id
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
    # By ModelDeployment uid: the owner and defaulted spec last applied, and the Synced
    # verdict of the last apply.
    applied: dict[str, tuple[dict, dict]] = field(default_factory=dict)
    synced: dict[str, Repair] = field(default_factory=dict)


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
        meta = body["metadata"]
        return (
            ctx.admission.refusal(spec)
            or adapter_refusal(meta["name"], spec)
            or await claim_refusal(ctx.deps.api, meta["namespace"], spec)
        )

    adapter_syncs = AdapterSyncs()

    def adapters_report(body, spec: dict, result: TickResult) -> AdapterReport | None:
        """The last finished sync of an admitted spec's adapters, if one finished since the
        last tick; starts the next on this tick's replicas (none known: none)."""
        previous = (body.get("status") or {}).get("adapters") or []
        wanted, replicas = adapters(spec), result.replicas
        calls = AdapterCalls(ctx.deps.load_adapter, ctx.deps.unload_adapter)
        canary = canary_model_id(body["metadata"]["name"], spec) if canary_wanted(spec) else ""

        async def run(entries: list[dict]) -> AdapterReport:
            # In the task, not the tick: a slow router answer delays the adapters only.
            everywhere = replicas + (
                await canary_replicas(ctx.deps.pool_stats, canary) if canary else []
            )
            return await sync_adapters(calls, wanted, everywhere, entries, ctx.clock())

        wanted_now = replicas is not None and bool(wanted or previous)
        return adapter_syncs.step(body["metadata"]["uid"], previous, run if wanted_now else None)

    def verdicts(body, refusal, conflict, available) -> list:
        summary = ready(refusal or conflict_refusal(conflict), available)
        repaired = ctx.synced.get(body["metadata"]["uid"])
        return [model_id_conflict(conflict), summary, *synced(repaired)]

    async def reconcile_owned(body, spec: dict, status: dict) -> dict[str, str]:
        """Apply every owned object of a (defaulted, admitted) spec; name -> outcome."""
        image = spec.get("image") or ctx.engine_image
        return await reconcile(
            ctx.deps.api,
            body,
            spec,
            image,
            _initial_replicas(spec, status),
            ctx.service_token_secret,
            ctx.vllm_image,
        )

    # One apply at a time per ModelDeployment (by uid): a repair reads, then applies,
    # and a spec rollout between the two would look like drift.
    applying: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
    drift = DriftWatch()

    async def repair(uid: str, status: dict, logger) -> None:
        """Apply again what was last applied for a ModelDeployment; Events for what changed.

        What was last applied, not the latest spec: a spec change is apply_spec's to
        roll out (and to announce), and a spec refused since keeps what it runs.
        """
        async with applying[uid]:
            # Read under the lock: a rollout that held it has just changed what this is.
            if uid not in ctx.applied:
                return  # never applied (refused), or being deleted
            owner, spec = ctx.applied[uid]
            result = await drift.repaired(lambda: reconcile_owned(owner, spec, status))
        if result is None:
            return  # nothing had drifted (the event was the operator's own apply)
        ctx.synced[uid] = result
        for kind, reason, message in result.events:
            kopf.event(owner, type=kind, reason=reason, message=message)
            logger.info("%s: %s", reason, message)

    # Every watched ModelDeployment's status by uid: the autoscaler's count, which a
    # recreated Deployment starts from (kopf keeps it current, no API call).
    @kopf.index(**resource, id="statuses")
    def statuses(body, status, **_):
        return {body["metadata"]["uid"]: dict(status)}

    @kopf.on.event(
        "apps", "v1", "deployments", labels={OWNER_LABEL: kopf.PRESENT}, registry=registry
    )
    async def owned_deployment_changed(event, body, logger, statuses: kopf.Index, **_):
        owner_uid = drift.owner_to_repair(event.get("type"), dict(body))
        if owner_uid is not None:
            known = list(statuses.get(owner_uid, []))
            await repair(owner_uid, known[0] if known else {}, logger)

    # Every watched ModelDeployment by the model ids it claims (kopf keeps it current);
    # the id names the handlers' kwarg (a nested function's would be its qualname).
    @kopf.index(**resource, id="model_claims")
    def model_claims(body, **_):
        claimant = Claimant.of(dict(body))
        return {model: claimant for model in claimant.ids}

    # A failed apply (the API server answering 500) is tried again within seconds.
    @kopf.on.create(**resource, backoff=ctx.interval_seconds * 5)
    @kopf.on.update(**resource, backoff=ctx.interval_seconds * 5)
    @kopf.on.resume(**resource, backoff=ctx.interval_seconds * 5)
    async def apply_spec(body, spec, status, patch, logger, model_claims: kopf.Index, **_):
        spec = defaulted_spec(dict(spec))

        refusal = await refusal_of(body, spec)
        conflict = _conflict(body, model_claims)
        previous = status.get("conditions") or []
        patch.status["conditions"] = merge_conditions(
            previous,
            verdicts(body, refusal, conflict, _available(previous)),
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
        uid = body["metadata"]["uid"]
        async with applying[uid]:
            outcomes = await reconcile_owned(dict(body), spec, dict(status))
            ctx.applied[uid] = (copy.deepcopy(dict(body)), spec)
        ctx.synced[uid] = Repair.applied()
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
        # First, so the deletes below are not taken for drift.
        ctx.applied.pop(meta["uid"], None)
        ctx.synced.pop(meta["uid"], None)
        applying.pop(meta["uid"], None)
        adapter_syncs.cancel(meta["uid"])
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
            # Gone although it was made: recreate it.
            if not body["metadata"].get("deletionTimestamp"):
                await repair(body["metadata"]["uid"], dict(body.get("status") or {}), logger)
            return
        refusal = await refusal_of(body, spec)
        # A refused spec keeps what it runs: no adapter is loaded or unloaded for it.
        if refusal is not None:
            adapter_syncs.cancel(body["metadata"]["uid"])
        report = None if refusal else adapters_report(body, spec, result)
        conditions = result.status["conditions"]
        result.status["conditions"] = merge_conditions(
            conditions,
            [
                *verdicts(body, refusal, _conflict(body, model_claims), _available(conditions)),
                *([report.condition] if report else []),
            ],
            body["metadata"].get("generation", 0),
            ctx.clock(),
        )
        if report is not None:
            result.status["adapters"] = report.entries
            result.events += report.events
        patch.status.update(result.status)
        metrics.record(body["metadata"]["namespace"], body["metadata"]["name"], result.status)
        for kind, reason, message in result.events:
            kopf.event(body, type=kind, reason=reason, message=message)
            logger.info("%s: %s", reason, message)

    return registry
