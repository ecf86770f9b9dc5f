"""The engine loop: schedule, run the model, sample, and turn tokens into outputs.

Single-threaded by design: one thread owns this object and calls step(); the
asyncio side (async_engine.py) only talks to it through that thread.

One request can harm only itself. validate() refuses at admission whatever
could never run; if a step still raises, the request that caused it fails
alone (one output with finish_reason "error") and the rest of the batch goes
on. The batched parts of a step, the proposer's drafts, the forward pass and
the sampler, are bisected (isolation.py) until every request either ran in a
part that succeeded or failed on its own (a sampler part that raised may have
drawn from its seeded generators, so only a step that failed can change a
seeded sample); the bookkeeping is done request by request, and a request
that raises there fails without touching the others.
Retrying the forward on a subset is safe because a forward only writes the
KV of the positions it computes, at or past each sequence's
num_computed_tokens: those slots are in blocks the sequence owns alone (cache
hits and forks share only computed blocks, and a write to a shared block is
copied first), no one reads them before they are computed, and the attempt
that succeeds rewrites every one of them in every layer. So an attempt that
raised halfway leaves nothing another sequence can see, and only the block
copies of a part's own sequences are replayed with it. Nothing is hashed
into the prefix cache before a part's forward succeeded. What bisection
cannot pin on a request (the scheduler raising, or every request of a batch
failing alone, which is a broken engine or device, not a bad request)
propagates, and the caller fails every request as before.

LoRA adapters (docs/lora.md): the engine's AdapterRegistry holds them; a request
names one (add_request's adapter) and holds it until it ends, so an unload lets it
finish. Its blocks are salted with the adapter's name, so the prefix cache never
serves it the base model's KV or another adapter's.
"""

import threading
import time
from collections.abc import Callable

import torch

from maas_services.common.block_hash import request_salt
from maas_services.common.detokenizer import IncrementalDetokenizer
from maas_services.common.grammar.spec import GrammarError
from maas_services.common.length_check import ContextLengthError, check_length
from maas_services.common.logging import get_logger
from maas_services.common.text_tokenizer import TextTokenizer
from maas_services.engine import metrics
from maas_services.engine.block_manager import BlockManager
from maas_services.engine.embedding import embedding_vector
from maas_services.engine.engine_config import EngineConfig
from maas_services.engine.grammar.matcher import GrammarState
from maas_services.engine.isolation import bisect_failures
from maas_services.engine.logprobs import token_logprob
from maas_services.engine.lora.adapter import AdapterWeights
from maas_services.engine.lora.loaded import LoadedAdapter
from maas_services.engine.lora.registry import AdapterRegistry
from maas_services.engine.model_config import ModelConfig
from maas_services.engine.model_runner import Forward
from maas_services.engine.request import Request, SampleText, SeqOutput
from maas_services.engine.resume import ResumeError, replay
from maas_services.engine.sampler import Sampler, make_generator
from maas_services.engine.sampling_params import SamplingParams
from maas_services.engine.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from maas_services.engine.sequence import Sequence
from maas_services.engine.spec.decoder import SpeculativeDecoder
from maas_services.engine.spec.proposer import TargetInfo
from maas_services.engine.step_stats import FinishedRequest, StepStats
from maas_services.engine.stop_strings import StopStringMatcher

log = get_logger(__name__)


