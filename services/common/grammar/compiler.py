"""Compile grammars against one vocabulary: checked, in a killable worker, cached per tenant.

The one way the engine and the tokenizer service compile a grammar. The
spec's cheap caps (spec.py) are checked here; the parse, the cost caps
(cost.py) and the compile run in the worker process under a deadline
(worker.py); what compiles is kept per tenant (cache.py), so a tenant's
repeated schema costs a lookup and nobody else's. Thread-safe: the worker
takes one compile at a time and callers wait for it on threads of their own.
"""

import weakref

import xgrammar

from maas_services.common.grammar.cache import TenantCache
from maas_services.common.grammar.spec import GrammarSpec
from maas_services.common.grammar.worker import GrammarWorker, WorkerLimits

CACHE_BYTES = 256 << 20
TENANT_CACHE_BYTES = 32 << 20


class GrammarCompiler:
    def __init__(
        self,
        info: xgrammar.TokenizerInfo,
        limits: WorkerLimits | None = None,
        cache_bytes: int = CACHE_BYTES,
        tenant_cache_bytes: int = TENANT_CACHE_BYTES,
    ):
        self.info = info
        self.worker = GrammarWorker(info.serialize_json(), limits or WorkerLimits())
        self._cache: TenantCache[xgrammar.CompiledGrammar] = TenantCache(
            cache_bytes, tenant_cache_bytes
        )
        # Started now, off any request's deadline: callers build this on a thread
        # of their own, with the first grammar (the engine core's compile thread,
        # the tokenizer's).
        self.worker.start()
        # A compiler dropped (a tokenizer deployment unloaded) takes its child with it.
        weakref.finalize(self, self.worker.close)

    def compile(self, spec: GrammarSpec, tenant: str = "") -> xgrammar.CompiledGrammar:
        """Raise GrammarError, naming what is wrong, for any grammar that cannot be used."""
        return self.compile_counted(spec, tenant)[0]

    def compile_counted(
        self, spec: GrammarSpec, tenant: str = ""
    ) -> tuple[xgrammar.CompiledGrammar, float]:
        """(the grammar, CPU seconds its compile took: 0 from the cache).

        Raises CompileFailed (a GrammarError) with the seconds a failed compile took.
        """
        spec.check()
        compiled = self.cached(spec, tenant)
        if compiled is not None:
            return compiled, 0.0
        answer = self.worker.compile(spec)
        compiled = xgrammar.CompiledGrammar.deserialize_json(answer.grammar_json, self.info)
        self._cache.put(tenant, spec.kind, spec.text, compiled, len(answer.grammar_json))
        return compiled, answer.cpu_seconds

    def cached(self, spec: GrammarSpec, tenant: str = "") -> xgrammar.CompiledGrammar | None:
        return self._cache.get(tenant, spec.kind, spec.text)
