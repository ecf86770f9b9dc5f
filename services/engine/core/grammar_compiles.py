"""New grammars compile in the grammar worker process, waited for off the thread that steps.

A grammar the compiler has not seen costs milliseconds to seconds of C++
(the twenty test schemas take ~160 ms cold, a large schema far more);
compiled inside the core's input handling, it would stall every running
request's next step for that long. So the core checks an Add with a grammar
at once for what is cheap (prompt, parameters), and one thread hands the
compile to the engine's GrammarCompiler, which checks the caps, looks in
the request's tenant's cache and otherwise compiles in its worker process
at low priority, killed at the deadline (services/common/grammar/worker.py).
The request joins the scheduler between steps once its compile is done. An
abort before then drops it; a compile error, an over-cap grammar or a
compile past the deadline refuses that request alone, as RequestRejected
did before.

One thread: compiles queue behind each other rather than take the second
core from the forward, and the worker compiles one grammar at a time.
"""

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from maas_services.common.grammar.spec import GrammarError, GrammarSpec
from maas_services.engine.core import protocol
from maas_services.engine.llm_engine import RequestRejected
from maas_services.engine.request import SeqOutput

if TYPE_CHECKING:  # importing it imports xgrammar, which an engine without grammars skips
    from maas_services.common.grammar.compiler import GrammarCompiler


class GrammarCompiles:
    def __init__(self, compiler: Callable[[], "GrammarCompiler"]):
        """compiler: the engine's, built on first use (LLMEngine.grammar_compiler)."""
        self._compiler = compiler
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
        self._pending: dict[str, tuple[protocol.Add, Future]] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._pending

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def submit(self, message: protocol.Add) -> None:
        future = self._pool.submit(self._compile, message.params.grammar, message.tenant)
        self._pending[message.request_id] = (message, future)

    def _compile(self, spec: GrammarSpec, tenant: str):
        """The compiled grammar, or RequestRejected naming why not."""
        try:
            return self._compiler().compile(spec, tenant)
        except GrammarError as exc:
            raise RequestRejected(f"grammar: {exc}") from exc

    def cancel(self, request_id: str) -> protocol.Add | None:
        """Forget a request still compiling; None if it is not. A compile under way
        runs out, at most to its deadline; its result is kept in the tenant's cache."""
        entry = self._pending.pop(request_id, None)
        if entry is None:
            return None
        entry[1].cancel()
        return entry[0]

    def take_done(self) -> list[tuple[protocol.Add, Future]]:
        """The requests whose compile has finished, each handed out once, in arrival order."""
        done = [entry for entry in self._pending.values() if entry[1].done()]
        for message, _ in done:
            del self._pending[message.request_id]
        return done

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def aborted(message: protocol.Add) -> SeqOutput:
    """What an abort answers for a request that never reached the scheduler."""
    return SeqOutput(
        request_id=message.request_id,
        index=0,
        token_ids=[],
        text="",
        finish_reason="abort",
        prompt_tokens=len(message.prompt_ids),
        completion_tokens=0,
        cached_prompt_tokens=0,
    )
