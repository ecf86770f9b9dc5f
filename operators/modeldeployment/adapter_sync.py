"""Keep spec.adapters loaded on the running replicas, and say where each one is.

Runs in the autoscaler's tick, on the pool statistics it already has: each
replica's adapters are its engine's LoadReport.adapters, as the router relays
them. A preload adapter missing on a ready replica is loaded there by
LoadAdapter (a replica that starts gets them from the adapters ConfigMap
before it is ready, resources.py; this covers a spec changed since, and an
engine that dropped one); an adapter gone from the spec, or whose source
changed, is unloaded by UnloadAdapter. On-demand adapters are loaded by
whoever routes a request to them; here they are only reported.

A canary (resources.py) runs the same spec.adapters on a deployment and router
pool of its own (`<model>-canary`): its replicas, from that pool
(canary_replicas), are synced in the same round as the main ones, under the
same bounds, so a change reaches them too rather than only their next start.

status.adapters lists each adapter with the replicas that report it, main and
canary alike (pod names: a canary's are `<name>-engine-canary-…`; Loaded means
on every serving replica of both), and the AdaptersReady condition says which
failed to load and why, in the engine's words: INVALID_ARGUMENT is
AdapterInvalid (a bad folder, a rank above the engine's maximum),
RESOURCE_EXHAUSTED AdapterSlotsFull, FAILED_PRECONDITION LoraDisabled. An
adapter refused as invalid or disabled is tried again only after
RETRY_REFUSED_SECONDS or when its source changes: the same files give the same
answer, and the engine's time is the tenants'.

The work of one sync is bounded whatever the spec asks: at most
LOADS_PER_REPLICA loads per replica, the replicas in parallel; the rest
follow on the next ones. And it runs beside the autoscaler, never in its way
(AdapterSyncs): an engine slow to answer LoadAdapter delays that
deployment's adapters, not its scaling.
"""

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field

import grpc

from maas_operator.modeldeployment.adapter_spec import Adapter
from maas_operator.modeldeployment.drain import Replica
from maas_operator.modeldeployment.grpc_clients import PoolStatsUnavailable, replicas_of
from maas_operator.modeldeployment.status import Condition, parse_timestamp, timestamp

LOADS_PER_REPLICA = 4
RETRY_REFUSED_SECONDS = 60.0
REASONS = {
    grpc.StatusCode.INVALID_ARGUMENT: "AdapterInvalid",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "AdapterSlotsFull",
    grpc.StatusCode.FAILED_PRECONDITION: "LoraDisabled",
}
# Unavailable, timed out, an engine from before LoadAdapter: tried again next tick.
OTHER_REASON = "AdapterLoadFailed"
# Answers that will not change until the files or the engine do.
REFUSED = ("AdapterInvalid", "LoraDisabled")
MESSAGE_CHARS = 1000

Event = tuple[str, str, str]  # (type, reason, message)


@dataclass(frozen=True)
class AdapterCalls:
    load: Callable[[str, str, str], Awaitable[None]]  # address, name, source
    unload: Callable[[str, str], Awaitable[bool]]  # address, name -> it was loaded


@dataclass(frozen=True)
class Failure:
    reason: str
    message: str
    at: float


@dataclass
class AdapterReport:
    """What to write: status.adapters, the AdaptersReady condition, Events to post."""

    entries: list[dict]
    condition: Condition
    events: list[Event] = field(default_factory=list)


def _failure(entry: dict | None, source: str) -> Failure | None:
    """The failure a previous tick recorded for this source, if any."""
    if not entry or entry.get("state") != "Failed" or entry.get("source") != source:
        return None
    at = parse_timestamp(entry.get("lastFailureTime")) or 0.0
    return Failure(entry["reason"], entry.get("message", ""), at)


def _refusal(exc: grpc.aio.AioRpcError, name: str, replica: Replica, now: float) -> Failure:
    reason = REASONS.get(exc.code(), OTHER_REASON)
    detail = exc.details() or exc.code().name
    return Failure(reason, f"adapter {name!r} on {replica.endpoint_id}: {detail}", now)


@dataclass
class _Sync:
    calls: AdapterCalls
    now: float
    # name -> endpoint ids of the serving replicas that have it
    loaded: dict[str, set[str]]
    failures: dict[str, Failure] = field(default_factory=dict)
    stuck: dict[str, str] = field(default_factory=dict)  # name -> why an unload failed

    async def unload(self, replica: Replica, names: list[str]) -> None:
        for name in names:
            try:
                await self.calls.unload(replica.address, name)
            except grpc.aio.AioRpcError as exc:
                self.stuck[name] = f"on {replica.endpoint_id}: {exc.details() or exc.code().name}"
                continue
            self.loaded[name].discard(replica.endpoint_id)

    async def load(self, replica: Replica, adapters: list[Adapter]) -> None:
        for adapter in adapters[:LOADS_PER_REPLICA]:
            try:
                await self.calls.load(replica.address, adapter.name, adapter.path)
            except grpc.aio.AioRpcError as exc:
                self.failures.setdefault(
                    adapter.name, _refusal(exc, adapter.name, replica, self.now)
                )
                continue
            self.loaded[adapter.name].add(replica.endpoint_id)


