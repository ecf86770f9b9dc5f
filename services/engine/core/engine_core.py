"""The engine core's loop: take inputs, step, send one StepBatch per step.

It owns the LLMEngine and is the only thread that touches its state (the
adapter reader below reads files into new tensors, nothing more). Inputs arrive
on a PULL socket and are applied between steps; each step's outputs go back
as one message on a PUSH socket (protocol.py). It runs as its own process in
serving (process.py); tests may run it on a thread over the same sockets.
New grammars are compiled in a killable worker process, waited for on a
thread that touches only the grammar compiler, and their requests added
between steps (grammar_compiles.py).

Adapter loads and unloads are applied between steps too, one per step at
most, in arrival order. A load's folder is read and checked on a worker thread
(one at a time; the loads and unloads behind it wait their turn), while the
steps go on; the core then installs the weights between two steps. So a
caller sending loads in a loop, or one slow file, delays no stream: the steps
wait for neither (a weights file larger than any adapter is still refused on
its size before it is read, adapter_limits.py).
Each is answered after the batch that shows the adapters it changed
(protocol.py): the batch carries the new set and, among its KV events, an
adapter_loaded or adapter_unloaded for each adapter that came or went (a load
that evicted one for room shows both), so a router learns of it at once.
"""

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import zmq

from maas_services.common.logging import get_logger
from maas_services.engine import metrics
from maas_services.engine.core import protocol
from maas_services.engine.core.adapter_limits import (
    check_adapter_name,
    check_adapter_size,
    max_adapter_bytes,
)
from maas_services.engine.core.compute_threads import ComputeThreads
from maas_services.engine.core.grammar_compiles import GrammarCompiles, aborted
from maas_services.engine.core.metrics_relay import engine_metrics_text
from maas_services.engine.llm_engine import LLMEngine, RequestRejected
from maas_services.engine.lora.errors import (
    AdapterError,
    AdapterInvalid,
    AdapterSlotsFull,
    LoraDisabled,
)

log = get_logger(__name__)

IDLE_POLL_MS = 500
# How long an idle core waits for input while a grammar compiles or an adapter is read.
COMPILE_POLL_MS = 5
# How often a busy core sends its metrics; it sends them too with the batch that leaves it idle.
METRICS_INTERVAL_SECONDS = 1.0
# maas_engine_lora_adapter_loads' result of each refusal; "error" for anything else.
LOAD_RESULTS = {
    AdapterInvalid: "invalid",
    AdapterSlotsFull: "slots_full",
    LoraDisabled: "lora_disabled",
}


