"""Refuse an unusable grammar before it costs engine time.

The tokenizer service has the model's vocabulary, so it compiles each
request's grammar exactly as the engine will (services/common/grammar) and
answers INVALID_ARGUMENT naming the problem. Compile work is bounded before
it starts and while it runs: GrammarSpec.check caps the text's size and
nesting, the cost caps (grammar/cost.py) what the parsed grammar holds, and
the compile runs in the deployment's worker process (grammar/worker.py), at a
lower CPU priority than serving, under a memory cap, killed at the deadline:
never on the encode pool's threads. The servicer decides who may compile
(compile_admission.py) and waits for the worker on a thread of its own.
The compiler is built on first use (a pass over the vocabulary and the
worker's start take seconds), outside any compile's deadline.
"""

import threading

from maas_services.common.grammar.spec import GrammarSpec
from maas_services.common.grammar.worker import WorkerLimits
from maas_services.common.text_tokenizer import TextTokenizer


class GrammarChecker:
    def __init__(self, tokenizer: TextTokenizer):
        self._tokenizer = tokenizer
        self._compiler = None
        self._lock = threading.Lock()

    def prepare(self, limits: WorkerLimits, cache_bytes: int, tenant_cache_bytes: int) -> None:
        """Build the compiler and start its worker now. Its cost is the vocabulary's, the
        same for every request, so callers run this outside a request's compile deadline:
        on a loaded machine it took longer than the deadline and refused a valid grammar."""
        with self._lock:
            if self._compiler is None:
                from maas_services.common.grammar.compiler import GrammarCompiler
                from maas_services.common.grammar.vocab import tokenizer_info

                self._compiler = GrammarCompiler(
                    tokenizer_info(self._tokenizer), limits, cache_bytes, tenant_cache_bytes
                )

    @property
    def prepared(self) -> bool:
        return self._compiler is not None

    @property
    def compiler(self):
        """The GrammarCompiler, once prepared."""
        return self._compiler

    def cached(self, spec: GrammarSpec, tenant: str) -> bool:
        """The tenant compiled this grammar already (it passed every check then)."""
        return self._compiler.cached(spec, tenant) is not None

    def check(self, spec: GrammarSpec, tenant: str) -> float:
        """CPU seconds the compile took; CompileFailed (a GrammarError) if the grammar
        cannot be used with this vocabulary, the seconds it took on it."""
        return self._compiler.compile_counted(spec, tenant)[1]
