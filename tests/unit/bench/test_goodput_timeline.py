import pytest

from maas_tools.bench.client import RequestResult
from maas_tools.bench.goodput import Slo, goodput
from maas_tools.bench.stats import summarize
from maas_tools.bench.timeline import output_tokens_per_s


def timed(ttft: float, e2e: float, tokens: int = 11, **kw) -> RequestResult:
    return RequestResult(ttft=ttft, e2e=e2e, completion_tokens=tokens, **kw)


def test_goodput_counts_requests_meeting_every_given_slo():
    results = [
        timed(0.1, 1.1),  # TTFT 100 ms, TPOT 100 ms: meets both
        timed(0.5, 1.5),  # TTFT too slow
        timed(0.1, 3.1),  # TPOT 300 ms: too slow
        RequestResult(error="timeout"),  # an error meets nothing
    ]
    both = goodput(results, 2.0, Slo(ttft_ms=200, tpot_ms=150))
    assert both == {
        "slo": {"ttft_ms": 200, "tpot_ms": 150},
        "requests": 1,
        "requests_per_s": 0.5,
        "share": 0.25,
    }
    assert goodput(results, 2.0, Slo(ttft_ms=200))["requests"] == 2
    assert goodput(results, 2.0, Slo(tpot_ms=150))["requests"] == 2
    assert goodput(results, 2.0, Slo()) is None


def test_one_token_answers_meet_any_tpot_slo():
    assert Slo(tpot_ms=1).met(timed(0.1, 0.1, tokens=1))


def test_throughput_over_time_buckets_chunk_arrivals_per_second():
    origin = 100.0
    results = [
        # 4 tokens in 2 chunks: 2 tokens each, at 0.5 s and 2.2 s.
        RequestResult(completion_tokens=4, chunk_times=[100.5, 102.2]),
        RequestResult(completion_tokens=3, chunk_times=[100.1, 100.2, 100.9]),
        RequestResult(error="timeout", chunk_times=[100.3]),
        # No usage reported: a token per chunk.
        RequestResult(chunk_times=[102.5]),
    ]
    assert output_tokens_per_s(results, origin) == [5.0, 0.0, 3.0]
    assert output_tokens_per_s(results, origin, bucket_s=2.0) == [2.5, 1.5]
    assert output_tokens_per_s([], origin) == []


def test_summary_splits_classes_and_adds_goodput_and_timeline():
    results = [
        timed(0.1, 1.1, kind="chat", itl=[0.1] * 10, chunk_times=[10.5]),
        timed(0.1, 1.1, kind="chat", itl=[0.1] * 10),
        timed(3.0, 3.4, tokens=5, kind="long", itl=[0.1] * 4, chunk_times=[13.2]),
    ]
    summary = summarize(results, 4.0, origin=10.0, slo=Slo(ttft_ms=500))
    assert set(summary["classes"]) == {"chat", "long"}
    chat, long = summary["classes"]["chat"], summary["classes"]["long"]
    assert chat["requests"] == 2 and long["requests"] == 1
    assert chat["ttft_s"]["p99"] == pytest.approx(0.1)
    assert long["ttft_s"]["p99"] == pytest.approx(3.0)
    assert chat["goodput"]["share"] == 1.0 and long["goodput"]["share"] == 0.0
    assert summary["goodput"]["requests"] == 2
    assert summary["throughput_over_time"]["output_tokens_per_s"] == [11.0, 0.0, 0.0, 5.0]
    assert "classes" not in chat
    # One kind (or none): nothing to split, and no SLO: no goodput.
    plain = summarize(results[:2], 4.0)
    assert "classes" not in plain and plain["goodput"] is None
    assert "throughput_over_time" not in plain
