"""Adapter affinity against round robin: 4 replicas, 16 LoRA adapters (issue #34).

What runs for real: the router's scheduler (its policies, filters, scorers and
picker, services/router/scheduler.py) and its Endpoints, which take in
LoadReports through the same Endpoint.apply_report as a GetLoad answer, and
count each pick as the servicer does (EnginePool.record_pick). What is
modelled: the engines. Starting four real engines that load adapters does not
fit this 2-core machine, so each replica is a simulated engine in simulated
time whose LoadReports, every --poll-interval, say what it holds:

- adapters resident: at most --max-cpu-loras, least recently used evicted
  first (an adapter in use is never evicted); a request for one not resident
  loads it, costing that request --load-seconds before its first token;
- a batch of --max-num-seqs requests over at most --max-loras distinct
  adapters (vLLM's and our engine's step limit): a request whose adapter
  would be one too many waits, later ones may pass it;
- a request holds its slot for --prefill-seconds + --decode-seconds; its
  time to first token is its wait + the load, if any + the prefill.

Requests arrive as a Poisson stream of --rate per second, each naming one of
--adapters adapters drawn by a Zipf law (exponent --zipf: a few hot ones and
a long tail), with a prompt of its own (no prefix sharing, so only the
adapter and load scorers decide). The JSON says `"engines": "simulated"`.
TTFT figures are therefore the model's, from the costs given; the loads
counted are the policy's own.

    python -m benchmarks.lora_affinity_bench --output benchmarks/results/lora_affinity.json
"""

import argparse
import heapq
import random
import statistics
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.machine import machine
from benchmarks.results_file import report
from maas.v1 import engine_pb2
from maas_services.router.endpoints import Endpoint
from maas_services.router.pick_history import PickHistory
from maas_services.router.plugin import PickContext, PluginDeps
from maas_services.router.policies import resolve
from maas_services.router.pool import EnginePool
from maas_services.router.prefix_index import PrefixIndex
from maas_services.router.scheduler import Profile
from maas_services.router.scorers.adapter import placement
from maas_services.router.settings import RouterSettings

MODEL = "m"
PROMPT_TOKENS = 64


@dataclass(frozen=True)
class EngineModel:
    max_num_seqs: int = 8
    max_loras: int = 4
    max_cpu_loras: int = 8
    load_seconds: float = 0.2
    prefill_seconds: float = 0.05
    decode_seconds: float = 1.0


@dataclass(frozen=True)
class Arrival:
    at: float
    adapter: str
    tenant: str = "t"


@dataclass
class Served:
    arrival: Arrival
    replica: str
    placement: str  # the router's view at the pick (scorers/adapter.py)
    loaded: bool = False  # the engine had to load the adapter for it
    evicted: tuple[str, ...] = ()  # what that load evicted
    ttft: float = 0.0


@dataclass
class SimReplica:
    endpoint: Endpoint
    engine: EngineModel
    resident: OrderedDict = field(default_factory=OrderedDict)  # adapter -> None, LRU first
    running: Counter = field(default_factory=Counter)  # adapter -> requests in the batch
    waiting: list = field(default_factory=list)  # Served, in arrival order

    def report(self) -> engine_pb2.LoadReport:
        return engine_pb2.LoadReport(
            model=MODEL,
            running=sum(self.running.values()),
            waiting=len(self.waiting),
            max_num_seqs=self.engine.max_num_seqs,
            adapters=list(self.resident),
            max_loras=self.engine.max_loras,
        )

    def admit(self, now: float) -> list[tuple[float, "SimReplica", str]]:
        """Start what fits in the batch; (finish time, self, adapter) for each started."""
        started, still = [], []
        for served in self.waiting:
            adapter = served.arrival.adapter
            fits = sum(self.running.values()) < self.engine.max_num_seqs and (
                adapter in self.running or len(self.running) < self.engine.max_loras
            )
            if not fits:
                still.append(served)
                continue
            delay = self._make_resident(served) if adapter not in self.resident else 0.0
            self.resident.move_to_end(adapter)
            self.running[adapter] += 1
            first_token = now + delay + self.engine.prefill_seconds
            served.ttft = first_token - served.arrival.at
            started.append((first_token + self.engine.decode_seconds, self, adapter))
        self.waiting = still
        return started

    def _make_resident(self, served: Served) -> float:
        served.loaded = True
        self.resident[served.arrival.adapter] = None
        evicted = []
        for name in list(self.resident):
            if len(self.resident) <= self.engine.max_cpu_loras:
                break
            if name not in self.running and name != served.arrival.adapter:
                del self.resident[name]
                evicted.append(name)
        served.evicted = tuple(evicted)
        return self.engine.load_seconds

    def finish(self, adapter: str) -> None:
        self.running[adapter] -= 1
        if not self.running[adapter]:
            del self.running[adapter]


