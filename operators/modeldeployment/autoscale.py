"""One autoscaler tick for one ModelDeployment: observe, decide, act, report.

The decision is the pure policy's; this module gathers its inputs (the
engine Deployment, the router's pool statistics), carries out scale changes
and drains, and returns the status to write and the Events to post.

A start from zero is a cold start: its Event says how many requests the
gateways hold, and the tick that first sees a ready replica posts how long it
took (status.coldStartSeconds, maas_operator_cold_start_seconds), measured
from the tick that asked for it, so to within one tick interval.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from maas_operator.modeldeployment import metrics, resources
from maas_operator.modeldeployment.drain import (
    DrainState,
    DrainStep,
    Replica,
    choose_victim,
    next_step,
)
from maas_operator.modeldeployment.grpc_clients import (
    PoolStatsUnavailable,
    load_adapter,
    replicas_of,
    unload_adapter,
)
from maas_operator.modeldeployment.kube import AUTOSCALER_MANAGER, KubeApi
from maas_operator.modeldeployment.policy import Action, AutoscalerState, Observation, decide
from maas_operator.modeldeployment.spec import autoscaling_config, drain_timeout_seconds, model_id
from maas_operator.modeldeployment.status import (
    conditions,
    merge_conditions,
    parse_timestamp,
    timestamp,
)

# Lower than any cost a person would set by hand: this pod goes first.
VICTIM_DELETION_COST = "-1000000"

EVENT_REASONS = {
    Action.STEADY: "Steady",
    Action.PREWARM: "Prewarm",
    Action.SCALE_OUT: "ScaleOut",
    Action.SCALE_IN: "DrainStarted",
    Action.BOUND: "ReplicaBounds",
    Action.COOLDOWN: "Cooldown",
    Action.AT_MAX: "AtMaxReplicas",
    Action.STABILIZING: "Stabilizing",
    Action.DRAINING: "Draining",
}
# Posted on every tick they happen; any other action only when it changes.
ALWAYS_POSTED = {Action.PREWARM, Action.SCALE_OUT, Action.BOUND}

Event = tuple[str, str, str]  # (type, reason, message)


@dataclass
class TickResult:
    status: dict
    events: list[Event] = field(default_factory=list)
    # The replicas the router reported (adapter_sync.py works on them); None: none known.
    replicas: list[Replica] | None = None


@dataclass
class Dependencies:
    api: KubeApi
    pool_stats: Callable[[str], Awaitable[object]]  # model -> DeploymentStats | None
    drain_engine: Callable[[str], Awaitable[int]]  # address -> requests still in flight
    # address, name, source; raises the engine's refusal (grpc.aio.AioRpcError)
    load_adapter: Callable[[str, str, str], Awaitable[None]] = load_adapter
    unload_adapter: Callable[[str, str], Awaitable[bool]] = unload_adapter  # address, name


def _drain_from_status(status: dict) -> DrainState | None:
    raw = (status.get("autoscaler") or {}).get("drain")
    if not raw:
        return None
    started = parse_timestamp(raw["startedAt"])
    return DrainState(raw["endpointId"], raw["address"], raw["pod"], started)


def _drain_to_status(drain: DrainState | None) -> dict | None:
    if drain is None:
        return None
    return {
        "endpointId": drain.endpoint_id,
        "address": drain.address,
        "pod": drain.pod,
        "startedAt": timestamp(drain.started_at),
    }


def _limited_reason(status: dict) -> str:
    for cond in status.get("conditions") or []:
        if cond.get("type") == "ScalingLimited" and cond.get("status") == "True":
            return cond.get("reason", "")
    return ""


async def find_pod(api: KubeApi, namespace: str, owner: str, endpoint_id: str, address: str):
    """The engine pod behind a router endpoint: by name, else by pod IP."""
    pod = await api.get("Pod", namespace, endpoint_id)
    labels = (pod or {}).get("metadata", {}).get("labels") or {}
    if labels.get(resources.OWNER_LABEL) == owner:
        return pod["metadata"]["name"]
    host = address.rsplit(":", 1)[0]
    for item in await api.list("Pod", namespace, resources.selector(owner)):
        owned = (item["metadata"].get("labels") or {}).get(resources.OWNER_LABEL) == owner
        if owned and (item.get("status") or {}).get("podIP") == host:
            return item["metadata"]["name"]
    return None


@dataclass
class _Tick:
    deps: Dependencies
    body: dict
    spec: dict
    now: float
    events: list[Event] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return self.body["metadata"]["namespace"]

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    async def set_replicas(self, replicas: int) -> None:
        await self.deps.api.apply(
            resources.replicas_only(self.body, replicas), manager=AUTOSCALER_MANAGER
        )

    async def finish_drain(self, drain: DrainState, replicas, asked: int) -> bool:
        """Lower replicas once the drained replica is idle; True when it is gone."""
        step = next_step(drain, replicas, self.now, drain_timeout_seconds(self.spec))
        if step is DrainStep.WAIT:
            return False
        await self.set_replicas(asked - 1)
        kind = "Warning" if step is DrainStep.TIMED_OUT else "Normal"
        self.events.append(
            (kind, "ScaledIn", f"removed pod {drain.pod} ({step.value}); {asked - 1} replicas")
        )
        return True

    async def start_drain(self, replicas) -> DrainState | None:
        victim = choose_victim(replicas)
        pod = victim and await find_pod(
            self.deps.api, self.namespace, self.name, victim.endpoint_id, victim.address
        )
        if not pod:
            who = victim.endpoint_id if victim else "no serving replica"
            self.events.append(("Warning", "DrainSkipped", f"no engine pod found for {who}"))
            return None
        # Mark the pod first, so whatever lowers replicas next removes this one.
        await self.deps.api.merge_patch(
            "Pod",
            self.namespace,
            pod,
            {"metadata": {"annotations": {resources.DELETION_COST: VICTIM_DELETION_COST}}},
        )
        in_flight = await self.deps.drain_engine(victim.address)
        self.events.append(
            ("Normal", "DrainStarted", f"draining pod {pod}: {in_flight} requests in flight")
        )
        return DrainState(victim.endpoint_id, victim.address, pod, self.now)


def _status(body: dict, **fields) -> dict:
    meta, previous = body["metadata"], body.get("status") or {}
    limited_reason, limited_message = fields.pop("limited")
    spec = fields.pop("spec")
    fields["canaryWeight"] = spec["canary"]["weight"] if resources.canary_wanted(spec) else 0
    fields["scaledToZero"] = fields["desiredReplicas"] == 0
    fields["conditions"] = merge_conditions(
        previous.get("conditions") or [],
        conditions(
            ready=fields["readyReplicas"],
            replicas=fields["replicas"],
            desired=fields["desiredReplicas"],
            min_replicas=fields.pop("min_replicas"),
            draining=bool(fields["autoscaler"]["drain"]),
            limited_reason=limited_reason,
            limited_message=limited_message,
        ),
        meta.get("generation", 0),
        fields.pop("now"),
    )
    fields["selector"] = resources.selector_string(meta["name"])
    fields["observedGeneration"] = meta.get("generation", 0)
    return fields


async def tick(deps: Dependencies, body: dict, spec: dict, now: float) -> TickResult | None:
    """None when there is nothing to scale yet (the Deployment does not exist)."""
    t = _Tick(deps, body, spec, now)
    previous = body.get("status") or {}
    deployment = await deps.api.get(
        "Deployment", t.namespace, resources.names(t.name)["deployment"]
    )
    if deployment is None:
        return None
    asked = deployment["spec"].get("replicas", 0)
    existing = (deployment.get("status") or {}).get("replicas", 0)
    config = autoscaling_config(spec)
    drain = _drain_from_status(previous)
    remembered = previous.get("autoscaler") or {}
    memory = AutoscalerState(
        last_scale_time=parse_timestamp(previous.get("lastScaleTime")),
        low_since=parse_timestamp(remembered.get("lowSince")),
        idle_since=parse_timestamp(remembered.get("idleSince")),
    )
    cold_since = parse_timestamp(remembered.get("coldStartSince"))

    try:
        stats = await deps.pool_stats(model_id(t.name, spec))
        blind = None if stats else ("NoPoolStats", "the router reports no replica of this model")
    except PoolStatsUnavailable as exc:
        stats, blind = None, ("RouterUnavailable", str(exc))
    if blind:
        # Without the queue there is nothing to decide: hold everything as it is.
        if _limited_reason(previous) != blind[0]:
            t.events.append(("Warning", blind[0], blind[1]))
        status = _status(
            body,
            replicas=existing,
            readyReplicas=(deployment.get("status") or {}).get("readyReplicas", 0),
            desiredReplicas=asked - (1 if drain else 0),
            queueDepth=0,
            utilization=0.0,
            lastAction=previous.get("lastAction", Action.STEADY.value),
            autoscaler={"lowSince": None, "drain": _drain_to_status(drain)},
            min_replicas=config.min_replicas,
            limited=blind,
            now=now,
            spec=spec,
        )
        return TickResult(status, t.events)

    replicas = replicas_of(stats)
    removed = bool(drain) and await t.finish_drain(drain, replicas, asked)
    if removed:
        # The next scale-in needs a whole new window, measured from this removal.
        drain, asked = None, asked - 1
        memory = replace(memory, low_since=now)
    draining = 1 if drain else 0
    # In flight covers a stream the engine has not reported as running yet.
    busy = max(stats.running, stats.in_flight)
    obs = Observation(now, stats.queue_depth, stats.ready_replicas, asked, draining, busy)
    decision = decide(config, obs, memory)
    desired = decision.desired_replicas - draining
    if decision.action is Action.SCALE_IN:
        # Never mark a second pod while the ReplicaSet may not have removed the first.
        drain = None if removed else await t.start_drain(replicas)
        if drain is None:
            desired = asked
    elif decision.desired_replicas != asked:
        await t.set_replicas(decision.desired_replicas)
    cold_since, cold_seconds = _cold_start(t, stats, previous, asked, decision, cold_since)
    posted = decision.action in ALWAYS_POSTED or decision.action.value != previous.get("lastAction")
    if posted and decision.action is not Action.SCALE_IN:  # start_drain posted its own
        t.events.append(("Normal", EVENT_REASONS[decision.action], decision.message))

    at_max = decision.action in (Action.AT_MAX, Action.SCALE_OUT)
    limited = (
        ("AtMaxReplicas" if at_max else "AtMinReplicas", decision.message)
        if decision.limited
        else ("", "")
    )
    last_scale = decision.state.last_scale_time
    status = _status(
        body,
        replicas=existing,
        readyReplicas=stats.ready_replicas,
        desiredReplicas=desired,
        queueDepth=stats.queue_depth,
        utilization=round(decision.utilization, 3),
        lastAction=decision.action.value,
        autoscaler={
            "lowSince": (
                None if decision.state.low_since is None else timestamp(decision.state.low_since)
            ),
            "drain": _drain_to_status(drain),
            "idleSince": (
                None if decision.state.idle_since is None else timestamp(decision.state.idle_since)
            ),
            "coldStartSince": None if cold_since is None else timestamp(cold_since),
        },
        min_replicas=config.min_replicas,
        limited=limited,
        now=now,
        spec=spec,
        heldRequests=stats.held,
    )
    if cold_seconds is not None:
        status["coldStartSeconds"] = cold_seconds
    if last_scale is not None:
        status["lastScaleTime"] = timestamp(last_scale)
    return TickResult(status, t.events, replicas)


def _cold_start(t: _Tick, stats, previous: dict, asked: int, decision, since: float | None):
    """Events for held requests and starts from zero; (start time kept, seconds if done)."""
    if stats.held and not previous.get("heldRequests"):
        t.events.append(
            ("Normal", "RequestsHeld", f"gateways hold {stats.held} requests: no replica is ready")
        )
    if asked == 0 and decision.desired_replicas > 0 and since is None:
        t.events.append(
            (
                "Normal",
                "ColdStart",
                f"starting {decision.desired_replicas} replicas from zero "
                f"for {stats.queue_depth} waiting requests ({stats.held} held)",
            )
        )
        return t.now, None
    if since is not None and stats.ready_replicas > 0:
        seconds = round(t.now - since, 3)
        metrics.COLD_START_SECONDS.labels(t.namespace, t.name).observe(seconds)
        t.events.append(("Normal", "ColdStarted", f"a replica is ready {seconds:.1f}s after start"))
        return None, seconds
    return since, None
