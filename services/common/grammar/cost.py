"""Bound a grammar by what it costs to compile, read from its parsed form.

Characters say little: ten rules like `r3 ::= [^"\\nab]{4,128}` are 287
characters and took 37 s and 564 MB to compile. xgrammar 0.2.9 exposes no
state count, but parsing (Grammar.from_ebnf / from_json_schema / from_regex)
is cheap and linear, and the parsed grammar prints in one normal form, a rule
a line, with every repetition written `{min, max}` (max -1: unbounded) and
every character class as `[...]`. The compile precomputes, for each position
in the grammar where a character class may match, which of the vocabulary's
tokens can follow; a bounded repetition `x{m, n}` is unrolled into n such
positions. So what we count is what the compile does: rules, character
classes, and the sum of repetition bounds (docs/structured-outputs.md has the
measurements the caps come from).

The parse runs where the compile does, in the killable worker (worker.py):
it is C++ too, and a pathological schema must not cost a serving thread.
"""

import json
from dataclasses import dataclass

import xgrammar

from maas_services.common.grammar.spec import GrammarError, GrammarSpec


@dataclass(frozen=True)
class CostCaps:
    # From the table in docs/structured-outputs.md. A position where a wide
    # class may repeat costs up to ~20 ms of compile CPU on the EPYC measured
    # (the worst shape, distinct negated classes that end the grammar), so 256
    # bounds such a grammar near 5 s, half the compile deadline; the deadline
    # and the tenant's CPU budget bound whatever the proxy misses. Real schemas
    # and tool definitions (the benchmark's twenty, the e2e tests') use at most
    # 29 rules, 23 classes and 62 repetitions.
    rules: int = 512
    classes: int = 128
    repeat_bound: int = 256


@dataclass(frozen=True)
class GrammarCost:
    rules: int
    classes: int
    # Sum over `{m, n}` of n (of m where n is unbounded: the loop is one position).
    repeat_bound: int

    def check(self, caps: CostCaps = CostCaps()) -> None:
        """GrammarError naming the first cap this grammar is over."""
        for over, value, cap in (
            ("it has {} rules", self.rules, caps.rules),
            ("it has {} character classes", self.classes, caps.classes),
            (
                "its repetition bounds (the n of every {{m,n}}) add up to {}",
                self.repeat_bound,
                caps.repeat_bound,
            ),
        ):
            if value > cap:
                raise GrammarError(
                    f"the grammar is too costly to compile: {over.format(value)} after "
                    f"parsing; at most {cap}"
                )


def parse(spec: GrammarSpec) -> xgrammar.Grammar:
    """The spec as xgrammar's Grammar, not yet compiled; GrammarError if it does not parse."""
    try:
        return _parse(spec)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise GrammarError(f"invalid {spec.kind}: {error_message(exc)}") from None


def _parse(spec: GrammarSpec) -> xgrammar.Grammar:
    # JSON without free whitespace: with it a model may pad forever and never
    # close the object before max_tokens. json_schema keeps xgrammar's strict
    # mode (no properties the schema does not name, unless it says
    # additionalProperties), as OpenAI's strict schemas require.
    if spec.kind == "json_schema":
        return xgrammar.Grammar.from_json_schema(spec.text, any_whitespace=False)
    if spec.kind == "json_object":
        return xgrammar.Grammar.from_json_schema(
            '{"type": "object"}', any_whitespace=False, strict_mode=False
        )
    if spec.kind == "regex":
        return xgrammar.Grammar.from_regex(spec.text)
    if spec.kind == "choice":
        # JSON string literals are EBNF string literals, escapes included.
        rule = " | ".join(json.dumps(choice) for choice in spec.choices())
        return xgrammar.Grammar.from_ebnf(f"root ::= {rule}")
    return xgrammar.Grammar.from_ebnf(spec.text)


def measure(grammar: xgrammar.Grammar) -> GrammarCost:
    """Count rules, classes and repetition bounds in the grammar's normal form."""
    return count(str(grammar))


def count(normal_form: str) -> GrammarCost:
    """One pass over the printed grammar, skipping the insides of "strings" and [classes]."""
    rules = sum(1 for line in normal_form.splitlines() if " ::= " in line)
    classes = repeat_bound = 0
    text, i, end = normal_form, 0, len(normal_form)
    while i < end:
        char = text[i]
        if char in '"[':
            if char == "[":
                classes += 1
            i = _closing(text, i + 1, '"' if char == '"' else "]")
        elif char == "{":
            close = text.index("}", i)
            low, _, high = text[i + 1 : close].partition(",")
            high = int(high) if high.strip() else int(low)
            repeat_bound += int(low) if high < 0 else high
            i = close
        i += 1
    return GrammarCost(rules, classes, repeat_bound)


def _closing(text: str, i: int, quote: str) -> int:
    """The index of the unescaped `quote` that ends a string or class starting at i."""
    while text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i


def error_message(exc: Exception) -> str:
    # xgrammar's C++ errors start with "[time] /project/cpp/file.cc:line: ".
    text = str(exc).strip()
    if text.startswith("["):
        text = text.split(": ", 1)[-1]
    return text[:500]
