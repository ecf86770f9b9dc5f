"""An admitted request, held by the front that serves it: the one owner of its end.

Pipeline.admit returns a Run once the request holds its TPM reservation, its
prepaid balance's hold and its queue slot. The front reads `run.deltas`
(engine_client.py streams them, through the output filter here) and closes
the run once its response's last byte is out (`async with run`, or
`await run.close()`). The end happens here, in this order, whatever way the
request ends (served, a broken stream, an error before the first token, a
client gone before or after it):

1. when the deltas end or are closed: the queue slot is freed at once;
2. in a task of its own (background.py), once the front has closed the run
   (at once for a request cut short before its first token: nothing more goes
   to its client), the request is billed from the engine's tally: its usage
   event, with the TPM settlement (prompt + completion used) and the prepaid
   balance's settlement riding in the event's round trip (usage_emitter.py).
   A request with nothing to bill settles its tokens to 0 and releases its
   balance hold.

So a request is billed exactly once: the engine client only tallies, and
nothing but Run.close and the deltas' end starts the billing.

The request's span (the HTTP span current at admission) gets the GenAI
attributes (services/common/gen_ai.py): what was asked at once, what came back
when the deltas end, while the span is still open (the bill comes later).
"""

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace

from opentelemetry import trace
from opentelemetry.trace import Span

from maas_services.common import gen_ai
from maas_services.common.openai_api.delta import Delta
from maas_services.common.openai_api.output_filter import OutputFilter
from maas_services.common.openai_api.parsed_request import ChatPrompt
from maas_services.common.tracing import current_traceparent
from maas_services.common.usage_event import UsageEvent
from maas_services.gateway.admission.rate_limiter import RateLimiter
from maas_services.gateway.background import Background
from maas_services.gateway.ticket import Ticket
from maas_services.gateway.upstream.engine_client import EngineClient, EngineStream, Tally
from maas_services.gateway.usage.usage_emitter import UsageEmitter


