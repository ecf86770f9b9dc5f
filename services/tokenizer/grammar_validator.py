"""ValidateGrammar's work: admit the tenant, compile in the worker, charge the time.

The event loop never compiles and neither does the encode pool: the worker
process does (grammar_check.py), and a thread of this module's own small
pool waits for it, one per deployment's worker at a time (a compile waiting
for a busy worker waits here, on an asyncio lock, not on a thread). A
grammar the tenant compiled before is answered from its cache without
admission; any other is admitted (compile_admission.py) and its slot is
released, with the compile's CPU seconds charged, when the compile has
really ended, which for a call its client cancelled is later than the call.
"""

import asyncio
import weakref
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import Counter

from maas_services.common.grammar.spec import GrammarSpec
from maas_services.common.grammar.worker import CompileFailed, WorkerLimits
from maas_services.tokenizer.compile_admission import CompileAdmission
from maas_services.tokenizer.grammar_check import GrammarChecker

GRAMMAR_COMPILE_SECONDS = Counter(
    "maas_tokenizer_grammar_compile_cpu_seconds",
    "CPU seconds grammar compiles took in the worker, charged to their tenants",
)
GRAMMAR_CHECKS = Counter(
    "maas_tokenizer_grammar_checks",
    "Grammar checks by outcome: cached, compiled, invalid (refused or past the deadline)",
    ["outcome"],
)


class GrammarValidator:
    def __init__(
        self,
        limits: WorkerLimits,
        admission: CompileAdmission,
        cache_bytes: int,
        tenant_cache_bytes: int,
        threads: int = 4,
    ):
        self._limits = limits
        self._admission = admission
        self._cache = (cache_bytes, tenant_cache_bytes)
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="grammar-wait")
        # One lock per deployment's worker, so a thread waits only on a free worker.
        self._turns: weakref.WeakKeyDictionary[GrammarChecker, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    async def validate(self, checker: GrammarChecker, spec: GrammarSpec, tenant: str) -> float:
        """CPU seconds the compile took (0: cached). Raises GrammarError for an unusable
        grammar (CompileFailed past the deadline) and CompileRefused if not admitted."""
        spec.check()
        if checker.prepared and checker.cached(spec, tenant):
            GRAMMAR_CHECKS.labels("cached").inc()
            return 0.0
        # Admitted before the worker is started (seconds, once per deployment): a
        # tenant's second grammar meanwhile is refused at once, not after the start.
        self._admission.admit(tenant)
        compile_ = asyncio.ensure_future(self._compile(checker, spec, tenant))
        compile_.add_done_callback(lambda done: self._ended(tenant, done))
        # Shielded: a cancelled call leaves the compile to end, and release, on its own.
        return await asyncio.shield(compile_)

    async def _compile(self, checker: GrammarChecker, spec: GrammarSpec, tenant: str) -> float:
        async with self._turns.setdefault(checker, asyncio.Lock()):
            loop = asyncio.get_running_loop()
            if not checker.prepared:
                # A new compiler's cache is empty: nothing to look up after this.
                await loop.run_in_executor(
                    self._threads, checker.prepare, self._limits, *self._cache
                )
            return await loop.run_in_executor(self._threads, checker.check, spec, tenant)

    def _ended(self, tenant: str, done: asyncio.Future) -> None:
        error = None if done.cancelled() else done.exception()
        if done.cancelled():
            seconds = 0.0
        elif error is None:
            seconds = done.result()
        else:
            seconds = error.cpu_seconds if isinstance(error, CompileFailed) else 0.0
        GRAMMAR_CHECKS.labels("compiled" if error is None else "invalid").inc()
        GRAMMAR_COMPILE_SECONDS.inc(seconds)
        self._admission.release(tenant, seconds)
