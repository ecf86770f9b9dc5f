from benchmarks.order import in_turn


def test_sides_alternate_a_b_then_b_a_round_by_round():
    runs = [side for round_ in range(4) for side in in_turn({"a": 1, "b": 2}, round_)]
    assert runs == ["a", "b", "b", "a", "a", "b", "b", "a"]