@dataclass
class Run:
    """One admitted request: its deltas for the front, and its end (module docstring)."""

    ticket: Ticket
    engine: EngineClient
    output_filter: OutputFilter
    limiter: RateLimiter
    usage: UsageEmitter
    background: Background
    deltas: AsyncIterator[Delta] = field(init=False)
    # Set by close(): the response is out, the request's bill may be sent.
    _closed: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    # The completion tokens a streaming front has written to its client (delivered()).
    _written: int | None = field(init=False, default=None)
    _stream: EngineStream | None = field(init=False, default=None)
    _ended: bool = field(init=False, default=False)
    _span: Span = field(init=False)
    # The bill's task, once _end has started it (billed()).
    _billing: asyncio.Task | None = field(init=False, default=None)
    # Each choice's finish reason as the client saw it (after the output filter).
    _finishes: dict[int, str] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.deltas = self._read()
        self._span = trace.get_current_span()
        request = self.ticket.request
        sampling = self.ticket.sampling
        if sampling.HasField("embedding"):
            operation = gen_ai.EMBEDDINGS
        elif isinstance(request.prompt, ChatPrompt):
            operation = gen_ai.CHAT
        else:
            operation = gen_ai.TEXT_COMPLETION
        self._span.set_attributes(
            gen_ai.request_attributes(
                operation, request.model, sampling.max_tokens, sampling.temperature
            )
        )

    @property
    def headers(self) -> dict[str, str]:
        return self.ticket.headers

    async def __aenter__(self) -> "Run":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        """The front's word that its response is out (or will never be)."""
        await self.deltas.aclose()
        self._closed.set()
        self._end()  # for deltas never read

    async def _read(self) -> AsyncIterator[Delta]:
        stream = self._stream = self.engine.open(self.ticket)
        screen = self.output_filter.stream() if self.output_filter.enabled else None
        stopped: set[int] = set()
        n = self.ticket.request.n
        try:
            async for delta in stream.deltas:
                if screen is not None:
                    if delta.index in stopped:
                        continue
                    passed = screen.push(
                        delta.index, delta.text, bool(delta.finish_reason), delta.logprobs
                    )
                    delta.text, delta.logprobs = passed.text, passed.logprobs
                    if passed.stopped:
                        delta.finish_reason = "content_filter"
                        stopped.add(delta.index)
                if delta.finish_reason:
                    self._finishes[delta.index] = delta.finish_reason
                yield delta
                if len(stopped) == n:
                    return
        finally:
            await stream.deltas.aclose()
            self._end()
            self._record_response(stream.known_tally())

    def _record_response(self, tally: Tally | None) -> None:
        """The response's GenAI attributes; no usage when the tally waits on an
        engine's report (a request cut short: its bill has it)."""
        if tally is None:
            return
        self._span.set_attributes(
            gen_ai.response_attributes(
                self.ticket.request.model,
                tally.prompt_tokens,
                tally.completion_tokens,
                self._finishes,
            )
        )

    def _end(self) -> None:
        """Free the slot now; bill once the response is out (module docstring)."""
        if self._ended:
            return
        self._ended = True
        self.ticket.queue.release(self.ticket.request.n)
        if self.ticket.pick is not None:
            self.ticket.pick.cancel()  # closed before its deltas used the pick
        if self._stream is not None and self._stream.cut_short:
            self._billing = self.background.run(self._bill())
        else:
            self._billing = self.background.after(self._closed, self._bill())

    @property
    def embedding(self) -> Sequence[float]:
        """An embedding request's vector, once its deltas have ended; () before."""
        return self._stream.embedding if self._stream is not None else ()

    async def billed(self) -> None:
        """After close(): wait until the request's bill is sent, and with it the end
        of its concurrency lease. A front that runs one client request as several
        (an embeddings request's inputs) waits for it, so that request's next
        admission is not refused for the lease its last one held."""
        await asyncio.shield(self._billing)

    def ready(self) -> bool:
        """Whether the next delta is here already (the engine call has it): a
        streaming front takes all such deltas on its turn (common/ready_batches.py
        told_batches)."""
        return self._stream is not None and self._stream.ready()

    def delivered(self, completion_tokens: int) -> None:
        """A streaming front's running count of the completion tokens it has written
        to its client. A front may have read more than it has written (a batch
        being written), so a stream its client leaves is billed these, the tokens
        delivered (docs/billing.md, "Requests cut short"), not the ones read and
        never sent."""
        self._written = completion_tokens

    async def _bill(self) -> None:
        ticket = self.ticket
        tenant, request, reservation = ticket.principal.tenant, ticket.request, ticket.reservation
        tally = await self._stream.tally() if self._stream is not None else None
        if tally is not None and not tally.finish and self._written is not None:
            tally = replace(tally, completion_tokens=min(tally.completion_tokens, self._written))
        used = tally.prompt_tokens + tally.completion_tokens if tally is not None else 0
        settlement = self.limiter.settlement(tenant, request.request_id, used, request.n)
        if used:
            event = self._event(tally)
            # The balance's hold settles to the real cost ahead of the event;
            # billing's commit of the event then drops it.
            held = reservation.settlement(event)
            await self.usage.emit(event, settlement, held)
            return
        if settlement is not None:
            await settlement.answered(None)
        await reservation.release()

    def _event(self, tally: Tally) -> UsageEvent:
        ticket = self.ticket
        started = tally.started_at
        return UsageEvent(
            request_id=ticket.request.request_id,
            tenant=ticket.principal.tenant.name,
            key_id=ticket.principal.key_id,
            model=ticket.request.model,
            deployment=ticket.route.deployment,
            adapter=ticket.route.adapter,
            endpoint=tally.endpoint,
            prompt_tokens=tally.prompt_tokens,
            cached_prompt_tokens=tally.cached_prompt_tokens,
            completion_tokens=tally.completion_tokens,
            finish_reason=tally.finish or "client_disconnect",
            started_at=started,
            ttft_seconds=max(0.0, tally.first_token_at - started) if tally.first_token_at else 0.0,
            duration_seconds=tally.ended_at - started,
            migration_prefill_tokens=tally.migration_prefill_tokens,
            traceparent=current_traceparent(),
        )
