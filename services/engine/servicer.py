"""maas.v1.Engine over the engine core, through its AsyncEngine client.

Validation failures are INVALID_ARGUMENT (the message names the field or the
limit), and so is a request that made a model step raise: the engine isolated
it, and another replica would fail it the same way. A draining engine answers
UNAVAILABLE so the gateway retries elsewhere; a step failure the engine could
not pin on one request is INTERNAL for every request it carried, and a core
that died is UNAVAILABLE for every open stream (the worker then exits). A request
that enters a step is told so in initial metadata (common/engine_metadata.py),
which is how the gateway knows whether a failed attempt may be retried.

Generate sends a sample's tokens as the core makes them, except that tokens
ready together (the stream was slower to write than the core to step: gRPC's
flow control, a busy serving process) go in one message: the stream is read
ahead in a task of its own (common/ready_batches.py) and what piled up while a
message was being written goes in the next one. Nothing waits for company, so
a reader that keeps up sees every token as soon as it is made.

GenerateMany carries many Generate calls on one stream (the gateway's
connection): common/generate_mux.py runs each through Generate, unchanged,
and sends what is ready of all of them in one message.

An embedding request (sampling.embedding) is a prefill with no decode
(embedding.py) and is answered by one message; an engine that does not serve
what a request asks (--serves: generation, embeddings or both) refuses it
with INVALID_ARGUMENT before it reaches the core.

A Generate naming an adapter (GenerateRequest.adapter) runs with it, salted
by it in the prefix cache (the core's LLMEngine salts it); one not loaded is
NOT_FOUND, as another model's is. LoadAdapter and UnloadAdapter go to the core,
which applies them between steps (core/engine_core.py); their refusals get
engine.proto's codes (ADAPTER_STATUS), and GetLoad reports the adapters loaded.

The Generate span (opened by the server interceptor) gets the GenAI attributes
(common/gen_ai.py). The engine completes a prompt of tokens, whatever the
client's endpoint was, so its operation is always text_completion.
"""

import dataclasses
from collections.abc import Sequence
from contextlib import aclosing

import grpc
from opentelemetry import trace

from maas.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from maas_services.common import gen_ai
from maas_services.common.defaults import default_max_tokens
from maas_services.common.engine_metadata import SCHEDULED
from maas_services.common.finish_reasons import FINISH_CODES
from maas_services.common.generate_mux import GenerateMux
from maas_services.common.grammar.proto import grammar_from_proto
from maas_services.common.grammar.spec import GrammarError
from maas_services.common.grpc_interceptors import ServerCalls
from maas_services.common.logging import get_logger
from maas_services.common.ready_batches import ready_batches
from maas_services.common.serves import DEFAULT_SERVES, EMBED, GENERATE
from maas_services.engine.async_engine import (
    AsyncEngine,
    CoreDied,
    EngineFailed,
    KvEventBatch,
    RequestFailed,
)
from maas_services.engine.core.protocol import (
    ADAPTER_LOADED,
    ADAPTER_UNLOADED,
    CLEARED,
    EVICTED,
    STORED,
)
from maas_services.engine.lora.errors import (
    AdapterError,
    AdapterInvalid,
    AdapterNotFound,
    AdapterSlotsFull,
    LoraDisabled,
)
from maas_services.engine.request import SeqOutput
from maas_services.engine.sampling_params import EmbeddingParams, SamplingParams

log = get_logger(__name__)

KV_KINDS = {
    STORED: engine_pb2.KvEvent.KIND_STORED,
    EVICTED: engine_pb2.KvEvent.KIND_EVICTED,
    CLEARED: engine_pb2.KvEvent.KIND_CLEARED,
    ADAPTER_LOADED: engine_pb2.KvEvent.KIND_ADAPTER_LOADED,
    ADAPTER_UNLOADED: engine_pb2.KvEvent.KIND_ADAPTER_UNLOADED,
}

# Each adapter refusal's status (engine.proto); both backends answer with these.
ADAPTER_STATUS = {
    LoraDisabled: grpc.StatusCode.FAILED_PRECONDITION,
    AdapterInvalid: grpc.StatusCode.INVALID_ARGUMENT,
    AdapterSlotsFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    AdapterNotFound: grpc.StatusCode.NOT_FOUND,
}


async def abort_adapter_error(context, exc: AdapterError) -> None:
    await context.abort(ADAPTER_STATUS.get(type(exc), grpc.StatusCode.INTERNAL), str(exc))


