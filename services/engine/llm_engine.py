"""The engine loop: schedule, run the model, sample, and turn tokens into outputs.

Single-threaded by design: one thread owns this object and calls step(); the
asyncio side (async_engine.py) only talks to it through that thread.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from services.common.block_hash import request_salt
from services.common.detokenizer import IncrementalDetokenizer
from services.common.text_tokenizer import TextTokenizer
from services.engine import metrics
from services.engine.block_manager import BlockManager
from services.engine.logprobs import token_logprob
from services.engine.model_config import ModelConfig
from services.engine.request import Request, SampleText, SeqOutput
from services.engine.sampler import Sampler, make_generator
from services.engine.sampling_params import SamplingParams
from services.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from services.engine.sequence import Sequence
from services.engine.spec.config import SpecConfig
from services.engine.spec.decoder import SpeculativeDecoder
from services.engine.spec.proposer import TargetInfo
from services.engine.stop_strings import StopStringMatcher
from services.tokenizer.length_check import ContextLengthError, check_length


@dataclass
class EngineConfig:
    num_blocks: int
    max_model_len: int
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    # Part of every block hash: caches of different weights never match.
    cache_salt: str = ""
    # "tenant" or "global": whether requests may ask to share blocks across tenants.
    prefix_cache_sharing: str = "tenant"
    speculative: SpecConfig = field(default_factory=SpecConfig)


class RequestRejected(ValueError):
    """The request can never run here; the message says why."""


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        runner,  # ModelRunner: execute(scheduled, block_copies) -> logits
        tokenizer: TextTokenizer,
        on_kv_event: Callable[[str, list[int]], None] | None = None,
    ):
        self.config = config
        self.model_config = model_config
        self.runner = runner
        self.tokenizer = tokenizer
        self.blocks = BlockManager(config.num_blocks, config.block_size, on_event=on_kv_event)
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                enable_chunked_prefill=config.enable_chunked_prefill,
            ),
            self.blocks,
        )
        self.sampler = Sampler(model_config.eos_token_ids)
        target = TargetInfo(
            vocab_size=model_config.vocab_size,
            max_model_len=config.max_model_len,
            device=runner.device,
            dtype=runner.kv_cache.k.dtype,
        )
        self.spec = SpeculativeDecoder(config.speculative, self.sampler, target)
        self.requests: dict[str, Request] = {}

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def capacity_tokens(self) -> int:
        return self.config.num_blocks * self.config.block_size

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Refuse, at admission, anything that could never complete."""
        if not prompt_ids:
            raise RequestRejected("prompt_token_ids is empty")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise RequestRejected(f"prompt token ids must be in [0, {vocab})")
        try:
            params.validate()
            check_length(len(prompt_ids), params.max_tokens, self.config.max_model_len)
        except (ValueError, ContextLengthError) as exc:
            raise RequestRejected(str(exc)) from exc
        # The last sampled token is never fed back, so it needs no slot.
        needed = len(prompt_ids) + params.max_tokens - 1
        if needed > self.capacity_tokens:
            raise RequestRejected(
                f"prompt + max_tokens needs {needed} KV slots but this engine's cache holds "
                f"{self.capacity_tokens}; lower max_tokens or shorten the prompt"
            )

    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        tenant: str = "",
        share_prefix_cache: bool = False,
    ) -> None:
        if request_id in self.requests:
            raise RequestRejected(f"request {request_id!r} is already running")
        self.validate(prompt_ids, params)
        salt = request_salt(
            self.config.cache_salt, self.config.prefix_cache_sharing, tenant, share_prefix_cache
        )
        request = Request(request_id, list(prompt_ids), params, priority, cache_salt=salt)
        self.requests[request_id] = request
        self._add_sample(request, 0, parent=None)
        metrics.REQUESTS_WAITING.set(len(self.scheduler.waiting))

    def _add_sample(self, request: Request, index: int, parent: Sequence | None) -> Sequence:
        seed = request.params.seed
        seq = Sequence(
            request_id=request.request_id,
            index=index,
            token_ids=list(parent.token_ids if parent else request.prompt_ids),
            num_prompt_tokens=len(request.prompt_ids),
            params=request.params,
            generator=make_generator(None if seed is None else seed + index),
            priority=request.priority,
            arrival_time=request.arrival_time,
            cache_salt=request.cache_salt,
        )
        request.seqs.append(seq)
        request.texts[index] = SampleText(
            IncrementalDetokenizer(self.tokenizer, request.prompt_ids),
            StopStringMatcher(list(request.params.stop)),
        )
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
        request = self.requests.pop(request_id, None)
        if request is None:
            return []
        outputs = []
        for seq in request.seqs:
            if seq.finish_reason is None:
                self.scheduler.finish(seq, "abort")
                outputs.append(self._output(request, seq, [], "", "abort"))
        metrics.REQUESTS_FINISHED.labels("abort").inc()
        return outputs

    def step(self) -> list[SeqOutput]:
        self.spec.propose(self.scheduler.running)
        plan = self.scheduler.schedule()
        self._record_schedule(plan)
        if not plan.scheduled:
            return []
        logits = self.runner.execute(plan.scheduled, plan.block_copies)
        rows_of: list[tuple[Sequence, torch.Tensor]] = []
        # Decided before any bookkeeping: verification changes what num_logits
        # would say, and may finish (and free) the sequence.
        chunks: list[Sequence] = []
        offset = 0
        for item in plan.scheduled:
            if item.num_logits:
                rows_of.append((item.seq, logits[offset : offset + item.num_logits]))
                offset += item.num_logits
            else:
                chunks.append(item.seq)
            # Drafted positions count as computed only once accepted (below).
            item.seq.num_computed_tokens += item.num_new_tokens - item.seq.num_draft_tokens
        outputs: list[SeqOutput] = []
        samplers: list[Sequence] = []
        rows: list[torch.Tensor] = []
        for seq, seq_rows in rows_of:
            if seq.num_draft_tokens:
                outputs += self._append_verified(seq, seq_rows)
                continue
            self.blocks.mark_computed(seq, seq.num_computed_tokens)
            group = [seq, *self._fork_samples(seq)]
            samplers += group
            rows += [seq_rows[-1]] * len(group)
        for seq in chunks:
            self.blocks.mark_computed(seq, seq.num_computed_tokens)
        tokens = self.sampler(torch.stack(rows), samplers) if rows else []
        outputs += [
            self._append_token(seq, token, row)
            for seq, token, row in zip(samplers, tokens, rows, strict=True)
        ]
        self._record_state()
        return outputs

    def _append_verified(self, seq: Sequence, rows: torch.Tensor) -> list[SeqOutput]:
        """Keep the accepted draft and the token after it, stopping where the sequence ends."""
        tokens = self.spec.accept(seq, rows)
        # The KV of the last real token and of every accepted draft token is valid.
        seq.num_computed_tokens += len(tokens) - 1
        self.blocks.mark_computed(seq, seq.num_computed_tokens)
        outputs = []
        for token, row in zip(tokens, rows, strict=False):
            outputs.append(self._append_token(seq, token, row))
            if outputs[-1].finish_reason is not None:
                break
        return outputs

    def _fork_samples(self, seq: Sequence) -> list[Sequence]:
        request = self.requests[seq.request_id]
        if seq.index != 0 or seq.output_ids or len(request.seqs) == request.params.n:
            return []
        return [self._add_sample(request, i, parent=seq) for i in range(1, request.params.n)]

    def _append_token(self, seq: Sequence, token: int, row: torch.Tensor) -> SeqOutput:
        request = self.requests[seq.request_id]
        now = time.monotonic()
        seq.token_ids.append(token)
        metrics.GENERATION_TOKENS.inc()
        if request.first_token_time is None:
            request.first_token_time = now
            metrics.TTFT_SECONDS.observe(now - request.arrival_time)
        if seq.last_token_time is not None:
            metrics.ITL_SECONDS.observe(now - seq.last_token_time)
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
            self._finish(request, seq, reason, now)
        return self._output(request, seq, [token], text, reason, logprobs)

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if token in params.stop_token_ids:
            return "stop"
        if not params.ignore_eos and token in self.model_config.eos_token_ids:
            return "stop"
        if len(seq.output_ids) >= params.max_tokens:
            return "length"
        if seq.num_tokens >= self.config.max_model_len:
            return "length"
        return None

    def _finish(self, request: Request, seq: Sequence, reason: str, now: float) -> None:
        self.scheduler.finish(seq, reason)
        if not request.finished:
            return
        del self.requests[request.request_id]
        metrics.REQUESTS_FINISHED.labels(reason).inc()
        metrics.E2E_SECONDS.observe(now - request.arrival_time)
        generated = max(len(s.output_ids) for s in request.seqs)
        if generated > 1 and request.first_token_time is not None:
            metrics.TPOT_SECONDS.observe((now - request.first_token_time) / (generated - 1))

    def _output(self, request, seq, tokens, text, reason, logprobs=()) -> SeqOutput:
        return SeqOutput(
            request_id=request.request_id,
            index=seq.index,
            token_ids=list(tokens),
            text=text,
            finish_reason=reason,
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(seq.output_ids),
            cached_prompt_tokens=request.cached_prompt_tokens or 0,
            logprobs=list(logprobs),
            arrival_time=request.arrival_time,
            scheduled_time=request.scheduled_time,
            first_token_time=request.first_token_time,
        )

    def _record_schedule(self, plan: SchedulerOutput) -> None:
        now = time.monotonic()
        for seq in plan.admitted:
            request = self.requests[seq.request_id]
            metrics.PREFIX_QUERIED.inc(seq.num_tokens)
            metrics.PREFIX_HITS.inc(seq.num_cached_tokens)
            if request.cached_prompt_tokens is None:
                request.cached_prompt_tokens = seq.num_cached_tokens
                request.scheduled_time = now
                metrics.PROMPT_TOKENS.inc(len(request.prompt_ids))
                metrics.QUEUE_SECONDS.observe(now - request.arrival_time)
        metrics.PREEMPTIONS.inc(len(plan.preempted))
        if plan.scheduled:
            metrics.BATCH_SIZE.observe(len(plan.scheduled))
            metrics.STEP_TOKENS.observe(plan.num_tokens)

    def _record_state(self) -> None:
        metrics.REQUESTS_RUNNING.set(len(self.scheduler.running))
        metrics.REQUESTS_WAITING.set(len(self.scheduler.waiting))
        metrics.KV_CACHE_USAGE.set(self.blocks.usage)