class EngineCore:
    def __init__(
        self,
        engine: LLMEngine,
        input_address: str,
        output_address: str,
        threads: ComputeThreads | None = None,  # None: the threads torch has, every step
        known_answer_failure: str = "",  # sent in Ready (protocol.py)
    ):
        self.engine = engine
        self._known_answer_failure = known_answer_failure
        self._context = zmq.Context()
        self._inputs = self._context.socket(zmq.PULL)
        self._inputs.connect(input_address)
        self._outputs = self._context.socket(zmq.PUSH)
        self._outputs.connect(output_address)
        self._batch = self._new_batch()
        self._metrics_sent = 0.0
        self._stepped = False  # every step sends its batch, empty or not: it carries the load
        self._running = True
        self._compiles = GrammarCompiles(engine.grammar_compiler)
        self._adapter_work: deque[protocol.LoadAdapter | protocol.UnloadAdapter] = deque()
        # The load whose folder the reader thread reads now, if any (module docstring).
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="adapter-reader")
        self._reading: tuple[protocol.LoadAdapter, Future] | None = None
        # The set the serving process last heard of (Ready, then StepBatch.adapters).
        self._adapters_sent = engine.adapters()
        metrics.LORA_ADAPTERS_LOADED.set(len(self._adapters_sent))
        self._adapter_bytes = max_adapter_bytes(engine.model_config, engine.config.max_lora_rank)
        engine.blocks.on_event = lambda kind, hashes: self._batch.kv_events.append((kind, hashes))
        engine.on_scheduled = self._batch_scheduled
        if threads is not None:
            engine.before_forward = threads.apply

    def run(self) -> None:
        config = self.engine.config
        self._send(
            protocol.Ready(
                max_model_len=config.max_model_len,
                max_num_seqs=config.scheduler.max_num_seqs,
                block_size=config.block_size,
                cache_salt=config.cache_salt,
                prefix_cache_sharing=config.prefix_cache_sharing,
                num_blocks=config.num_blocks,
                known_answer_failure=self._known_answer_failure,
                max_loras=config.max_loras,
                adapters=self._adapters_sent,
            )
        )
        try:
            while self._running:
                reading = self._reading is not None
                busy = self.engine.has_work or (self._adapter_work and not reading)
                wait = COMPILE_POLL_MS if self._compiles.pending or reading else IDLE_POLL_MS
                self._take_inputs(timeout_ms=0 if busy else wait)
                self._add_compiled()
                self._adapter_step()
                if self.engine.has_work:
                    self._step()
                self._flush()
        finally:
            self._compiles.close()
            self._reader.shutdown(wait=False, cancel_futures=True)
            self._outputs.close(linger=1000)
            self._inputs.close(linger=0)
            self._context.term()

    def _take_inputs(self, timeout_ms: int) -> None:
        if not self._inputs.poll(timeout_ms):
            return
        while self._running:
            try:
                message = self._inputs.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._apply(protocol.decode_input(message))

    def _apply(self, message: protocol.Input) -> None:
        batch = self._batch
        if isinstance(message, protocol.Add):
            if message.params.grammar is None:
                self._add(message)
            else:
                self._compile_then_add(message)
        elif isinstance(message, protocol.Abort):
            compiling = self._compiles.cancel(message.request_id)
            if compiling is None:
                batch.outputs += self.engine.abort(message.request_id)
            else:
                metrics.REQUESTS_FINISHED.labels("abort").inc()
                batch.outputs.append(aborted(compiling))
        elif isinstance(message, protocol.KvSnapshot):
            # What was sent before the snapshot precedes it; what follows, follows it.
            self._flush(force=True)
            blocks = list(self.engine.blocks.hash_to_block)
            self._send(protocol.KvHashes(message.token, blocks, self._adapters_sent))
        elif isinstance(message, protocol.LoadAdapter | protocol.UnloadAdapter):
            self._adapter_work.append(message)
        elif isinstance(message, protocol.Shutdown):
            self._running = False

    def _add(self, message: protocol.Add, grammar=None) -> None:
        try:
            self.engine.add_request(
                message.request_id,
                message.prompt_ids,
                message.params,
                message.priority,
                message.tenant,
                message.share_prefix_cache,
                grammar=grammar,
                adapter=message.adapter,
            )
        except RequestRejected as exc:
            self._batch.failures.append(protocol.Failure(message.request_id, str(exc)))
        except AdapterError as exc:
            self._batch.failures.append(
                protocol.Failure(message.request_id, str(exc), adapter_error=type(exc).__name__)
            )
        except Exception as exc:  # what validation missed must not end the core
            log.exception("engine_add_failed", request_id=message.request_id)
            self.engine.abort(message.request_id)
            self._batch.failures.append(
                protocol.Failure(message.request_id, f"request not added: {exc}")
            )

    def _compile_then_add(self, message: protocol.Add) -> None:
        """Refuse now what is cheap to check; compile on the worker (grammar_compiles.py)."""
        request_id = message.request_id
        try:
            if request_id in self.engine.requests or request_id in self._compiles:
                raise RequestRejected(f"request {request_id!r} is already running")
            self.engine.validate(message.prompt_ids, message.params, compile_grammar=False)
        except RequestRejected as exc:
            self._batch.failures.append(protocol.Failure(request_id, str(exc)))
            return
        self._compiles.submit(message)

    def _add_compiled(self) -> None:
        for message, compiled in self._compiles.take_done():
            try:
                grammar = compiled.result()
            except RequestRejected as exc:
                self._batch.failures.append(protocol.Failure(message.request_id, str(exc)))
                continue
            except Exception as exc:  # a compiler bug refuses this request, not the core
                log.exception("grammar_compile_failed", request_id=message.request_id)
                self._batch.failures.append(
                    protocol.Failure(message.request_id, f"request not added: {exc}")
                )
                continue
            self._add(message, grammar)

    def _adapter_step(self) -> None:
        """Install the load whose read is done, else apply the oldest adapter load or
        unload (a load starts its read), and answer it (module docstring)."""
        if self._reading is not None:
            message, read = self._reading
            if not read.done():
                return
            self._reading = None
            self._answer(message, self._install, message, read)
        elif self._adapter_work:
            message = self._adapter_work.popleft()
            if isinstance(message, protocol.LoadAdapter):
                self._answer(message, self._start_load, message)
            else:
                self._answer(message, self.engine.unload_adapter, message.name)

    def _answer(self, message, apply, *args) -> None:
        """Answer message with apply(*args): a LoadedAdapter, an unload's whether it was
        loaded, or None for a load whose read just started (answered once installed)."""
        answer = protocol.AdapterAnswer(message.token)
        try:
            result = apply(*args)
        except AdapterError as exc:
            self._refused(message, answer, exc, str(exc))
        except Exception as exc:  # a loader bug refuses this load, not the core
            log.exception("engine_adapter_failed", adapter=message.name)
            self._refused(message, answer, exc, f"adapter {message.name!r}: {exc}")
        else:
            if result is None:
                return
            if isinstance(message, protocol.LoadAdapter):
                answer.loaded = result
            else:
                answer.found = result
        # Its batch first: the answer then finds the new set in the load report.
        self._flush(force=True)
        self._send(answer)

    def _start_load(self, message: protocol.LoadAdapter):
        """What needs no reading is refused (or done) now; else the read starts."""
        check_adapter_name(message.name)
        check_adapter_size(message.source, self._adapter_bytes)
        before = self.engine.adapters()
        loaded = self.engine.lora.prepare(message.name, message.source)
        if loaded is None:
            self._reading = (message, self._reader.submit(self.engine.lora.read, message.source))
        elif message.name not in before:  # it cancelled an unload: loaded again
            metrics.LORA_ADAPTER_LOADS.labels("loaded").inc()
        return loaded

    def _install(self, message: protocol.LoadAdapter, read: Future):
        before = set(self.engine.adapters())
        loaded = self.engine.install_adapter(message.name, message.source, read.result())
        metrics.LORA_ADAPTER_LOADS.labels("loaded").inc()
        # A load makes room by unloading idle adapters (lora/registry.py).
        metrics.LORA_ADAPTER_EVICTIONS.inc(len(before - set(self.engine.adapters())))
        return loaded

    def _refused(self, message, answer: protocol.AdapterAnswer, exc: Exception, why: str):
        answer.error, answer.message = type(exc).__name__, why
        if isinstance(message, protocol.LoadAdapter):
            metrics.LORA_ADAPTER_LOADS.labels(LOAD_RESULTS.get(type(exc), "error")).inc()

    def _step(self) -> None:
        try:
            self._batch.outputs += self.engine.step()
        except Exception as exc:  # a model bug must not wedge every caller
            log.exception("engine_step_failed")
            failed = list(self.engine.requests)
            for request_id in failed:
                self.engine.abort(request_id)
            self._batch.failures += [
                protocol.Failure(r, f"engine step failed: {exc}", engine=True) for r in failed
            ]
        self._stepped = True

    def _batch_scheduled(self, request_id: str) -> None:
        self._batch.scheduled.append(request_id)

    def _new_batch(self) -> protocol.StepBatch:
        return protocol.StepBatch(load=protocol.Load())

    def _flush(self, force: bool = False) -> None:
        batch = self._batch
        if not (force or self._stepped or batch.outputs or batch.failures or batch.kv_events):
            return
        scheduler = self.engine.scheduler
        batch.load = protocol.Load(
            len(scheduler.running),
            len(scheduler.waiting),
            self.engine.blocks.usage,
            *self._adapters_of(scheduler.running, scheduler.waiting),
        )
        adapters = self.engine.adapters()
        if adapters != self._adapters_sent:
            now, before = set(adapters), set(self._adapters_sent)
            batch.kv_events += [(protocol.ADAPTER_UNLOADED, a) for a in sorted(before - now)]
            batch.kv_events += [(protocol.ADAPTER_LOADED, a) for a in sorted(now - before)]
            batch.adapters = self._adapters_sent = adapters
            metrics.LORA_ADAPTERS_LOADED.set(len(adapters))
        # The gauges follow every flush, not only steps: an abort that leaves
        # the engine idle must show it idle (no step runs after it).
        load = batch.load
        metrics.record_load(load.running, load.waiting, load.kv_cache_usage)
        now = time.monotonic()
        idle = not self.engine.has_work
        if idle or now - self._metrics_sent >= METRICS_INTERVAL_SECONDS:
            batch.metrics = engine_metrics_text()
            self._metrics_sent = now
        self._send(batch)
        self._batch, self._stepped = self._new_batch(), False

    def _adapters_of(self, *queues) -> list[list[str]]:
        """The adapters the sequences of each queue run with, each once."""
        return [sorted({seq.adapter for seq in queue} - {""}) for queue in queues]

    def _send(self, message) -> None:
        self._outputs.send(protocol.encode(message))
