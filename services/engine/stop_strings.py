"""Stop strings over a stream of text deltas.

A stop string can be split across tokens, so text that might be the start of
one is held back until it is either completed (generation stops, and the stop
string is not emitted) or ruled out (the held text is released). When one
delta completes several stops, the one that starts first wins.

Matching runs in the engine thread on every token, so it must not grow with
the length of the stops or of the text: the stops form one Aho-Corasick
automaton, whose state is exactly the held text (the longest suffix of the
text so far that is a prefix of some stop). A delta costs O(len(delta) +
longest stop) however many stops there are and however long the output.
"""

from dataclasses import dataclass, field
from functools import lru_cache

_ROOT = 0


@dataclass(frozen=True)
class _Automaton:
    goto: list[dict[str, int]]
    fail: list[int]
    depth: list[int]
    # Length of the longest stop that is a suffix of the node's string; 0: none.
    match: list[int]

    def step(self, node: int, char: str) -> int:
        while char not in self.goto[node] and node != _ROOT:
            node = self.fail[node]
        return self.goto[node].get(char, _ROOT)


@lru_cache(maxsize=256)
def _automaton(stops: tuple[str, ...]) -> _Automaton:
    """The Aho-Corasick automaton of `stops`; the n samples of a request share one."""
    goto: list[dict[str, int]] = [{}]
    depth, match = [0], [0]
    for stop in stops:
        node = _ROOT
        for char in stop:
            if char not in goto[node]:
                goto.append({})
                depth.append(depth[node] + 1)
                match.append(0)
                goto[node][char] = len(goto) - 1
            node = goto[node][char]
        match[node] = len(stop)
    fail = [_ROOT] * len(goto)
    automaton = _Automaton(goto, fail, depth, match)
    # Breadth first, so a node's fallback (shallower) is final before it is used.
    queue = list(goto[_ROOT].values())
    for node in queue:
        for char, child in goto[node].items():
            fallback = _ROOT if node == _ROOT else automaton.step(fail[node], char)
            fail[child] = fallback
            match[child] = match[child] or match[fallback]
            queue.append(child)
    return automaton


@dataclass
class StopStringMatcher:
    stops: list[str]
    _held: str = field(default="", init=False)
    _node: int = field(default=_ROOT, init=False)

    def __post_init__(self) -> None:
        self._automaton = _automaton(tuple(s for s in self.stops if s))

    def push(self, delta: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was reached)."""
        text = self._held + delta
        automaton, node, cut = self._automaton, self._node, len(text)
        for end, char in enumerate(delta, start=len(self._held) + 1):
            node = automaton.step(node, char)
            if automaton.match[node]:
                cut = min(cut, end - automaton.match[node])
        if cut < len(text):
            self._held, self._node = "", _ROOT
            return text[:cut], True
        keep = automaton.depth[node]
        self._node = node
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep], False

    def flush(self) -> str:
        held, self._held, self._node = self._held, "", _ROOT
        return held