def sampling_from_proto(p: engine_pb2.SamplingParams, unset_max_tokens: int) -> SamplingParams:
    """Proto defaults (zeros) mean "unset": map them onto the engine's defaults.

    Raises GrammarError (a ValueError) for a grammar of unknown kind.
    """
    if p.HasField("embedding"):
        # A prefill with no decode: max_tokens 0 (an unset 0 is not the default here).
        return SamplingParams(
            max_tokens=p.max_tokens,
            n=p.n or 1,
            logprobs=p.logprobs,
            grammar=grammar_from_proto(p.grammar) if p.HasField("grammar") else None,
            embedding=EmbeddingParams(dimensions=p.embedding.dimensions),
        )
    return SamplingParams(
        temperature=p.temperature,
        top_p=p.top_p or 1.0,
        top_k=p.top_k,
        min_p=p.min_p,
        repetition_penalty=p.repetition_penalty or 1.0,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        seed=p.seed if p.HasField("seed") else None,
        max_tokens=p.max_tokens or unset_max_tokens,
        min_tokens=p.min_tokens,
        ignore_eos=p.ignore_eos,
        stop=list(p.stop),
        stop_token_ids=list(p.stop_token_ids),
        n=p.n or 1,
        logprobs=p.logprobs,
        top_logprobs=p.top_logprobs,
        speculative=p.speculative,
        grammar=grammar_from_proto(p.grammar) if p.HasField("grammar") else None,
    )


def merged(outputs: list[SeqOutput]) -> list[SeqOutput]:
    """One output per sample for outputs that are ready together: its tokens,
    text and logprobs in order, the rest (finish, running counts) from its latest."""
    if len(outputs) == 1:
        return outputs  # a reader that keeps up: every time
    by_index: dict[int, SeqOutput] = {}
    for output in outputs:
        earlier = by_index.get(output.index)
        by_index[output.index] = (
            output
            if earlier is None
            else dataclasses.replace(
                output,
                token_ids=earlier.token_ids + output.token_ids,
                text=earlier.text + output.text,
                logprobs=earlier.logprobs + output.logprobs,
            )
        )
    return list(by_index.values())


def token_text(tokenizer, token_id: int) -> str:
    # The text a token adds, not its byte-level vocabulary spelling ("Ġthe").
    return tokenizer.decode([token_id], skip_special_tokens=False)


def response_of(output: SeqOutput, tokenizer) -> engine_pb2.GenerateResponse:
    response = engine_pb2.GenerateResponse(
        request_id=output.request_id,
        index=output.index,
        token_ids=output.token_ids,
        text=output.text,
        embedding=output.embedding,
    )
    for lp in output.logprobs:
        response.logprobs.append(
            engine_pb2.TokenLogprob(
                token_id=lp.token_id,
                token=token_text(tokenizer, lp.token_id),
                logprob=lp.logprob,
                top_logprobs=[
                    engine_pb2.TopLogprob(token_id=i, token=token_text(tokenizer, i), logprob=v)
                    for i, v in lp.top
                ],
            )
        )
    if output.finish_reason is not None:
        response.finish_reason = FINISH_CODES[output.finish_reason]
        response.usage.CopyFrom(
            common_pb2.Usage(
                prompt_tokens=output.prompt_tokens,
                completion_tokens=output.completion_tokens,
                cached_prompt_tokens=output.cached_prompt_tokens,
            )
        )
        response.computed_prompt_tokens = output.computed_prompt_tokens
    return response


def load_report(
    model_id: str,
    load,
    info,
    draining: bool,
    serves: list[str],
    adapters: Sequence[str] = (),
    max_loras: int = 0,
) -> engine_pb2.LoadReport:
    """GetLoad's answer from a load (running, waiting, kv_cache_usage) and the engine's
    fixed facts; the vLLM backend (services/engine/vllm_backend) answers with it too.
    adapters: the LoRA adapters loaded; max_loras 0: it serves none."""
    return engine_pb2.LoadReport(
        model=model_id,
        running=load.running,
        waiting=load.waiting,
        kv_cache_usage=load.kv_cache_usage,
        max_num_seqs=info.max_num_seqs,
        max_model_len=info.max_model_len,
        # An engine that failed its known-answer check runs, but no router may pick it.
        draining=draining or bool(info.known_answer_failure),
        not_ready_reason=info.known_answer_failure,
        # What the router needs to compute this engine's block hashes.
        block_size=info.block_size,
        cache_salt=info.cache_salt,
        prefix_cache_sharing=info.prefix_cache_sharing,
        kv_cache_blocks=info.num_blocks,
        serves=serves,
        adapters=adapters,
        max_loras=max_loras,
    )


def kv_batch_proto(engine_id: str, batch: KvEventBatch) -> engine_pb2.KvEventBatch:
    return engine_pb2.KvEventBatch(
        sequence=batch.sequence,
        engine_id=engine_id,
        events=[kv_event_proto(kind, what) for kind, what in batch.events],
    )


def kv_event_proto(kind: str, what: list[int] | str) -> engine_pb2.KvEvent:
    """One event: block hashes, or an adapter kind's adapter name (protocol.KvEvent)."""
    if kind in (ADAPTER_LOADED, ADAPTER_UNLOADED):
        return engine_pb2.KvEvent(kind=KV_KINDS[kind], adapter=what)
    return engine_pb2.KvEvent(kind=KV_KINDS[kind], block_hashes=what)


async def refuse_unservable(request, context, model_id: str, draining: bool) -> None:
    """Abort a Generate this engine must not take: another model's, or any while draining.

    Both backends (this one and vllm_backend) answer these the same way.
    """
    if request.model and request.model != model_id:
        await context.abort(
            grpc.StatusCode.NOT_FOUND, f"this engine serves {model_id!r}, not {request.model!r}"
        )
    if draining:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "engine is draining")


