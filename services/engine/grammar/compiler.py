"""Compile grammars against one vocabulary, each distinct one once.

xgrammar's compiler keeps its own cache keyed by the grammar's source and
options, evicting the least recently used past a byte limit, which is the
bound this cache needs; a second request with the same schema costs a
lookup. JSON is compiled without free whitespace (any_whitespace=False):
with it a model may pad forever and never close the object before
max_tokens. json_schema keeps xgrammar's strict mode (no properties the
schema does not name, unless it says additionalProperties), as OpenAI's
strict schemas require; json_object is any object.
"""

import json

import xgrammar

from services.engine.grammar.spec import GrammarError, GrammarSpec

CACHE_BYTES = 256 << 20


class GrammarCompiler:
    def __init__(self, info: xgrammar.TokenizerInfo, cache_bytes: int = CACHE_BYTES):
        self.info = info
        self._compiler = xgrammar.GrammarCompiler(
            info, max_threads=1, cache_limit_bytes=cache_bytes
        )

    def compile(self, spec: GrammarSpec) -> xgrammar.CompiledGrammar:
        """Raise GrammarError, naming what is wrong, for any grammar that cannot be used."""
        spec.check()
        try:
            return self._compile(spec)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise GrammarError(f"invalid {spec.kind}: {_message(exc)}") from None

    def _compile(self, spec: GrammarSpec) -> xgrammar.CompiledGrammar:
        if spec.kind == "json_schema":
            return self._compiler.compile_json_schema(spec.text, any_whitespace=False)
        if spec.kind == "json_object":
            return self._compiler.compile_json_schema(
                '{"type": "object"}', any_whitespace=False, strict_mode=False
            )
        if spec.kind == "regex":
            return self._compiler.compile_regex(spec.text)
        if spec.kind == "choice":
            # JSON string literals are EBNF string literals, escapes included.
            rule = " | ".join(json.dumps(choice) for choice in spec.choices())
            return self._compiler.compile_grammar(f"root ::= {rule}")
        return self._compiler.compile_grammar(spec.text)


def _message(exc: Exception) -> str:
    # xgrammar's C++ errors start with "[time] /project/cpp/file.cc:line: ".
    text = str(exc).strip()
    if text.startswith("["):
        text = text.split(": ", 1)[-1]
    return text[:500]
