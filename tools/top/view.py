"""What maas top draws: the pools, every engine replica, the gateway, the tenants
and, for a local stack, how often each process was restarted.

Rates are over the time between two snapshots; latency quantiles over a
window the frame names, because a percentile means nothing without one.
Anything that could not be read shows as "-", never as zero.
"""

from dataclasses import dataclass

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from maas.v1 import router_pb2
from maas_tools.top.quantiles import histogram_quantile, window
from maas_tools.top.snapshot import ENGINE, Snapshot

ENGINE_TTFT = "maas_engine_time_to_first_token_seconds"
ENGINE_TOKENS = "maas_engine_generation_tokens_total"
GATEWAY_TTFT = "maas_gateway_time_to_first_token_seconds"
GATEWAY_RESPONSES = "maas_gateway_http_responses_total"
GATEWAY_QUEUE = "maas_gateway_queue_depth"
TENANT_REQUESTS = "maas_billing_tenant_requests_total"
TENANT_TOKENS = "maas_billing_tenant_tokens_total"
DASH = "-"


@dataclass
class Frame:
    now: Snapshot
    rates_from: Snapshot | None  # per-second rates are measured since this snapshot
    latency_from: Snapshot | None  # the latency window's start; None: since each process began
    latency_window: str  # how the tables name that window

    def rate(self, source: str, name: str, **match: str) -> float | None:
        now = self.now.pages.get(source)
        before = self.rates_from.pages.get(source) if self.rates_from else None
        if now is None or before is None:
            return None
        elapsed = self.now.taken - self.rates_from.taken
        # A restarted process counts from zero again: no rate rather than a negative one.
        delta = now.total(name, **match) - before.total(name, **match)
        return delta / elapsed if elapsed > 0 and delta >= 0 else None

    def latency(self, source: str, histogram: str) -> tuple[float | None, float | None]:
        now = self.now.pages.get(source)
        if now is None:
            return None, None
        before = self.latency_from.pages.get(source) if self.latency_from else None
        buckets = window(now.buckets(histogram), before.buckets(histogram) if before else None)
        return histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets)


def seconds(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def number(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value:.{digits}f}"


def percent(ratio: float | None) -> str:
    return DASH if ratio is None else f"{ratio:.0%}"


def table(title: str, *columns: str) -> Table:
    return Table(
        *columns,
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )


def header(frame: Frame) -> Text:
    rates = (
        f"rates over the last {frame.now.taken - frame.rates_from.taken:.1f}s"
        if frame.rates_from
        else "no rates until the next frame"
    )
    return Text(f"maas top · {rates} · TTFT percentiles over {frame.latency_window}\n")


def missing(frame: Frame, source: str, flag: str) -> str:
    return "unreachable" if source in frame.now.pages else f"no {flag}"


def pools(frame: Frame) -> Table:
    out = table("pools (router)", "model", "ready", "queue", "running", "capacity", "KV", "policy")
    if frame.now.pool is None:
        out.add_row("router unreachable", *[DASH] * 6)
        return out
    for d in frame.now.pool.deployments:
        out.add_row(
            d.model,
            f"{d.ready_replicas}/{len(d.replicas)}",
            str(d.queue_depth),
            str(d.running),
            str(d.capacity),
            percent(d.kv_cache_usage),
            d.routing_policy,
        )
    return out


def state(replica: router_pb2.ReplicaStats | None) -> str:
    if replica is None:
        return "unknown to router"
    return "draining" if replica.draining else "ready" if replica.ready else "not ready"


def engines(frame: Frame) -> Table:
    out = table(
        "engine replicas",
        "replica",
        "state",
        "queue",
        "running",
        "KV",
        "tokens/s",
        "TTFT p50",
        "TTFT p99",
    )
    pool = frame.now.pool.deployments if frame.now.pool else ()
    replicas = {r.endpoint_id: r for d in pool for r in d.replicas}
    for name in sorted({*replicas, *frame.now.engine_ids}):
        source, replica = ENGINE + name, replicas.get(name)
        p50, p99 = frame.latency(source, ENGINE_TTFT)
        scraped = frame.now.pages.get(source) is not None
        out.add_row(
            name,
            state(replica) if scraped else f"{state(replica)}, no /metrics",
            str(replica.waiting) if replica else DASH,
            str(replica.running) if replica else DASH,
            percent(replica.kv_cache_usage) if replica else DASH,
            number(frame.rate(source, ENGINE_TOKENS)),
            seconds(p50),
            seconds(p99),
        )
    return out


def gateway(frame: Frame) -> Table:
    out = table(
        "gateway (as clients see it)",
        "2xx/s",
        "4xx/s",
        "5xx/s",
        "queued",
        "TTFT p50",
        "TTFT p99",
    )
    page = frame.now.pages.get("gateway")
    if page is None:
        out.add_row(missing(frame, "gateway", "--gateway-metrics"), *[DASH] * 5)
        return out

    def per_class(digit: str) -> float | None:
        statuses = [s for s in page.by_label(GATEWAY_RESPONSES, "status") if s.startswith(digit)]
        rates = [frame.rate("gateway", GATEWAY_RESPONSES, status=s) for s in statuses]
        return None if None in rates else sum(rates)

    p50, p99 = frame.latency("gateway", GATEWAY_TTFT)
    out.add_row(
        number(per_class("2")),
        number(per_class("4")),
        number(per_class("5")),
        number(page.total(GATEWAY_QUEUE), 0),
        seconds(p50),
        seconds(p99),
    )
    return out


def tenants(frame: Frame) -> Table:
    out = table(
        "tenants (billed)",
        "tenant",
        "requests",
        "req/s",
        "prompt tokens",
        "completion tokens",
        "tokens/s",
    )
    page = frame.now.pages.get("billing")
    if page is None:
        out.add_row(missing(frame, "billing", "--billing-metrics"), *[DASH] * 5)
        return out
    for tenant, requests in sorted(page.by_label(TENANT_REQUESTS, "tenant").items()):
        tokens = page.by_label(TENANT_TOKENS, "kind", tenant=tenant)
        prompt = frame.rate("billing", TENANT_TOKENS, tenant=tenant, kind="prompt")
        completion = frame.rate("billing", TENANT_TOKENS, tenant=tenant, kind="completion")
        out.add_row(
            tenant,
            number(requests, 0),
            number(frame.rate("billing", TENANT_REQUESTS, tenant=tenant)),
            number(tokens.get("prompt", 0.0), 0),
            number(tokens.get("completion", 0.0), 0),
            number(None if prompt is None or completion is None else prompt + completion),
        )
    return out


def processes(frame: Frame) -> Table:
    out = table("local processes (maas up)", "process", "restarts")
    for name, count in frame.now.restarts.items():
        out.add_row(name, str(count))
    return out


def render(frame: Frame) -> Group:
    tables = [pools(frame), engines(frame), gateway(frame), tenants(frame)]
    if frame.now.restarts:
        tables.append(processes(frame))
    return Group(header(frame), *(part for t in tables for part in (t, Text())))
