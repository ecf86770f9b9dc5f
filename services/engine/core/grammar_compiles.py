"""New grammars compile on a worker thread, not on the thread that steps.

A grammar the compiler has not seen costs milliseconds to seconds of C++
(the twenty test schemas take ~160 ms cold, a large schema far more);
compiled inside the core's input handling, it would stall every running
request's next step for that long. So the core checks an Add with a grammar
at once for what is cheap (prompt, parameters, the grammar's caps), hands
the compile to one worker (xgrammar caches what it compiled, so a repeat
costs a lookup there), and adds the request to the scheduler between steps
once its compile is done. An abort before then drops it; a compile error
refuses that request alone, as RequestRejected did before.

One worker: compiles queue behind each other rather than take the second
core from the forward, and xgrammar's compiler is shared.
"""

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from services.engine.core import protocol
from services.engine.request import SeqOutput
from services.engine.sampling_params import SamplingParams


class GrammarCompiles:
    def __init__(self, compile_grammar: Callable[[SamplingParams], object]):
        self._compile = compile_grammar
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
        self._pending: dict[str, tuple[protocol.Add, Future]] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._pending

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def submit(self, message: protocol.Add) -> None:
        future = self._pool.submit(self._compile, message.params)
        self._pending[message.request_id] = (message, future)

    def cancel(self, request_id: str) -> protocol.Add | None:
        """Forget a request still compiling; None if it is not. A compile under way runs out."""
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
