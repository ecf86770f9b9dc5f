"""maas top's percentiles agree with PromQL's histogram_quantile."""

import math

import pytest

from maas_tools.top.quantiles import histogram_quantile, window

# 10 observations: 4 under 0.1 s, 4 more under 0.5 s, 2 over 1 s.
BUCKETS = {0.1: 4.0, 0.5: 8.0, 1.0: 8.0, math.inf: 10.0}


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.2, 0.05), (0.4, 0.1), (0.5, 0.2), (0.8, 0.5), (0.99, 1.0)],
)
def test_interpolates_inside_the_bucket_like_promql(q, expected):
    assert histogram_quantile(q, BUCKETS) == pytest.approx(expected)


def test_no_observations_is_no_answer_not_zero():
    assert histogram_quantile(0.5, {}) is None
    assert histogram_quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None


def test_a_window_holds_only_what_happened_between_two_scrapes():
    before = {0.1: 4.0, 0.5: 4.0, 1.0: 4.0, math.inf: 4.0}
    assert window(BUCKETS, before) == {0.1: 0.0, 0.5: 4.0, 1.0: 4.0, math.inf: 6.0}
    assert window(BUCKETS, None) == BUCKETS


def test_a_restarted_process_counts_everything_it_holds():
    restarted = {0.1: 1.0, math.inf: 1.0}
    assert window(restarted, BUCKETS) == restarted
