"""Blocked terms in generated text, caught across stream chunks.

A term can arrive split over two deltas ("bad" then "word"), so each choice
holds back its last len(longest term) - 1 characters: nothing that could
still become the start of a term is sent before the next delta shows whether
it does. Matching is case-insensitive. `mask` replaces each match with
asterisks of the same length; `stop` sends the text before the match and
ends the choice with finish_reason "content_filter".

Logprobs would leak what the text hides, so the sampled tokens' strings are
screened the same way, as their own stream (token strings need not add up to
the detokenized text): an entry is held back while its token may still be
part of a term, its string masked where a match covers it, and with "stop"
the entries from the matching token on are dropped. An alternative in
top_logprobs is masked when it contains a term on its own.

Tool calls are screened too, once each call is read whole (screen_calls): the
model may spell a term with JSON escapes ("\\u0062ad") that the text filter
cannot see and the client decodes, so the function name and every string of
the arguments (keys and values) are screened as decoded. "mask" masks them in
place; "stop" lets out only the calls before the first with a term, and the
front ends the choice with finish_reason "content_filter".
"""

import json
import re
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import Counter

from maas.v1 import engine_pb2

BLOCKED = Counter("maas_gateway_blocked_terms", "Blocked terms found in output", ["action"])
# A JSON string literal, escapes included: arguments are json.dumps' output, so
# outside these there are only numbers, literals and punctuation.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


@dataclass
class Filtered:
    text: str
    # Set when a term was found and the action is "stop".
    stopped: bool = False
    logprobs: list[engine_pb2.TokenLogprob] = field(default_factory=list)


def _mask(text: str, spans: list[tuple[int, int]]) -> str:
    chars = list(text)
    for start, end in spans:
        chars[start:end] = "*" * (end - start)
    return "".join(chars)


@dataclass(frozen=True)
class Terms:
    pattern: re.Pattern
    holdback: int
    action: Literal["mask", "stop"]

    def scan(self, buffer: str, final: bool) -> tuple[list[tuple[int, int]], int]:
        """(matches to act on, how much of buffer is settled and may be sent)."""
        # Text past the boundary may still turn out to start a term; a match
        # that starts past it may still grow into a longer term, so both wait.
        boundary = len(buffer) if final else max(len(buffer) - self.holdback, 0)
        matches = [m.span() for m in self.pattern.finditer(buffer) if m.start() < boundary]
        return matches, max([boundary, *(end for _, end in matches)])

    def mask_alternatives(self, lp: engine_pb2.TokenLogprob) -> engine_pb2.TokenLogprob:
        screened = engine_pb2.TokenLogprob()
        screened.CopyFrom(lp)
        for alternative in screened.top_logprobs:
            alternative.token = self.pattern.sub(lambda m: "*" * len(m.group()), alternative.token)
        return screened


@dataclass
class ChoiceFilter:
    """One choice's held-back text and logprob entries."""

    terms: Terms
    tail: str = ""
    pending: list[engine_pb2.TokenLogprob] = field(default_factory=list)

    def push(self, text: str, logprobs: list, final: bool) -> Filtered:
        buffer = self.tail + text
        matches, cut = self.terms.scan(buffer, final)
        kept, token_stop = self._tokens(logprobs, final)
        if matches:
            BLOCKED.labels(self.terms.action).inc(len(matches))
        if (matches or token_stop) and self.terms.action == "stop":
            self.tail, self.pending = "", []
            before = buffer[: matches[0][0]] if matches else buffer[:cut]
            return Filtered(before, stopped=True, logprobs=kept)
        self.tail = buffer[cut:]
        return Filtered(_mask(buffer[:cut], matches), logprobs=kept)

    def _tokens(self, logprobs: list, final: bool) -> tuple[list, bool]:
        """Entries safe to send, and whether a term was found in the tokens."""
        pending = self.pending + [self.terms.mask_alternatives(lp) for lp in logprobs]
        buffer = "".join(lp.token for lp in pending)
        matches, cut = self.terms.scan(buffer, final)
        if matches and self.terms.action == "stop":
            cut = matches[0][0]
        masked = _mask(buffer, matches)
        released, offset = [], 0
        for lp in pending:
            end = offset + len(lp.token)
            if end > cut:
                break
            lp.token = masked[offset:end]
            released.append(lp)
            offset = end
        self.pending = pending[len(released) :]
        return released, bool(matches)


@dataclass
class StreamFilter:
    """The filter's state for one response, per choice index."""

    terms: Terms
    _choices: dict[int, ChoiceFilter] = field(default_factory=dict)

    def push(self, index: int, text: str, final: bool, logprobs: list = ()) -> Filtered:
        """Feed a delta of choice `index`; `final` flushes what is held back."""
        choice = self._choices.setdefault(index, ChoiceFilter(self.terms))
        return choice.push(text, list(logprobs), final)


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

    @property
    def ends_choices(self) -> bool:
        """Whether a blocked term ends its choice ("stop"), rather than being masked."""
        return self.enabled and self._action == "stop"

    def stream(self) -> StreamFilter:
        return StreamFilter(Terms(self._pattern, self._holdback, self._action))

    def screen_calls(self, calls: list[dict]) -> tuple[list[dict], bool]:
        """(the tool calls that may be sent, whether one was blocked).

        Calls are OpenAI's tool_calls dicts (tool_parsers.base.tool_call).
        With "stop", a call holding a term and every call after it are
        withheld: the choice ends there.
        """
        if not self.enabled:
            return calls, False
        passed = []
        for call in calls:
            screened, found = self._screen_call(call)
            if found:
                BLOCKED.labels(self._action).inc(found)
                if self._action == "stop":
                    return passed, True
            passed.append(screened)
        return passed, False

    def _screen_call(self, call: dict) -> tuple[dict, int]:
        """The call with its decoded name and strings masked, and how many terms were found."""
        function = call["function"]
        name, found = self._masked(function["name"])

        def literal(match: re.Match) -> str:
            nonlocal found
            masked, count = self._masked(json.loads(match.group()))
            found += count
            return json.dumps(masked) if count else match.group()

        arguments = _JSON_STRING.sub(literal, function["arguments"])
        return {**call, "function": {**function, "name": name, "arguments": arguments}}, found

    def _masked(self, text: str) -> tuple[str, int]:
        return self._pattern.subn(lambda m: "*" * len(m.group()), text)
