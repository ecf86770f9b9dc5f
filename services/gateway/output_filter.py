"""Blocked terms in generated text, caught across stream chunks.

A term can arrive split over two deltas ("bad" then "word"), so each choice
holds back its last len(longest term) - 1 characters: nothing that could
still become the start of a term is sent before the next delta shows whether
it does. Matching is case-insensitive. `mask` replaces each match with
asterisks of the same length; `stop` sends the text before the match and
ends the choice with finish_reason "content_filter".
"""

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import Counter

BLOCKED = Counter("maas_gateway_blocked_terms", "Blocked terms found in output", ["action"])


@dataclass
class Filtered:
    text: str
    # Set when a term was found and the action is "stop".
    stopped: bool = False


@dataclass
class StreamFilter:
    """The filter's state for one response: a held-back tail per choice index."""

    pattern: re.Pattern
    holdback: int
    action: Literal["mask", "stop"]
    _tails: dict[int, str] = field(default_factory=lambda: defaultdict(str))

    def push(self, index: int, text: str, final: bool) -> Filtered:
        """Feed a delta of choice `index`; `final` flushes what is held back."""
        buffer = self._tails[index] + text
        # Text past the boundary may still turn out to start a term; a match
        # that starts past it may still grow into a longer term, so both wait.
        boundary = len(buffer) if final else max(len(buffer) - self.holdback, 0)
        matches = [m for m in self.pattern.finditer(buffer) if m.start() < boundary]
        if matches:
            BLOCKED.labels(self.action).inc(len(matches))
            if self.action == "stop":
                self._tails[index] = ""
                return Filtered(buffer[: matches[0].start()], stopped=True)
        cut = max([boundary, *(m.end() for m in matches)])
        out, position = [], 0
        for match in matches:
            out += [buffer[position : match.start()], "*" * len(match.group())]
            position = match.end()
        out.append(buffer[position:cut])
        self._tails[index] = buffer[cut:]
        return Filtered("".join(out))


class OutputFilter:
    def __init__(self, terms: list[str], action: Literal["mask", "stop"] = "mask"):
        terms = [t for t in terms if t]
        self._action = action
        self._pattern = (
            re.compile("|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True)), re.I)
            if terms
            else None
        )
        self._holdback = max((len(t) for t in terms), default=1) - 1

    @property
    def enabled(self) -> bool:
        return self._pattern is not None

    def stream(self) -> StreamFilter:
        return StreamFilter(self._pattern, self._holdback, self._action)
