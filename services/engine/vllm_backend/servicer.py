"""maas.v1.Engine answered by one vLLM server, with the native engine's statuses.

A request vLLM refuses (its 4xx, a grammar we cannot map) is INVALID_ARGUMENT;
vLLM unreachable or failing (5xx, a broken stream) is UNAVAILABLE, so the
gateway retries elsewhere while no token was sent. A request is reported
scheduled (common/engine_metadata.py) with its first chunk: vLLM streams
nothing before a step has run it.

Abort, and a gRPC client that goes away, cancel the task that reads the HTTP
stream; closing the stream is how vLLM's server learns to abort the request.
Abort first ends our stream with an "abort" finish per sample whose report
counts the whole prompt as computed (completion_stream.CompletionStream.aborted):
vLLM says nothing of a prefill before its first token, and a request cut short
is billed its prefill (docs/billing.md).

A request naming a LoRA adapter names it as vLLM's model (vLLM runs it with
that adapter) and salts its blocks by it; one vLLM does not hold is
NOT_FOUND, as on our engine. LoadAdapter and UnloadAdapter go to vLLM's
runtime LoRA API (adapters.py); GetLoad reports what it holds. Each one that
succeeds is a KIND_ADAPTER_LOADED or _UNLOADED on StreamKvEvents, whose first
batch lists the adapters of GetLoad's scrape (/v1/models, cached: load.py).

Tokens ready together go in one message, as the native servicer sends them:
the HTTP stream is read in a task of its own into a queue, and each message
carries the chunks (up to READY_LIMIT) that queued while the previous one
was being written (merged per sample: services/engine/servicer.py merged). A reader that keeps
up gets each chunk alone, as soon as vLLM sends it. GenerateMany carries many
Generate calls on one stream, as the native servicer's does
(common/generate_mux.py).
"""

import asyncio
from dataclasses import dataclass

import grpc
import httpx

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.common.block_hash import request_salt
from maas_services.common.engine_metadata import SCHEDULED
from maas_services.common.generate_mux import GenerateMux
from maas_services.common.grammar.spec import GrammarError
from maas_services.common.grpc_interceptors import ServerCalls
from maas_services.common.logging import get_logger
from maas_services.common.serves import GENERATE
from maas_services.engine.core.protocol import ADAPTER_LOADED, ADAPTER_UNLOADED
from maas_services.engine.lora.errors import AdapterError, AdapterNotFound, LoraDisabled
from maas_services.engine.servicer import (
    abort_adapter_error,
    kv_batch_proto,
    load_report,
    merged,
    refuse_unservable,
    refuse_unserved,
    response_of,
)
from maas_services.engine.vllm_backend.adapters import load_adapter, unload_adapter
from maas_services.engine.vllm_backend.cache_salt import SaltBook
from maas_services.engine.vllm_backend.completion_stream import (
    CompletionStream,
    VllmModelNotFound,
    VllmRequestError,
    VllmUnavailable,
    stream_chunks,
)
from maas_services.engine.vllm_backend.embeddings import embedding_response
from maas_services.engine.vllm_backend.kv_subscriber import KvSubscriber
from maas_services.engine.vllm_backend.load import LoadCache
from maas_services.engine.vllm_backend.request_body import ResumeRefused, completion_body

log = get_logger(__name__)

# Chunks merged into one message at most, the native servicer's bound
# (common/ready_batches.py): 64 steps' tokens already make a message's cost per
# token small, and a message stays far below gRPC's size limit (logprobs
# included) however far its reader has fallen behind.
READY_LIMIT = 64
_END = object()  # the HTTP stream ended
_ABORT = object()  # the Abort RPC


@dataclass(frozen=True)
class VllmInfo:
    """What the adapter learned at start and reports unchanged."""

    model_id: str  # the name our clients use
    served_model: str  # vLLM's name for it (/v1/models)
    max_model_len: int
    max_num_seqs: int
    block_size: int
    num_blocks: int
    cache_salt: str
    prefix_cache_sharing: str
    # Why the start-up known-answer check failed (services/engine/known_answer.py).
    known_answer_failure: str = ""
    # --serves: what the vLLM behind it runs (embed: its pooling runner, embeddings.py).
    serves: tuple[str, ...] = (GENERATE,)


