"""What a request asks its output to follow, and the caps that bound compiling it.

A grammar is compiled before it costs engine time (the tokenizer service
checks it, services/tokenizer/grammar_check.py) and again, from its cache,
by the engine. The caps bound that work: compile time grows with the
schema's size and nesting, so both are limited before the compiler runs.
"""

import json
from dataclasses import dataclass

KINDS = ("json_schema", "json_object", "regex", "choice", "ebnf")
# A schema of this size covers real tool definitions many times over.
MAX_GRAMMAR_CHARS = 65_536
MAX_SCHEMA_DEPTH = 32
MAX_CHOICES = 1024


class GrammarError(ValueError):
    """The grammar cannot be used; the message says why, for the client."""


@dataclass(frozen=True)
class GrammarSpec:
    kind: str
    # json_schema: the schema as JSON; regex, ebnf: the source; choice: a JSON
    # array of strings; json_object: empty.
    text: str = ""

    def check(self) -> None:
        """Raise GrammarError if the spec is malformed or over a cap, before compiling."""
        if self.kind not in KINDS:
            raise GrammarError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if len(self.text) > MAX_GRAMMAR_CHARS:
            raise GrammarError(
                f"the {self.kind} is {len(self.text)} characters; at most {MAX_GRAMMAR_CHARS}"
            )
        if self.kind in ("regex", "ebnf") and not self.text:
            raise GrammarError(f"the {self.kind} is empty")
        if self.kind == "json_schema":
            depth = _depth(_json(self.text, "the JSON schema"))
            if depth > MAX_SCHEMA_DEPTH:
                raise GrammarError(
                    f"the JSON schema nests {depth} levels deep; at most {MAX_SCHEMA_DEPTH}"
                )
        if self.kind == "choice":
            self.choices()

    def choices(self) -> list[str]:
        choices = _json(self.text, "the choice list")
        if (
            not isinstance(choices, list)
            or not choices
            or not all(isinstance(c, str) and c for c in choices)
        ):
            raise GrammarError("the choice list must be a non-empty list of non-empty strings")
        if len(choices) > MAX_CHOICES:
            raise GrammarError(f"the choice list has {len(choices)} strings; at most {MAX_CHOICES}")
        return choices


def _json(text: str, what: str):
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise GrammarError(f"{what} is not valid JSON: {exc}") from None


def _depth(value) -> int:
    # Iterative: a hostile schema must not hit Python's recursion limit here.
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_SCHEMA_DEPTH:
            break
        children = (
            node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        )
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest
