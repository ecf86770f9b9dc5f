import pytest

from maas_tools.bench.client import RequestResult
from maas_tools.bench.engine_metrics import hit_rates, parse
from maas_tools.bench.stats import distribution, summarize


def test_distribution_uses_nearest_observed_rank():
    summary = distribution([float(v) for v in range(1, 101)])
    assert summary["mean"] == pytest.approx(50.5)
    assert (summary["p50"], summary["p90"], summary["p99"]) == (50.0, 90.0, 99.0)
    assert distribution([]) == {}


def test_tpot_excludes_the_first_token():
    result = RequestResult(ttft=1.0, e2e=2.5, completion_tokens=4)
    assert result.tpot == pytest.approx(0.5)
    assert RequestResult(ttft=1.0, e2e=1.0, completion_tokens=1).tpot is None


def test_summary_counts_errors_by_kind_and_throughput_over_successes():
    results = [
        RequestResult(ttft=0.1, e2e=1.0, prompt_tokens=100, completion_tokens=10, itl=[0.1] * 9),
        RequestResult(ttft=0.3, e2e=2.0, prompt_tokens=100, completion_tokens=10, cached_tokens=80),
        RequestResult(error="http_503"),
        RequestResult(error="timeout"),
        RequestResult(error="http_503"),
    ]
    summary = summarize(results, wall_seconds=4.0)
    assert summary["errors"] == {"http_503": 2, "timeout": 1}
    assert summary["succeeded"] == 2
    assert summary["throughput"]["output_tokens_per_s"] == 5.0
    assert summary["ttft_s"]["mean"] == pytest.approx(0.2)
    assert summary["usage_cached_ratio"] == 0.4
    assert summary["itl_s"]["p50"] == pytest.approx(0.1)


METRICS = """# TYPE maas_engine_prefix_cache_queried_tokens counter
maas_engine_prefix_cache_queried_tokens_total {queried}
# TYPE maas_engine_prefix_cache_hit_tokens counter
maas_engine_prefix_cache_hit_tokens_total {hits}
# TYPE maas_engine_preemptions counter
maas_engine_preemptions_total 0.0
"""


def test_hit_rates_count_only_what_happened_between_scrapes():
    before = {
        "engine-0": parse(METRICS.format(queried=1000, hits=900)),
        "engine-1": parse(METRICS.format(queried=0, hits=0)),
    }
    after = {
        "engine-0": parse(METRICS.format(queried=1400, hits=1200)),
        "engine-1": parse(METRICS.format(queried=600, hits=100)),
    }
    rates = hit_rates(before, after)
    assert rates["hit_rate"] == pytest.approx(400 / 1000)
    assert rates["per_engine"]["engine-0"]["hit_rate"] == 0.75
    assert rates["per_engine"]["engine-1"]["queried_tokens"] == 600
