"""maas.v1.Engine over the single-sequence Generator.

One request runs on the model at a time (an asyncio.Lock is the model slot,
FIFO by arrival); the rest wait. The paged, continuously batched scheduler
replaces this in the engine-core issue without changing the contract. Each
model step runs in a worker thread so the event loop keeps serving GetLoad,
Abort and other streams while torch computes.
"""

import asyncio
import contextlib
import time

import grpc

from maas.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from services.common.detokenizer import IncrementalDetokenizer
from services.common.logging import get_logger
from services.common.text_tokenizer import TextTokenizer
from services.engine import metrics
from services.engine.generator import Generator
from services.engine.request_state import FINISH_REASONS, RequestState
from services.engine.sampling_params import SamplingParams
from services.engine.stop_strings import StopStringMatcher
from services.tokenizer.length_check import ContextLengthError, check_length

log = get_logger(__name__)


def sampling_from_proto(p: engine_pb2.SamplingParams, remaining: int) -> SamplingParams:
    return SamplingParams(
        temperature=p.temperature,
        top_p=p.top_p or 1.0,
        top_k=p.top_k,
        min_p=p.min_p,
        repetition_penalty=p.repetition_penalty or 1.0,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        seed=p.seed if p.HasField("seed") else None,
        max_tokens=p.max_tokens or remaining,
        min_tokens=p.min_tokens,
        ignore_eos=p.ignore_eos,
        stop=list(p.stop),
        stop_token_ids=list(p.stop_token_ids),
    )


class EngineServicer(engine_pb2_grpc.EngineServicer):
    def __init__(
        self,
        model_id: str,
        generator: Generator,
        tokenizer: TextTokenizer,
        max_model_len: int,
        vocab_size: int,
    ):
        self._model_id = model_id
        self._generator = generator
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._vocab_size = vocab_size
        self._slot = asyncio.Lock()
        self._requests: dict[str, RequestState] = {}
        self._waiting = 0
        self._running = 0
        self.draining = False

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    async def _validated(self, request, context) -> SamplingParams:
        if request.model and request.model != self._model_id:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"this engine serves {self._model_id!r}, not {request.model!r}",
            )
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "engine is draining")
        if not request.request_id or request.request_id in self._requests:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "request_id must be set and unique in flight"
            )
        prompt = request.prompt_token_ids
        if not prompt:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt_token_ids is empty")
        if any(not 0 <= t < self._vocab_size for t in prompt):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"prompt token ids must be in [0, {self._vocab_size})",
            )
        if request.sampling.n > 1 or request.sampling.logprobs:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "n > 1 and logprobs are not supported by this engine yet",
            )
        remaining = self._max_model_len - len(prompt)
        params = sampling_from_proto(request.sampling, remaining)
        try:
            params.validate()
            check_length(len(prompt), params.max_tokens, self._max_model_len)
        except (ValueError, ContextLengthError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return params

    async def Generate(self, request, context):
        params = await self._validated(request, context)
        state = RequestState(request.request_id, list(request.prompt_token_ids))
        self._requests[state.request_id] = state
        finish = "abort"
        try:
            async with self._model_slot(state):
                async for response, reason in self._decode(state, params):
                    finish = reason
                    yield response
        finally:
            del self._requests[state.request_id]
            metrics.REQUESTS_FINISHED.labels(finish).inc()
            metrics.E2E_SECONDS.observe(time.perf_counter() - state.arrived_at)

    @contextlib.asynccontextmanager
    async def _model_slot(self, state: RequestState):
        """Wait for the model, counting the request as waiting, then running."""
        self._set_counts(waiting=+1)
        try:
            await self._slot.acquire()
        finally:
            self._set_counts(waiting=-1)
        metrics.QUEUE_SECONDS.observe(time.perf_counter() - state.arrived_at)
        self._set_counts(running=+1)
        try:
            yield
        finally:
            self._set_counts(running=-1)
            self._slot.release()

    def _set_counts(self, waiting: int = 0, running: int = 0) -> None:
        self._waiting += waiting
        self._running += running
        metrics.REQUESTS_WAITING.set(self._waiting)
        metrics.REQUESTS_RUNNING.set(self._running)

    async def _decode(self, state: RequestState, params: SamplingParams):
        """Yield (response, finish reason) once per generated token."""
        seq = self._generator.start(state.prompt_ids, params)
        metrics.PROMPT_TOKENS.inc(len(state.prompt_ids))
        detok = IncrementalDetokenizer(self._tokenizer, state.prompt_ids)
        stops = StopStringMatcher(params.stop)
        while True:
            if state.aborted:
                yield self._response(state, [], "", "abort"), "abort"
                return
            token = await asyncio.to_thread(self._generator.step, seq)
            if state.first_token_at is None:
                state.first_token_at = time.perf_counter()
                metrics.TTFT_SECONDS.observe(state.first_token_at - state.arrived_at)
            state.completion_tokens += 1
            metrics.GENERATION_TOKENS.inc()
            finish = seq.finish_reason(self._generator.config)
            text, stopped = stops.push(detok.push(token))
            if stopped:
                finish = "stop"
            elif finish is not None:
                text += stops.push(detok.flush())[0] + stops.flush()
            yield self._response(state, [token], text, finish), finish
            if finish is not None:
                return

    def _response(
        self, state: RequestState, tokens: list[int], text: str, finish: str | None
    ) -> engine_pb2.GenerateResponse:
        response = engine_pb2.GenerateResponse(
            request_id=state.request_id, token_ids=tokens, text=text
        )
        if finish is not None:
            response.finish_reason = FINISH_REASONS[finish]
            response.usage.CopyFrom(
                common_pb2.Usage(
                    prompt_tokens=len(state.prompt_ids),
                    completion_tokens=state.completion_tokens,
                )
            )
        return response

    async def Abort(self, request, context):
        state = self._requests.get(request.request_id)
        if state is not None:
            state.aborted = True
        return engine_pb2.AbortResponse(found=state is not None)

    async def GetLoad(self, request, context):
        return engine_pb2.LoadReport(
            model=self._model_id,
            running=self._running,
            waiting=self._waiting,
            kv_cache_usage=0.0,
            max_num_seqs=1,
            max_model_len=self._max_model_len,
            draining=self.draining,
        )

    async def Drain(self, request, context):
        if not self.draining:
            log.info("drain_started", in_flight=self.in_flight)
        self.draining = True
        return engine_pb2.DrainResponse(in_flight=self.in_flight)