class RequestRejected(ValueError):
    """The request can never run here; the message says why."""


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        runner,  # ModelRunner: execute(scheduled, block_copies) -> Forward
        tokenizer: TextTokenizer,
        on_kv_event: Callable[[str, list[int]], None] | None = None,
    ):
        self.config = config
        self.model_config = model_config
        self.runner = runner
        self.tokenizer = tokenizer
        self.blocks = BlockManager(config.num_blocks, config.block_size, on_event=on_kv_event)
        self.scheduler = Scheduler(config.scheduler, self.blocks, config.max_loras)
        self.lora = AdapterRegistry(
            model_config,
            config.max_loras,
            config.max_lora_rank,
            config.max_cpu_loras,
            runner.device,
            runner.model.dtype,
        )
        self.sampler = Sampler(model_config.eos_token_ids)
        target = TargetInfo(
            vocab_size=model_config.vocab_size,
            max_model_len=config.max_model_len,
            device=runner.device,
            dtype=runner.model.dtype,
        )
        self.spec = SpeculativeDecoder(config.speculative, self.sampler, target)
        self.requests: dict[str, Request] = {}
        self._grammars = None  # GrammarCompiler, built on first use (grammar_compiler)
        self._grammars_lock = threading.Lock()
        # Called with a request's id when it first enters a step.
        self.on_scheduled: Callable[[str], None] | None = None
        # Called with the rows a step computes (decode rows + prefill tokens)
        # before its forward: the core picks its compute threads (core/compute_threads.py).
        self.before_forward: Callable[[int], None] | None = None
        self.last_stats = StepStats()  # the latest step's, for tools and tests

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def capacity_tokens(self) -> int:
        return self.config.num_blocks * self.config.block_size

    def load_adapter(self, name: str, source: str, pinned: bool = False) -> LoadedAdapter:
        """Load the PEFT folder `source` as adapter `name` (lora/registry.py: AdapterError
        subclasses say why not; a refused load leaves the engine as it was). The engine
        core does the same in steps, reading the folder off its thread (core/engine_core.py)."""
        loaded = self.lora.prepare(name, source, pinned)
        if loaded is None:
            loaded = self.install_adapter(name, source, self.lora.read(source), pinned)
        return loaded

    def install_adapter(
        self, name: str, source: str, weights: AdapterWeights, pinned: bool = False
    ) -> LoadedAdapter:
        """Make weights read from `source` (AdapterRegistry.read) resident as `name`."""
        loaded = self.lora.install(name, source, weights, pinned)
        log.info("adapter_loaded", adapter=name, source=source, rank=loaded.rank, pinned=pinned)
        return loaded

    def unload_adapter(self, name: str) -> bool:
        """Whether `name` was loaded; requests already running with it finish."""
        found = self.lora.unload(name)
        if found:
            log.info("adapter_unloaded", adapter=name)
        return found

    def adapters(self) -> list[str]:
        """The adapters a request may name."""
        return self.lora.names()

    def grammar_compiler(self):
        """The grammar compiler for this engine's vocabulary, built once.

        On the first request with a grammar, as vLLM builds its own: building it
        imports xgrammar, reads the whole vocabulary and starts the worker process
        (SmolLM2 on 2 Zen 3 cores: ~8 s of CPU, 147 MB in the core and a 282 MB
        child), which an engine serving no grammar never needs, and which, built
        as the engine reported ready, took CPU from the requests that had waited
        for the replica (a scale from zero). The core builds it on its compile
        thread (core/grammar_compiles.py): that first request waits for it (its
        first token 6.9 s after it was sent, the next one's 0.09 s) while the
        others keep stepping. Hence the lock.
        """
        with self._grammars_lock:
            if self._grammars is None:
                from maas_services.common.grammar.compiler import GrammarCompiler
                from maas_services.common.grammar.vocab import tokenizer_info

                # The same info as the tokenizer service's check (vocab.py).
                info = tokenizer_info(self.tokenizer, self.model_config.vocab_size)
                self._grammars = GrammarCompiler(info)
            return self._grammars

    def compile_grammar(self, params: SamplingParams):
        """params.grammar compiled (None without one), or RequestRejected.

        Touches only the compiler, which is safe off this object's thread: the
        core compiles new grammars on a worker (core/grammar_compiles.py).
        """
        if params.grammar is None:
            return None
        try:
            return self.grammar_compiler().compile(params.grammar)
        except GrammarError as exc:
            raise RequestRejected(f"grammar: {exc}") from exc

    def validate(self, prompt_ids: list[int], params: SamplingParams, compile_grammar: bool = True):
        """Refuse, at admission, anything that could never complete.

        Returns the compiled grammar (None without one, or when not asked to
        compile it), for add_request.
        """
        if not prompt_ids:
            raise RequestRejected("prompt_token_ids is empty")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise RequestRejected(f"prompt token ids must be in [0, {vocab})")
        try:
            params.validate(vocab, self.model_config.hidden_size)
            check_length(len(prompt_ids), params.max_tokens, self.config.max_model_len)
        except (ValueError, ContextLengthError) as exc:
            raise RequestRejected(str(exc)) from exc
        # The last sampled token is never fed back, so it needs no slot.
        needed = len(prompt_ids) + max(params.max_tokens - 1, 0)
        if needed > self.capacity_tokens:
            raise RequestRejected(
                f"prompt + max_tokens needs {needed} KV slots but this engine's cache holds "
                f"{self.capacity_tokens}; lower max_tokens or shorten the prompt"
            )
        return self.compile_grammar(params) if compile_grammar else None

    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        tenant: str = "",
        share_prefix_cache: bool = False,
        grammar=None,
        adapter: str = "",
    ) -> None:
        """grammar: params.grammar already compiled (compile_grammar); else it is compiled here.
        adapter: the LoRA adapter to run with ("" = the base model); AdapterNotFound unless
        it is loaded."""
        if request_id in self.requests:
            raise RequestRejected(f"request {request_id!r} is already running")
        compiled = self.validate(prompt_ids, params, compile_grammar=grammar is None)
        grammar = compiled if grammar is None else grammar
        salt = request_salt(
            self.config.cache_salt,
            self.config.prefix_cache_sharing,
            tenant,
            share_prefix_cache,
            adapter,
        )
        request = Request(
            request_id, list(prompt_ids), params, priority, cache_salt=salt, adapter=adapter
        )
        request.grammar = grammar
        if adapter:
            self.lora.acquire(adapter)
        try:
            self._add_sample(request, 0, parent=None)
        except ResumeError as exc:
            if adapter:
                self.lora.release(adapter)
            raise RequestRejected(str(exc)) from exc
        self.requests[request_id] = request
        metrics.REQUESTS_WAITING.set(len(self.scheduler.waiting))

    def _add_sample(self, request: Request, index: int, parent: Sequence | None) -> Sequence:
        resumed = request.params.resume_ids if parent is None else []
        seq = Sequence(
            request_id=request.request_id,
            index=index,
            token_ids=list(parent.token_ids if parent else request.prompt_ids + resumed),
            num_prompt_tokens=len(request.prompt_ids),
            params=request.params,
            generator=make_generator(request.params.sample_seed(index)),
            priority=request.priority,
            arrival_time=request.arrival_time,
            cache_salt=request.cache_salt,
            adapter=request.adapter,
            grammar=GrammarState(request.grammar) if request.grammar is not None else None,
        )
        text = SampleText(
            IncrementalDetokenizer(self.tokenizer, request.prompt_ids),
            StopStringMatcher(list(request.params.stop)),
        )
        # A migrated request's delivered output (resume.py); raises ResumeError.
        replay(text, seq.grammar, resumed)
        # Nothing below raises: abort() and _fail() only ever see samples the
        # scheduler holds.
        request.seqs.append(seq)
        request.texts[index] = text
        if parent is None:
            self.scheduler.add(seq)
        else:
            # A parallel sample starts where its parent's prompt ends, sharing its blocks.
            seq.num_computed_tokens = parent.num_computed_tokens
            seq.num_cached_tokens = parent.num_cached_tokens
            self.blocks.fork(parent, seq)
            self.scheduler.add_running(seq)
        return seq

    def abort(self, request_id: str) -> list[SeqOutput]:
        request = self.requests.get(request_id)
        if request is None:
            return []
        metrics.REQUESTS_FINISHED.labels("abort").inc()
        return [self._output(request, seq, [], "", "abort") for seq in self._end(request, "abort")]

    def _fail(self, request: Request, exc: Exception, stats: StepStats) -> list[SeqOutput]:
        """End a request that made the step raise; one output carries the error."""
        log.warning(
            "request_failed_step", request_id=request.request_id, error=repr(exc), exc_info=exc
        )
        self._end(request, "error")
        stats.finished.append(FinishedRequest("error"))
        error = (
            f"the engine failed on this request ({type(exc).__name__}: {exc}); "
            "it was removed, and the other requests in its batch went on"
        )
        return [self._output(request, request.seqs[0], [], "", "error", error=error)]

    def _end(self, request: Request, reason: str) -> list[Sequence]:
        """Forget the request, freeing its unfinished samples; return those samples."""
        self._forget(request)
        return self._stop(request, reason)

    def _forget(self, request: Request) -> None:
        """The request is over: it no longer holds its adapter."""
        if self.requests.pop(request.request_id, None) is not None and request.adapter:
            self.lora.release(request.adapter)

    def _stop(self, request: Request, reason: str) -> list[Sequence]:
        stopped = [seq for seq in request.seqs if seq.finish_reason is None]
        for seq in stopped:
            self.scheduler.finish(seq, reason)
        return stopped

    def step(self) -> list[SeqOutput]:
        """Propose, schedule, run, postprocess; a request that makes it raise fails
        alone (module docstring). The step's counts and timings are recorded once,
        from the StepStats its phases fill in."""
        stats = StepStats()
        try:
            culprits = self._propose(stats)
            started = time.perf_counter()
            plan = self.scheduler.schedule()
            self._admit(plan, stats)
            stats.phase_seconds["schedule"] = time.perf_counter() - started
            if self.before_forward is not None:
                self.before_forward(stats.num_decode_tokens + stats.num_prefill_tokens)
            ran = self._run(plan, culprits, stats)
            return self._postprocess(ran, culprits, stats)
        finally:
            # A step that raised still preempted and admitted what it counted.
            metrics.record_step(stats)
            self.last_stats = stats

    def _propose(self, stats: StepStats) -> dict[str, Exception]:
        """Draft for the running sequences; the requests whose drafting raised,
        already out of the schedule (they fail at the end of the step: if it
        raises before then, the caller's fail-all still finds them)."""
        running = list(self.scheduler.running)
        if not running:
            return {}
        started = time.perf_counter()
        parts, failed = bisect_failures(running, self.spec.propose)
        stats.phase_seconds["propose"] = time.perf_counter() - started
        proposer = [seconds for _, seconds in parts if seconds is not None]
        if proposer:
            stats.propose_seconds = sum(proposer)
        culprits = {seq.request_id: exc for seq, exc in failed}
        for request_id in culprits:
            self._stop(self.requests[request_id], "error")
        return culprits

    def _admit(self, plan: SchedulerOutput, stats: StepStats) -> None:
        """The schedule's counts, and each request's first admission."""
        now = time.monotonic()
        stats.batch_size = len(plan.scheduled)
        stats.num_preempted = len(plan.preempted)
        for item in plan.scheduled:
            seq = item.seq
            decode = seq.num_computed_tokens >= seq.num_prompt_tokens
            if decode and item.num_new_tokens == 1 + seq.num_draft_tokens:
                stats.num_decode_tokens += item.num_new_tokens
            else:
                stats.num_prefill_tokens += item.num_new_tokens
        for seq in plan.admitted:
            request = self.requests[seq.request_id]
            stats.prefix_queried_tokens += seq.num_tokens
            stats.prefix_hit_tokens += seq.num_cached_tokens
            if request.cached_prompt_tokens is None:
                if self.on_scheduled is not None:
                    self.on_scheduled(request.request_id)
                request.cached_prompt_tokens = seq.num_cached_tokens
                request.scheduled_time = now
                stats.prompt_tokens += len(request.prompt_ids)
                stats.queue_seconds.append(now - request.arrival_time)

    def _run(
        self, plan: SchedulerOutput, culprits: dict[str, Exception], stats: StepStats
    ) -> list[tuple[list[ScheduledSeq], Forward]]:
        """The forward over the schedule, bisected: the parts that ran with their
        results; the requests that failed alone join culprits."""
        if not plan.scheduled:
            return []
        started = time.perf_counter()
        parts, failed = bisect_failures(plan.scheduled, lambda part: self._execute(part, plan))
        stats.phase_seconds["forward"] = time.perf_counter() - started
        if failed and not parts and len({item.seq.request_id for item, _ in failed}) > 1:
            raise failed[0][1]
        culprits.update((item.seq.request_id, exc) for item, exc in failed)
        return parts

    def _execute(self, part: list[ScheduledSeq], plan: SchedulerOutput) -> Forward:
        copies = plan.block_copies
        if copies and len(part) < len(plan.scheduled):
            # Replaying another part's copies would overwrite KV that part already wrote.
            owned = {block for item in part for block in item.seq.block_table}
            copies = [(src, dst) for src, dst in copies if dst in owned]
        return self.runner.execute(part, copies, self.lora.weights)

    def _postprocess(
        self,
        ran: list[tuple[list[ScheduledSeq], Forward]],
        culprits: dict[str, Exception],
        stats: StepStats,
    ) -> list[SeqOutput]:
        """Bookkeeping request by request, one sampler call for the batch, then
        the outputs; the culprits fail last."""
        started = time.perf_counter()
        # Rows are cut before any bookkeeping: verification changes what
        # num_logits would say, and may finish (and free) the sequence. An
        # entry that pools gets its hidden row instead of logits.
        work: dict[str, list[tuple[ScheduledSeq, torch.Tensor]]] = {}
        for part, forward in ran:
            offset = pooled = 0
            for item in part:
                if item.pools:
                    rows = forward.pooled[pooled : pooled + 1]
                    pooled += 1
                else:
                    rows = forward.logits[offset : offset + item.num_logits]
                    offset += item.num_logits
                work.setdefault(item.seq.request_id, []).append((item, rows))
        outputs: list[SeqOutput] = []
        pending: list[tuple[Sequence, torch.Tensor]] = []
        for request_id, items in work.items():
            if request_id in culprits:
                continue
            try:
                done, to_sample = self._prepare(items, stats)
            except Exception as exc:
                culprits[request_id] = exc
                continue
            outputs += done
            pending += to_sample
        # One sampler call for the whole batch; split only when it raises.
        sampled, failed = bisect_failures(pending, self._sample) if pending else ([], [])
        culprits.update((seq.request_id, exc) for (seq, _), exc in failed)
        for part, tokens in sampled:
            for (seq, row), token in zip(part, tokens, strict=True):
                if seq.request_id in culprits:
                    continue
                try:
                    outputs.append(self._append_token(seq, token, row, stats))
                except Exception as exc:
                    culprits[seq.request_id] = exc
        for request_id, exc in culprits.items():
            if request_id in self.requests:
                outputs += self._fail(self.requests[request_id], exc, stats)
        stats.num_running = len(self.scheduler.running)
        stats.num_waiting = len(self.scheduler.waiting)
        stats.kv_cache_usage = self.blocks.usage
        stats.phase_seconds["postprocess"] = time.perf_counter() - started
        return outputs

    def _prepare(
        self, items: list[tuple[ScheduledSeq, torch.Tensor]], stats: StepStats
    ) -> tuple[list[SeqOutput], list[tuple[Sequence, torch.Tensor]]]:
        """One request's bookkeeping after a step ran: the outputs of verified
        drafts and finished embeddings, and the samples still to draw, each with
        its logits row."""
        for item, _ in items:
            # Drafted positions count as computed only once accepted (below).
            item.seq.num_computed_tokens += item.num_new_tokens - item.seq.num_draft_tokens
        outputs: list[SeqOutput] = []
        to_sample: list[tuple[Sequence, torch.Tensor]] = []
        for item, seq_rows in items:
            seq = item.seq
            if len(seq_rows) and seq.num_draft_tokens:
                outputs += self._append_verified(seq, seq_rows, stats)
                continue
            self.blocks.mark_computed(seq, seq.num_computed_tokens)
            if seq.embeds:
                # Its row is the pooled state, there only once its last chunk ran.
                if len(seq_rows):
                    outputs.append(self._embedded(seq, seq_rows[0], stats))
            elif len(seq_rows):
                to_sample += [(sample, seq_rows[-1]) for sample in [seq, *self._fork_samples(seq)]]
        return outputs, to_sample

    def _sample(self, part: list[tuple[Sequence, torch.Tensor]]) -> list[int]:
        return self.sampler(torch.stack([row for _, row in part]), [seq for seq, _ in part])

    def _append_verified(
        self, seq: Sequence, rows: torch.Tensor, stats: StepStats
    ) -> list[SeqOutput]:
        """Keep the accepted draft and the token after it, stopping where the sequence ends."""
        drafted = seq.num_draft_tokens
        tokens = self.spec.accept(seq, rows)
        stats.verifications.append((drafted, len(tokens) - 1))
        # The KV of the last real token and of every accepted draft token is valid.
        seq.num_computed_tokens += len(tokens) - 1
        self.blocks.mark_computed(seq, seq.num_computed_tokens)
        outputs = []
        for token, row in zip(tokens, rows, strict=False):
            outputs.append(self._append_token(seq, token, row, stats))
            if outputs[-1].finish_reason is not None:
                break
        return outputs

    def _embedded(self, seq: Sequence, hidden: torch.Tensor, stats: StepStats) -> SeqOutput:
        """An embedding request's one output: its prompt is computed, its blocks
        are cached (above), and it ends here."""
        request = self.requests[seq.request_id]
        vector = embedding_vector(hidden, seq.params.embedding)
        self._finish(request, seq, "stop", time.monotonic(), stats)
        return self._output(request, seq, [], "", "stop", embedding=vector)

    def _fork_samples(self, seq: Sequence) -> list[Sequence]:
        request = self.requests[seq.request_id]
        if seq.index != 0 or seq.output_ids or len(request.seqs) == request.params.n:
            return []
        return [self._add_sample(request, i, parent=seq) for i in range(1, request.params.n)]

    def _append_token(
        self, seq: Sequence, token: int, row: torch.Tensor, stats: StepStats
    ) -> SeqOutput:
        request = self.requests[seq.request_id]
        now = time.monotonic()
        if seq.grammar is not None and not seq.grammar.accept(token):
            # The mask allows only what the matcher accepts: a broken invariant.
            raise RuntimeError(f"the grammar refused sampled token {token}")
        seq.token_ids.append(token)
        stats.num_generated_tokens += 1
        if request.first_token_time is None:
            request.first_token_time = now
            stats.ttft_seconds.append(now - request.arrival_time)
        if seq.last_token_time is not None:
            stats.itl_seconds.append(now - seq.last_token_time)
        seq.last_token_time = now
        text_state = request.texts[seq.index]
        text, stopped = text_state.stops.push(text_state.detokenizer.push(token))
        reason = "stop" if stopped else self._finish_reason(seq, token)
        if reason is not None and not stopped:
            tail, stopped = text_state.stops.push(text_state.detokenizer.flush())
            text += tail if stopped else tail + text_state.stops.flush()
        logprobs = []
        if seq.params.logprobs:
            logprobs = [token_logprob(row, token, seq.params.top_logprobs)]
        if reason is not None:
            self._finish(request, seq, reason, now, stats)
        return self._output(request, seq, [token], text, reason, logprobs)

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if seq.grammar is not None and seq.grammar.terminated:
            return "stop"
        if token in params.stop_token_ids:
            return "stop"
        if not params.ignore_eos and token in self.model_config.eos_token_ids:
            return "stop"
        if len(seq.output_ids) >= params.max_tokens:
            return "length"
        if seq.num_tokens >= self.config.max_model_len:
            return "length"
        return None

    def _finish(
        self, request: Request, seq: Sequence, reason: str, now: float, stats: StepStats
    ) -> None:
        self.scheduler.finish(seq, reason)
        if not request.finished:
            return
        self._forget(request)
        generated = max(len(s.output_ids) for s in request.seqs)
        tpot = None
        if generated > 1 and request.first_token_time is not None:
            tpot = (now - request.first_token_time) / (generated - 1)
        stats.finished.append(FinishedRequest(reason, now - request.arrival_time, tpot))

    def _output(
        self, request, seq, tokens, text, reason, logprobs=(), error=None, embedding=()
    ) -> SeqOutput:
        return SeqOutput(
            request_id=request.request_id,
            index=seq.index,
            token_ids=list(tokens),
            text=text,
            finish_reason=reason,
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(seq.output_ids),
            cached_prompt_tokens=request.cached_prompt_tokens or 0,
            computed_prompt_tokens=(
                seq.num_prompt_tokens
                if seq.output_ids
                else min(seq.num_computed_tokens, seq.num_prompt_tokens)
            ),
            logprobs=list(logprobs),
            arrival_time=request.arrival_time,
            scheduled_time=request.scheduled_time,
            first_token_time=request.first_token_time,
            error=error,
            embedding=list(embedding),
        )