class VllmEngineServicer(engine_pb2_grpc.EngineServicer):
    def __init__(
        self,
        info: VllmInfo,
        engine_id: str,
        client: httpx.AsyncClient,
        tokenizer,
        kv: KvSubscriber | None,
        salts: SaltBook,
    ):
        self._info = info
        self._engine_id = engine_id
        self._client = client
        self._tokenizer = tokenizer  # for the text of logprobs' tokens
        self._kv = kv
        self._salts = salts
        self._load = LoadCache(client)
        # request id -> the queue its stream reads; Abort puts an abort marker in it.
        self._streams: dict[str, asyncio.Queue] = {}
        self.draining = False
        self._mux = GenerateMux(self.Generate, ServerCalls("engine"))

    async def GenerateMany(self, request_iterator, context):
        async for events in self._mux.serve(request_iterator, context):
            yield events

    async def Generate(self, request, context):
        info = self._info
        await refuse_unservable(request, context, info.model_id, self.draining)
        await refuse_unserved(request, context, list(info.serves))
        if request.sampling.HasField("embedding"):
            yield await embedding_response(request, context, info, self._client, self._salts)
            return
        if not request.request_id or request.request_id in self._streams:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "request_id is required and must be unique"
            )
        salt = request_salt(
            info.cache_salt,
            info.prefix_cache_sharing,
            request.tenant,
            request.share_prefix_cache,
            request.adapter,
        )
        try:
            body = completion_body(
                request, info.served_model, info.max_model_len, self._salts.vllm_salt(salt)
            )
        except GrammarError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"grammar: {exc}")
        except ResumeRefused as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        stream = CompletionStream(
            request.request_id, len(request.prompt_token_ids), request.sampling.top_logprobs
        )
        queue: asyncio.Queue = asyncio.Queue()
        reader = asyncio.create_task(self._read(body, queue))
        self._streams[request.request_id] = queue
        scheduled = False
        try:
            while True:
                outputs, last = [], None
                for last in await ready_items(queue):
                    if last is _END or last is _ABORT or isinstance(last, Exception):
                        break
                    outputs.extend(stream.outputs(last))
                    if not scheduled:
                        scheduled = True
                        await context.send_initial_metadata(SCHEDULED)
                if last is _ABORT:
                    outputs.extend(stream.aborted(body["n"]))
                # What the stream had delivered goes out before the stream's end or failure.
                for output in merged(outputs):
                    yield response_of(output, self._tokenizer)
                if isinstance(last, VllmModelNotFound) and request.adapter:
                    await self._refuse_adapter(request.adapter, context)
                if isinstance(last, VllmRequestError):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(last))
                if isinstance(last, VllmUnavailable):
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(last))
                if last is _END or last is _ABORT:
                    return
        finally:
            self._streams.pop(request.request_id, None)
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, body: dict, queue: asyncio.Queue) -> None:
        try:
            async for chunk in stream_chunks(self._client, body):
                queue.put_nowait(chunk)
        except (VllmRequestError, VllmUnavailable) as exc:
            queue.put_nowait(exc)
        except ValueError as exc:  # a chunk that is not JSON: the stream cannot be trusted
            queue.put_nowait(VllmUnavailable(f"unreadable vLLM stream: {exc!r}"))
        finally:
            # Always, so the stream's reader never waits on a reader that is gone.
            queue.put_nowait(_END)

    async def Abort(self, request, context):
        queue = self._streams.get(request.request_id)
        if queue is not None:
            queue.put_nowait(_ABORT)
        return engine_pb2.AbortResponse(found=queue is not None)

    async def GetLoad(self, request, context):
        try:
            load = await self._load.get()
        except httpx.HTTPError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"vLLM /metrics: {exc!r}")
        return load_report(
            self._info.model_id,
            load,
            self._info,
            self.draining,
            list(self._info.serves),
            list(load.adapters),
            load.max_loras,
        )

    async def _refuse_adapter(self, adapter: str, context) -> None:
        """A Generate naming an adapter vLLM does not hold, refused as our engine refuses it."""
        try:
            disabled = not (await self._load.get()).max_loras
        except httpx.HTTPError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"vLLM /metrics: {exc!r}")
        if disabled:
            await abort_adapter_error(
                context, LoraDisabled(f"adapter {adapter!r}: this engine serves no adapters")
            )
        await abort_adapter_error(
            context, AdapterNotFound(f"adapter {adapter!r} is not loaded here")
        )

    async def LoadAdapter(self, request, context):
        if not request.name or not request.source:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "an adapter needs a name and a source"
            )
        try:
            load = await self._load.get()
            loaded = await load_adapter(self._client, request.name, request.source, load.max_loras)
        except AdapterError as exc:
            await abort_adapter_error(context, exc)
        except (httpx.HTTPError, VllmUnavailable) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"vLLM: {exc}")
        finally:
            self._load.forget()  # the router's next poll sees it
        log.info("adapter_loaded", name=loaded.name, source=loaded.source)
        self._adapter_changed(ADAPTER_LOADED, loaded.name)
        return engine_pb2.AdapterStatus(name=loaded.name, rank=loaded.rank, source=loaded.source)

    async def UnloadAdapter(self, request, context):
        try:
            load = await self._load.get()
            found = await unload_adapter(self._client, request.name, load.max_loras)
        except AdapterError as exc:
            await abort_adapter_error(context, exc)
        except (httpx.HTTPError, VllmUnavailable) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"vLLM: {exc}")
        finally:
            self._load.forget()
        if found:
            self._adapter_changed(ADAPTER_UNLOADED, request.name)
        return engine_pb2.UnloadAdapterResponse(found=found)

    def _adapter_changed(self, kind: str, name: str) -> None:
        if self._kv is not None:
            self._kv.adapter_changed(kind, name)

    async def Drain(self, request, context):
        if not self.draining:
            log.info("drain_started", in_flight=len(self._streams))
        self.draining = True
        return engine_pb2.DrainResponse(in_flight=len(self._streams))

    async def StreamKvEvents(self, request, context):
        if self._kv is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "no --vllm-kv-events-endpoint configured"
            )
        try:
            adapters = (await self._load.get()).adapters
        except httpx.HTTPError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"vLLM /v1/models: {exc!r}")
        async for batch in self._kv.batches(list(adapters)):
            yield kv_batch_proto(self._engine_id, batch)


async def ready_items(queue: asyncio.Queue) -> list:
    """What the reader has queued, up to READY_LIMIT items, waiting only when there
    is nothing: chunks that piled up while the last message was written go out in
    one (the module docstring)."""
    items = [await queue.get()]
    while len(items) < READY_LIMIT and not queue.empty():
        items.append(queue.get_nowait())
    return items
