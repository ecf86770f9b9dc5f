"""Continuous batching with chunked prefill and preemption by recompute.

Every step spends a token budget (max_num_batched_tokens): running sequences
first, in priority order, one token each for decodes and up to the rest of
the budget for a prompt still being computed; then waiting sequences are
admitted, in priority order and first come first served within a priority,
while the budget, max_num_seqs and free blocks allow. A long prompt therefore
runs as chunks that share steps with the decodes instead of freezing them.

A step holds at most max_loras distinct LoRA adapters (the base model is not one):
a waiting sequence whose adapter would be one too many waits, and the sequences
behind it are still admitted, so a full set of adapters never holds up the base or
the adapters already in the batch. Admission keeps the bound for every step, since
a step schedules only running sequences and those it admits.

That alone lets a steady stream for the running adapters keep a new adapter out
for ever (as in vLLM), so the wait has an age bound: once the first waiting
sequence in admission order that the adapter bound keeps out has waited
ADAPTER_WAIT_STEPS steps, no waiting sequence of any other adapter is admitted
until it is. Nothing is preempted: the running sequences decode on, the first
adapter whose last one finishes frees its slot, and the blocked sequence takes it.
Base sequences are not held back: they take no adapter slot, and they cannot take
the blocked one's place either, since it comes first in admission order and a
sequence that lacks blocks stops admission behind it.

When a decode needs a block and none is free, the lowest-priority, newest
running sequence is preempted: its blocks are freed and it goes back to
waiting with its generated tokens, to be recomputed (often from the prefix
cache) when room returns. Nobody fails for lack of blocks.
"""

from dataclasses import dataclass, field

from maas_services.common.defaults import MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS
from maas_services.engine.block_manager import BlockManager
from maas_services.engine.sequence import Sequence, SequenceStatus

# Steps (not seconds) because a slot frees as running sequences advance, one token a
# step, whatever a step costs on this machine, and a test can count them. 32 is small
# beside a typical answer's length (hundreds of tokens), which the hold then adds to
# the wait anyway, and long enough that an adapter whose last short request is about
# to end frees a slot without a hold.
ADAPTER_WAIT_STEPS = 32


@dataclass
class SchedulerConfig:
    max_num_seqs: int = MAX_NUM_SEQS
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    enable_chunked_prefill: bool = True


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """This step computes the sequence's last token, so it samples the next one."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens

    @property
    def pools(self) -> bool:
        """This step computes an embedding request's last token: its vector is
        that position's hidden state (embedding.py), and nothing is sampled."""
        return self.samples and self.seq.embeds

    @property
    def num_logits(self) -> int:
        """Positions whose logits the step needs: the last, and one per draft token."""
        return 1 + self.seq.num_draft_tokens if self.samples and not self.seq.embeds else 0


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    # (source, destination) block pairs to copy before the step: copy-on-write.
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, max_loras: int = 0):
        self.config = config
        self.blocks = block_manager
        self.max_loras = max_loras  # EngineConfig.max_loras
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        # The first waiting sequence the adapter bound keeps out, and for how many
        # steps it has been (module docstring).
        self._starving: Sequence | None = None
        self._starving_steps = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """A forked sample joins its parent among the running."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        self.running.sort(key=Sequence.sort_key)
        budget = self._schedule_running(out, budget)
        held_for = self._adapter_held_for()
        if not out.preempted:
            self._admit_waiting(out, budget, held_for)
        return out

    def _running_adapters(self) -> set[str]:
        return {seq.adapter for seq in self.running if seq.adapter}

    def _adapter_held_for(self) -> str:
        """The adapter whose sequence has waited too long for a slot ("" for none):
        waiting sequences of every other adapter are not admitted this step."""
        adapters = self._running_adapters()
        if len(adapters) >= self.max_loras:
            blocked = min(
                (s for s in self.waiting if s.adapter and s.adapter not in adapters),
                key=Sequence.sort_key,
                default=None,
            )
            # A sequence ahead of the tracked one (higher priority) starts its own wait.
            if blocked is not None and (
                self._starving is None or blocked.sort_key() < self._starving.sort_key()
            ):
                self._starving, self._starving_steps = blocked, 0
        if self._starving is None:
            return ""
        self._starving_steps += 1
        return self._starving.adapter if self._starving_steps > ADAPTER_WAIT_STEPS else ""

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            if seq.num_uncomputed_tokens > budget:
                seq.drop_drafts()  # verifying drafts needs all of them in one step
            while not self.blocks.can_append(seq):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                copy = self.blocks.append_slot(seq)
                if copy is not None:
                    out.block_copies.append(copy)
                n = min(seq.num_uncomputed_tokens, budget)
                out.scheduled.append(ScheduledSeq(seq, n))
                budget -= n
                index += 1
        return budget

    def _admit_waiting(self, out: SchedulerOutput, budget: int, held_for: str) -> None:
        self.waiting.sort(key=Sequence.sort_key)
        full_budget = self.config.max_num_batched_tokens
        adapters = self._running_adapters()
        index = 0  # waiting sequences before it wait for an adapter slot
        while (
            index < len(self.waiting)
            and budget > 0
            and len(self.running) < self.config.max_num_seqs
        ):
            seq = self.waiting[index]
            if seq.adapter and (
                (seq.adapter not in adapters and len(adapters) >= self.max_loras)
                or (held_for and seq.adapter != held_for)
            ):
                index += 1
                continue
            fits_whole = seq.num_uncomputed_tokens <= budget
            # Without chunking a prompt runs whole; one larger than the budget
            # runs alone, in a step of its own.
            if not self.config.enable_chunked_prefill and not fits_whole and budget < full_budget:
                break
            if not self.blocks.can_allocate(seq):
                break  # head-of-line: a later, smaller request must not starve it
            seq.num_computed_tokens = self.blocks.allocate(seq)
            if seq.adapter:
                adapters.add(seq.adapter)
            if seq is self._starving:
                self._starving = None
            self.waiting.pop(index)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.admitted.append(seq)
            n = seq.num_uncomputed_tokens
            if self.config.enable_chunked_prefill:
                n = min(n, budget)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        seq.drop_drafts()
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        out.preempted.append(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        if seq is self._starving:
            self._starving = None
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def sequences_of(self, request_id: str) -> list[Sequence]:
        return [s for s in (*self.running, *self.waiting) if s.request_id == request_id]