async def refuse_unserved(request, context, serves: list[str]) -> None:
    """Abort a Generate asking for what this engine does not serve (--serves).

    INVALID_ARGUMENT, not UNAVAILABLE: every replica of this deployment was
    started the same way, so a retry elsewhere would be refused again.
    """
    kind = EMBED if request.sampling.HasField("embedding") else GENERATE
    if kind not in serves:
        what = "embeddings" if kind == EMBED else "generation"
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"this engine does not serve {what}: it serves {', '.join(serves)} (--serves)",
        )


class EngineServicer(engine_pb2_grpc.EngineServicer):
    def __init__(
        self,
        model_id: str,
        engine_id: str,
        engine: AsyncEngine,
        tokenizer,
        serves: list[str] = DEFAULT_SERVES["native"],
    ):
        self._model_id = model_id
        self._engine_id = engine_id
        self._engine = engine
        self._tokenizer = tokenizer  # for the text of logprobs' tokens
        self._serves = serves  # --serves: "generate", "embed" or both
        self.draining = False
        self._mux = GenerateMux(self.Generate, ServerCalls("engine"))

    async def GenerateMany(self, request_iterator, context):
        async for events in self._mux.serve(request_iterator, context):
            yield events

    async def Generate(self, request, context):
        await refuse_unservable(request, context, self._model_id, self.draining)
        await refuse_unserved(request, context, self._serves)
        if not request.request_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id is required")
        prompt = list(request.prompt_token_ids)
        try:
            params = sampling_from_proto(
                request.sampling, default_max_tokens(self._engine.info.max_model_len, len(prompt))
            )
            # A migrated request: its delivered output (services/engine/resume.py).
            params.resume_ids = list(request.resume_token_ids)
        except GrammarError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"grammar: {exc}")
        span = trace.get_current_span()
        span.set_attributes(
            gen_ai.request_attributes(
                gen_ai.EMBEDDINGS
                if request.sampling.HasField("embedding")
                else gen_ai.TEXT_COMPLETION,
                self._model_id,
                params.max_tokens,
                params.temperature,
            )
        )
        # By sample index: n samples share the prompt, each has its own output.
        finishes: dict[int, str] = {}
        generated: dict[int, int] = {}
        last: SeqOutput | None = None
        outputs = self._engine.generate(
            request.request_id,
            prompt,
            params,
            request.priority,
            request.tenant,
            request.share_prefix_cache,
            request.adapter,
            on_scheduled=lambda: context.send_initial_metadata(SCHEDULED),
        )
        try:
            # Every token a sample has ready goes in one message (the module docstring).
            async with aclosing(ready_batches(outputs)) as batches:
                async for batch in batches:
                    for output in merged(batch):
                        last = output
                        generated[output.index] = output.completion_tokens
                        if output.finish_reason:
                            finishes[output.index] = output.finish_reason
                        yield response_of(output, self._tokenizer)
        except RequestFailed as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except AdapterError as exc:
            await abort_adapter_error(context, exc)
        except EngineFailed as exc:
            await context.abort(grpc.StatusCode.INTERNAL, str(exc))
        except CoreDied as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        finally:
            if last is not None:
                span.set_attributes(
                    gen_ai.response_attributes(
                        self._model_id, last.prompt_tokens, sum(generated.values()), finishes
                    )
                )

    async def Abort(self, request, context):
        return engine_pb2.AbortResponse(found=self._engine.abort(request.request_id))

    async def GetLoad(self, request, context):
        # The load as of the core's latest step (it sends one with every step).
        engine = self._engine
        return load_report(
            self._model_id,
            engine.load,
            engine.info,
            self.draining,
            self._serves,
            engine.adapters,
            engine.info.max_loras,
        )

    async def LoadAdapter(self, request, context):
        if not request.name or not request.source:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "an adapter needs a name and a source"
            )
        try:
            loaded = await self._engine.load_adapter(request.name, request.source)
        except AdapterError as exc:
            await abort_adapter_error(context, exc)
        except CoreDied as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except RuntimeError as exc:  # the loader's bug, logged by the core
            await context.abort(grpc.StatusCode.INTERNAL, str(exc))
        return engine_pb2.AdapterStatus(name=loaded.name, rank=loaded.rank, source=loaded.source)

    async def UnloadAdapter(self, request, context):
        try:
            found = await self._engine.unload_adapter(request.name)
        except AdapterError as exc:
            await abort_adapter_error(context, exc)
        except CoreDied as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except RuntimeError as exc:
            await context.abort(grpc.StatusCode.INTERNAL, str(exc))
        return engine_pb2.UnloadAdapterResponse(found=found)

    async def Drain(self, request, context):
        if not self.draining:
            log.info("drain_started", in_flight=self._engine.in_flight)
        self.draining = True
        return engine_pb2.DrainResponse(in_flight=self._engine.in_flight)

    async def StreamKvEvents(self, request, context):
        try:
            async for batch in self._engine.kv_events():
                yield kv_batch_proto(self._engine_id, batch)
        except CoreDied as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