def simulate(
    policy: str,
    arrivals: list[Arrival],
    replicas: int = 4,
    engine: EngineModel = EngineModel(),
    poll_interval: float = 0.1,
    preloaded: dict[str, list[str]] | None = None,
) -> list[Served]:
    """Route `arrivals` (sorted by time) over simulated replicas with the router's
    own scheduler; each request as it was served, in arrival order."""
    settings = RouterSettings(poll_interval_seconds=poll_interval)
    deps = PluginDeps(
        PrefixIndex(),
        PickHistory(settings.history_ttl_seconds, settings.history_max_blocks),
        settings,
    )
    profile = Profile(resolve(policy), deps)
    pool = []
    for i in range(replicas):
        endpoint = Endpoint(f"r{i}", f"r{i}:1", MODEL, reachable=True)
        sim = SimReplica(endpoint, engine)
        sim.resident.update(dict.fromkeys((preloaded or {}).get(endpoint.endpoint_id, ())))
        endpoint.apply_report(sim.report(), 0, 0.0)
        pool.append(sim)
    rng = random.Random(0)
    finishes: list = []  # heap of (time, tie, replica, adapter)
    served_all, next_poll, tie = [], poll_interval, 0
    for arrival in arrivals:
        while True:
            # Whichever comes first before this arrival: a request ending, a poll.
            upcoming = finishes[0][0] if finishes else float("inf")
            if min(upcoming, next_poll) > arrival.at:
                break
            if upcoming <= next_poll:
                now, _, sim, adapter = heapq.heappop(finishes)
                sim.finish(adapter)
                tie = _start(sim.admit(now), finishes, tie)
            else:
                for sim in pool:
                    sim.endpoint.apply_report(
                        sim.report(), sim.endpoint.picked_since_poll, next_poll
                    )
                next_poll += poll_interval
        ctx = PickContext(
            request_id=f"q{len(served_all)}",
            model=MODEL,
            token_ids=[rng.randrange(1, 49_000) for _ in range(PROMPT_TOKENS)],
            tenant=arrival.tenant,
            adapter=arrival.adapter,
            now=arrival.at,
        )
        decision = profile.pick(ctx, [sim.endpoint for sim in pool])
        chosen = next(sim for sim in pool if sim.endpoint is decision.endpoint)
        served = Served(
            arrival, chosen.endpoint.endpoint_id, placement(arrival.adapter, chosen.endpoint)
        )
        # As the servicer does after a pick.
        EnginePool.record_pick(chosen.endpoint, ctx.adapter, ctx.now)
        deps.history.record(chosen.endpoint.endpoint_id, ctx.block_hashes(chosen.endpoint), ctx.now)
        chosen.waiting.append(served)
        served_all.append(served)
        tie = _start(chosen.admit(arrival.at), finishes, tie)
    while finishes:
        now, _, sim, adapter = heapq.heappop(finishes)
        sim.finish(adapter)
        tie = _start(sim.admit(now), finishes, tie)
    return served_all


def _start(started, finishes: list, tie: int) -> int:
    for at, sim, adapter in started:
        heapq.heappush(finishes, (at, tie, sim, adapter))
        tie += 1
    return tie


def zipf_arrivals(
    requests: int, adapters: int, rate: float, zipf: float, seed: int = 1
) -> list[Arrival]:
    rng = random.Random(seed)
    names = [f"adapter-{i:02d}" for i in range(adapters)]
    weights = [1.0 / (rank + 1) ** zipf for rank in range(adapters)]
    at, arrivals = 0.0, []
    for _ in range(requests):
        at += rng.expovariate(rate)
        arrivals.append(Arrival(at, rng.choices(names, weights)[0]))
    return arrivals


def summary(served: list[Served]) -> dict:
    ttfts = sorted(s.ttft for s in served)
    per_replica = Counter(s.replica for s in served)
    return {
        "requests": len(served),
        "adapter_loads": sum(s.loaded for s in served),
        "evictions": sum(len(s.evicted) for s in served),
        "picked_where_loaded": sum(s.placement == "loaded" for s in served),
        "ttft_mean_s": round(statistics.fmean(ttfts), 4),
        "ttft_p50_s": round(ttfts[len(ttfts) // 2], 4),
        "ttft_p95_s": round(ttfts[int(len(ttfts) * 0.95)], 4),
        "requests_per_replica": dict(sorted(per_replica.items())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--adapters", type=int, default=16)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-loras", type=int, default=4)
    parser.add_argument("--max-cpu-loras", type=int, default=8)
    parser.add_argument("--load-seconds", type=float, default=0.2)
    parser.add_argument("--prefill-seconds", type=float, default=0.05)
    parser.add_argument("--decode-seconds", type=float, default=1.0)
    parser.add_argument("--poll-interval", type=float, default=0.1)
    parser.add_argument(
        "--policies", nargs="+", default=["round_robin", "least_load", "prefix_affinity"]
    )
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    engine = EngineModel(
        args.max_num_seqs,
        args.max_loras,
        args.max_cpu_loras,
        args.load_seconds,
        args.prefill_seconds,
        args.decode_seconds,
    )
    arrivals = zipf_arrivals(args.requests, args.adapters, args.rate, args.zipf)
    results = {
        name: summary(simulate(name, arrivals, args.replicas, engine, args.poll_interval))
        for name in args.policies
    }
    baseline = results.get("round_robin")
    if baseline:
        for result in results.values():
            result["loads_avoided_vs_round_robin"] = (
                baseline["adapter_loads"] - result["adapter_loads"]
            )
    report(
        {
            "benchmark": "lora_affinity",
            "engines": "simulated",
            "router": "real scheduler (services/router/scheduler.py) and Endpoint.apply_report",
            "config": {k: v for k, v in vars(args).items() if k != "output"},
            "policies": results,
            "machine": machine(),
        },
        args.output,
    )


if __name__ == "__main__":
    main()
