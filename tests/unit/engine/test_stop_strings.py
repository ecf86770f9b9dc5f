from hypothesis import given
from hypothesis import strategies as st

from maas_services.engine.stop_strings import StopStringMatcher


def feed(stops: list[str], deltas: list[str]) -> tuple[str, bool]:
    matcher = StopStringMatcher(stops)
    out = ""
    for delta in deltas:
        text, stopped = matcher.push(delta)
        out += text
        if stopped:
            return out, True
    return out + matcher.flush(), False


def test_stop_split_across_deltas_is_caught_and_not_emitted():
    assert feed(["STOP"], ["Hello ST", "O", "P and more"]) == ("Hello ", True)


def test_partial_match_that_fails_is_released():
    assert feed(["STOP"], ["Hello ST", "ART"]) == ("Hello START", False)


def test_earliest_of_several_stops_wins():
    assert feed(["world", "lo"], ["hello world"]) == ("hel", True)


def test_text_that_might_start_a_stop_is_held_back():
    matcher = StopStringMatcher(["\n\nUser:"])
    assert matcher.push("answer\n") == ("answer", False)
    assert matcher.push("\nUs") == ("", False)
    assert matcher.push("e") == ("", False)
    assert matcher.push("d") == ("\n\nUsed", False)


@given(
    text=st.text(alphabet="abc\n", max_size=40),
    stop=st.text(alphabet="abc\n", min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 40), max_size=8),
)
def test_any_split_gives_the_same_result_as_whole_text(text, stop, cuts):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    deltas = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    expected = (text[: text.find(stop)], True) if stop in text else (text, False)
    assert feed([stop], deltas) == expected


def test_the_stop_that_starts_first_wins_over_the_one_that_ends_first():
    assert feed(["abcd", "bc"], ["xab", "cd"]) == ("x", True)


class ReferenceMatcher:
    """The obvious matcher: search all held text, try every suffix of it."""

    def __init__(self, stops: list[str]):
        self.stops, self.held = stops, ""

    def push(self, delta: str) -> tuple[str, bool]:
        text = self.held + delta
        starts = [text.find(s) for s in self.stops if s in text]
        if starts:
            self.held = ""
            return text[: min(starts)], True
        keep = max(
            (
                size
                for stop in self.stops
                for size in range(1, min(len(stop), len(text) + 1))
                if stop.startswith(text[len(text) - size :])
            ),
            default=0,
        )
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep], False


@given(
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=6), min_size=1, max_size=5),
    deltas=st.lists(st.text(alphabet="abc", max_size=5), max_size=12),
)
def test_every_push_matches_the_reference_matcher(stops, deltas):
    matcher, reference = StopStringMatcher(stops), ReferenceMatcher(stops)
    for delta in deltas:
        result = matcher.push(delta)
        assert result == reference.push(delta)
        if result[1]:
            return
    assert matcher.flush() == reference.held
