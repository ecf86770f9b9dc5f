"""Stop strings over a stream of text deltas.

A stop string can be split across tokens, so text that might be the start of
one is held back until it is either completed (generation stops, and the stop
string is not emitted) or ruled out (the held text is released).
"""

from dataclasses import dataclass, field


@dataclass
class StopStringMatcher:
    stops: list[str]
    _held: str = field(default="", init=False)

    def push(self, delta: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was reached)."""
        text = self._held + delta
        hits = [(text.find(s), s) for s in self.stops if s and s in text]
        if hits:
            cut = min(pos for pos, _ in hits)
            self._held = ""
            return text[:cut], True
        keep = self._longest_partial_suffix(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _longest_partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), best, -1):
                if stop.startswith(text[-size:]):
                    best = size
                    break
        return best