async def canary_replicas(
    pool_stats: Callable[[str], Awaitable[object]], canary_model: str
) -> list[Replica]:
    """The canary's replicas as the router reports its pool; none while it knows none
    of them or does not answer (the next round asks again)."""
    try:
        stats = await pool_stats(canary_model)
    except PoolStatsUnavailable:
        return []
    return replicas_of(stats) if stats else []


def _retry_now(failure: Failure | None, now: float) -> bool:
    return (
        failure is None
        or failure.reason not in REFUSED
        or now - failure.at >= RETRY_REFUSED_SECONDS
    )


async def sync_adapters(
    calls: AdapterCalls,
    wanted: list[Adapter],
    replicas: list[Replica],
    previous: list[dict],
    now: float,
) -> AdapterReport:
    """Load and unload what differs from the spec; report where every adapter is."""
    before = {e["name"]: e for e in previous}
    serving = [r for r in replicas if r.ready and not r.draining]
    names = {a.name for a in wanted} | set(before)
    loaded = {n: {r.endpoint_id for r in serving if n in r.adapters} for n in names}
    sync = _Sync(calls, now, loaded)

    # Gone from the spec, or now from another folder: off every replica that has it.
    moved = {a.name for a in wanted if a.name in before and before[a.name].get("source") != a.path}
    stale = (set(before) - {a.name for a in wanted}) | moved
    await asyncio.gather(
        *(sync.unload(r, sorted(n for n in stale if n in r.adapters)) for r in serving)
    )

    previous_failures = {a.name: _failure(before.get(a.name), a.path) for a in wanted}
    missing = {
        r.endpoint_id: [
            a
            for a in wanted
            if a.preload
            and r.endpoint_id not in loaded[a.name]
            and _retry_now(previous_failures[a.name], now)
        ]
        for r in serving
    }
    await asyncio.gather(
        *(sync.load(r, missing[r.endpoint_id]) for r in serving if missing[r.endpoint_id])
    )

    entries, events = [], []
    for adapter in wanted:
        told, failure = previous_failures[adapter.name], sync.failures.get(adapter.name)
        # An Event when the answer is new, not at every retry that gets the same one.
        if failure is not None and (told is None or told.message != failure.message):
            events.append(("Warning", failure.reason, failure.message))
        failure = failure or told
        entries.append(_entry(adapter, sorted(loaded[adapter.name]), len(serving), failure))
    for name in sorted(stale - moved):
        if loaded[name]:
            entry = {"name": name, "state": "Unloading", "replicas": sorted(loaded[name])}
            if name in sync.stuck:
                entry["message"] = f"UnloadAdapter failed {sync.stuck[name]}"
            entries.append(entry)
    return AdapterReport(entries, _condition(entries, len(serving)), events)


def _entry(adapter: Adapter, where: list[str], serving: int, failure: Failure | None) -> dict:
    entry = {"name": adapter.name, "source": adapter.path, "load": adapter.load, "replicas": where}
    if not adapter.preload:
        entry["state"] = "OnDemand"
    elif serving and len(where) == serving:
        entry["state"] = "Loaded"
    elif failure is not None:
        entry |= {
            "state": "Failed",
            "reason": failure.reason,
            "message": failure.message[:MESSAGE_CHARS],
            "lastFailureTime": timestamp(failure.at),
        }
    else:
        entry["state"] = "Loading" if serving else "Pending"
    return entry


def _condition(entries: list[dict], serving: int) -> Condition:
    failed = [e for e in entries if e["state"] == "Failed"]
    if failed:
        message = "; ".join(e["message"] for e in failed)[:MESSAGE_CHARS]
        return Condition("AdaptersReady", False, failed[0]["reason"], message)
    loading = [e for e in entries if e["state"] == "Loading"]
    if loading:
        message = ", ".join(
            f"{e['name']} on {len(e['replicas'])} of {serving} replicas" for e in loading
        )
        return Condition("AdaptersReady", False, "AdaptersLoading", message[:MESSAGE_CHARS])
    if any(e["state"] == "Pending" for e in entries):
        return Condition(
            "AdaptersReady", True, "NoReadyReplicas", "preload adapters load as replicas start"
        )
    return Condition("AdaptersReady", True, "AdaptersLoaded", "every preload adapter is loaded")


@dataclass
class AdapterSyncs:
    """One sync at a time per ModelDeployment (by uid), as a task of its own: each
    autoscaler tick collects the one that finished since and starts the next."""

    _tasks: dict[str, asyncio.Task] = field(default_factory=dict)

    def step(
        self,
        uid: str,
        previous: list[dict],
        run: Callable[[list[dict]], Coroutine[None, None, AdapterReport]] | None,
    ) -> AdapterReport | None:
        """The report of the sync that finished, if one did; then run(the latest
        entries) starts unless a sync is still running or run is None."""
        task = self._tasks.get(uid)
        if task is not None and not task.done():
            return None
        report = self._tasks.pop(uid).result() if task is not None else None
        if run is not None:
            self._tasks[uid] = asyncio.create_task(run(report.entries if report else previous))
        return report

    def cancel(self, uid: str) -> None:
        task = self._tasks.pop(uid, None)
        if task is not None:
            task.cancel()
