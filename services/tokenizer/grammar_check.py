"""Refuse an unusable grammar before it costs engine time.

The tokenizer service has the model's vocabulary, so it compiles each
request's grammar exactly as the engine will (services/engine/grammar) and
answers INVALID_ARGUMENT naming the problem. Compile work is bounded twice:
GrammarSpec.check caps the grammar's size and nesting before the compiler
runs, and the compile runs on the encode pool under a deadline. A compile
past the deadline cannot be interrupted (it is C++), but the caps bound how
long it can keep that thread, and the request is refused at the deadline.
The compiler is built on first use (xgrammar's import and a pass over the
vocabulary take seconds), off the event loop.
"""

import threading

from services.common.text_tokenizer import TextTokenizer
from services.engine.grammar.spec import GrammarSpec


class GrammarChecker:
    def __init__(self, tokenizer: TextTokenizer):
        self._tokenizer = tokenizer
        self._compiler = None
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Build the compiler now. Its cost is the vocabulary's, the same for every
        request, so callers run this outside a request's compile deadline: on a
        loaded machine it took longer than the deadline and refused a valid grammar."""
        self.compiler()

    def check(self, spec: GrammarSpec) -> None:
        """Raise GrammarError if the grammar cannot be compiled for this vocabulary."""
        self.compiler().compile(spec)

    def compiler(self):
        """Built once, with the engine's own rule for the vocabulary (grammar/vocab.py)."""
        with self._lock:
            if self._compiler is None:
                from services.engine.grammar.compiler import GrammarCompiler
                from services.engine.grammar.vocab import tokenizer_info

                self._compiler = GrammarCompiler(tokenizer_info(self._tokenizer))
            return self._compiler
