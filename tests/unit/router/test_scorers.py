import pytest

from maas_services.router.scorers import lower_is_better
from maas_services.router.scorers.kv_cache import KvCacheScorer
from maas_services.router.scorers.least_requests import LeastRequestsScorer
from maas_services.router.scorers.prefix import PrefixScorer
from maas_services.router.scorers.queue import QueueScorer
from maas_services.router.scorers.session import SessionScorer
from tests.unit.router.helpers import blocks, context, deps, endpoint

PROMPT = list(range(100))  # 6 full blocks of 16 and a partial one


def test_prefix_scores_the_share_of_leading_blocks_held():
    d = deps()
    hashes = blocks(PROMPT)
    d.index.stored("a", hashes)
    d.index.stored("b", hashes[:3])
    d.index.stored("c", hashes[3:])  # no first block: nothing of it is a prefix
    scores = PrefixScorer(d.index, d.history).score(
        context(PROMPT), [endpoint("a"), endpoint("b"), endpoint("c")]
    )
    assert scores == [1.0, 0.5, 0.0]


def test_prefix_hashes_with_each_engines_block_size_and_salt():
    d = deps()
    d.index.stored("a", blocks(PROMPT, 32))
    d.index.stored("b", blocks(PROMPT, engine_salt="other-salt"))
    scorer = PrefixScorer(d.index, d.history)
    a, b = endpoint("a", block_size=32), endpoint("b")
    assert scorer.score(context(PROMPT), [a, b]) == [1.0, 0.0]
    assert scorer.score(context(PROMPT), [endpoint("b", cache_salt="other-salt")]) == [1.0]


def test_prefix_falls_back_to_routing_history_beyond_what_events_cover():
    d = deps()
    hashes = blocks(PROMPT)
    d.index.stored("a", hashes[:2])
    d.history.record("a", hashes, now=100.0)
    assert PrefixScorer(d.index, d.history).score(context(PROMPT), [endpoint("a")]) == [1.0]


def test_prefix_of_a_prompt_shorter_than_a_block_is_zero():
    d = deps()
    assert PrefixScorer(d.index, d.history).score(context([1, 2]), [endpoint("a")]) == [0.0]


def test_queue_prefers_the_shorter_engine_queue():
    scores = QueueScorer().score(
        context(), [endpoint("a", waiting=4), endpoint("b", waiting=0), endpoint("c", waiting=2)]
    )
    assert scores == [0.0, 1.0, 0.5]


def test_least_requests_counts_own_picks_and_engine_reports():
    scores = LeastRequestsScorer().score(
        context(), [endpoint("a", picked_since_poll=3), endpoint("b", running=1), endpoint("c")]
    )
    assert scores == [0.0, 2 / 3, 1.0]


def test_kv_cache_prefers_free_blocks_absolutely():
    scores = KvCacheScorer().score(
        context(), [endpoint("a", kv_cache_usage=0.9), endpoint("b", kv_cache_usage=0.25)]
    )
    assert scores == pytest.approx([0.1, 0.75])


def test_session_prefers_one_stable_replica_per_session():
    replicas = [endpoint(name) for name in "abcd"]
    homes = {}
    for session in ("alice", "bob", "carol", "dave", "erin", "frank"):
        scores = SessionScorer().score(context(session_id=session), replicas)
        assert sorted(scores) == [0.0, 0.0, 0.0, 1.0]
        homes[session] = scores.index(1.0)
        # Same answer again, and from a fresh scorer (another router replica).
        assert SessionScorer().score(context(session_id=session), replicas) == scores
    assert len(set(homes.values())) > 1  # sessions spread out


def test_session_moves_only_the_sessions_of_a_replica_that_left():
    replicas = [endpoint(name) for name in "abcd"]
    for session in (f"s{i}" for i in range(40)):
        before = SessionScorer().score(context(session_id=session), replicas)
        home = replicas[before.index(1.0)]
        rest = [e for e in replicas if e.endpoint_id != "d"]
        after = SessionScorer().score(context(session_id=session), rest)
        if home.endpoint_id != "d":
            assert rest[after.index(1.0)] is home


def test_no_session_no_preference():
    assert SessionScorer().score(context(), [endpoint("a"), endpoint("b")]) == [0.0, 0.0]


def test_lower_is_better_scales_between_extremes():
    assert lower_is_better([2, 2]) == [1.0, 1.0]
    assert lower_is_better([0, 5, 10]) == [1.0, 0.5, 0.0]
