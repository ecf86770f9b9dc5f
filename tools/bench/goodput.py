"""Goodput: the requests that met the latency SLO, per second and as a share.

Throughput counts work done however late; goodput counts only requests a user
would call fast enough (DistServe's definition), so an overloaded server that
still streams many tokens, all late, scores low. Only the SLOs given count.
"""

from dataclasses import dataclass

from maas_tools.bench.client import RequestResult


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def given(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None

    def met(self, result: RequestResult) -> bool:
        if not result.ok or result.ttft is None:
            return False
        if self.ttft_ms is not None and result.ttft * 1000 > self.ttft_ms:
            return False
        # One-token answers have no TPOT; they meet any TPOT target.
        tpot = result.tpot
        return self.tpot_ms is None or tpot is None or tpot * 1000 <= self.tpot_ms


def goodput(results: list[RequestResult], wall_seconds: float, slo: Slo) -> dict | None:
    """None when no SLO was given: there is nothing to meet."""
    if not slo.given():
        return None
    good = sum(slo.met(r) for r in results)
    return {
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
        "requests": good,
        "requests_per_s": round(good / wall_seconds, 4) if wall_seconds else 0.0,
        # Failed requests count against it: an error meets no SLO.
        "share": round(good / len(results), 4) if results else 0.0,
    }
