from maas_services.router.pick_history import PickHistory


def test_recorded_blocks_are_held_until_their_ttl():
    history = PickHistory(ttl_seconds=10, max_blocks=100)
    history.record("a", [1, 2], now=0)
    assert history.holds("a", 1, now=9.9)
    assert not history.holds("b", 1, now=1)
    assert not history.holds("a", 1, now=10.1)


def test_recording_again_extends_the_ttl():
    history = PickHistory(ttl_seconds=10, max_blocks=100)
    history.record("a", [1], now=0)
    history.record("a", [1], now=8)
    assert history.holds("a", 1, now=15)


def test_forget_drops_a_guess_the_engine_settled():
    history = PickHistory(ttl_seconds=10, max_blocks=100)
    history.record("a", [1, 2], now=0)
    history.forget("a", [1])
    assert not history.holds("a", 1, now=1)
    assert history.holds("a", 2, now=1)


def test_oldest_entries_go_first_beyond_the_bound():
    history = PickHistory(ttl_seconds=10, max_blocks=3)
    history.record("a", [1, 2, 3], now=0)
    history.record("a", [4], now=1)
    assert [history.holds("a", h, now=2) for h in (1, 2, 3, 4)] == [False, True, True, True]


def test_remove_forgets_an_endpoint():
    history = PickHistory(ttl_seconds=10, max_blocks=3)
    history.record("a", [1], now=0)
    history.remove("a")
    assert not history.holds("a", 1, now=0)
