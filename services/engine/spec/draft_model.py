"""Draft-model proposer: a small model sharing the target's tokenizer guesses ahead.

The draft runs through the engine's own ModelRunner over a paged KV pool of
its own, cut into fixed slots of `draft_context` tokens, one per recently
speculating sequence (least recently used goes first; a sequence that lost
its slot just recomputes). Each step computes only what changed since the
sequence's last call, the tokens the target accepted, then decodes up to k
tokens greedily, every sequence of the step in one batch. Greedy guesses are
deterministic, as verify.py's rejection sampling requires of a proposer;
sampled requests still get the target's distribution, only with lower
acceptance than guesses sampled from the draft would give.

A sequence that outgrows its slot continues there from its most recent half
slot of tokens, positions renumbered from 0: rotary attention is relative,
so the draft predicts from the window about as well, and the window is
recomputed once every half slot rather than every step.
"""

from collections import OrderedDict
from dataclasses import dataclass, field

from maas_services.common.block_hash import BLOCK_SIZE
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.loader import load_model
from maas_services.engine.model_runner import ModelRunner
from maas_services.engine.scheduler import ScheduledSeq
from maas_services.engine.spec.config import SpecConfig
from maas_services.engine.spec.proposer import DraftRequest, TargetInfo, register


@dataclass
class DraftSeq:
    """A sequence as the draft's ModelRunner sees it (the fields it reads)."""

    block_table: list[int]
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_draft_tokens: int = 0  # the draft has no drafts of its own
    embeds: bool = False  # the draft only ever generates
    # Where token_ids starts in the real sequence, and how much of it came from
    # the real sequence (the rest are last call's guesses).
    offset: int = 0
    num_real_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    def sync(self, real: list[int], offset: int) -> None:
        """Make token_ids the real sequence from offset, keeping whatever KV is still valid."""
        window = real[offset:]
        if offset != self.offset:
            valid = 0
        else:
            # Tokens once real never change; only last call's guesses can differ.
            valid = self.num_real_tokens
            limit = min(self.num_computed_tokens, len(window))
            while valid < limit and self.token_ids[valid] == window[valid]:
                valid += 1
        self.token_ids = window
        self.offset = offset
        self.num_real_tokens = len(window)
        # At least the last token is computed again: its logits give the first guess.
        self.num_computed_tokens = min(valid, len(window) - 1)


@register("draft")
class DraftModelProposer:
    def __init__(self, runner: ModelRunner, num_slots: int, slot_tokens: int):
        self.runner = runner
        self.slot_tokens = slot_tokens
        self.num_slots = num_slots
        blocks_per_slot = slot_tokens // BLOCK_SIZE
        self._free = [
            DraftSeq(list(range(i * blocks_per_slot, (i + 1) * blocks_per_slot)))
            for i in range(num_slots)
        ]
        self._slots: OrderedDict = OrderedDict()

    @classmethod
    def from_config(cls, config: SpecConfig, target: TargetInfo) -> "DraftModelProposer":
        if not config.draft_model:
            raise ValueError("--speculative-method draft needs --speculative-draft-model")
        model, draft_config = load_model(config.draft_model, target.dtype, target.device, False)
        if draft_config.vocab_size != target.vocab_size:
            raise ValueError(
                f"draft model vocabulary ({draft_config.vocab_size}) differs from the "
                f"target's ({target.vocab_size}): it must share the target's tokenizer"
            )
        slot_tokens = -(-min(config.draft_context, target.max_model_len) // BLOCK_SIZE) * BLOCK_SIZE
        # Room for every sequence that may speculate at once, and as many again that paused.
        num_slots = 2 * config.max_batch
        cache = PagedKVCache.allocate(
            draft_config,
            num_slots * slot_tokens // BLOCK_SIZE,
            BLOCK_SIZE,
            target.dtype,
            target.device,
        )
        runner = ModelRunner(model, draft_config, cache, target.device)
        return cls(runner, num_slots, slot_tokens)

    def propose(self, requests: list[DraftRequest]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in requests]
        active: list[tuple[int, DraftSeq, int]] = []
        for i, request in enumerate(requests):
            budget = min(request.max_tokens, self.slot_tokens // 2)
            # A call never takes more slots than there are: evicting a slot this
            # call already uses would mix two sequences' KV.
            if budget <= 0 or not request.token_ids or len(active) == self.num_slots:
                continue
            slot = self._slot(request.key)
            offset = slot.offset
            if len(request.token_ids) - offset + budget > self.slot_tokens:
                offset = max(0, len(request.token_ids) - self.slot_tokens // 2)
            slot.sync(request.token_ids, offset)
            active.append((i, slot, budget))
        for step in range(max((budget for _, _, budget in active), default=0)):
            live = [(i, slot) for i, slot, budget in active if budget > step]
            logits = self.runner.execute(
                [
                    ScheduledSeq(slot, slot.num_tokens - slot.num_computed_tokens)
                    for _, slot in live
                ],
                [],
            ).logits
            for (i, slot), token in zip(live, logits.argmax(-1).tolist(), strict=True):
                slot.num_computed_tokens = slot.num_tokens
                slot.token_ids.append(token)
                drafts[i].append(token)
        return drafts

    def _slot(self, key) -> DraftSeq:
        slot = self._slots.pop(key, None)
        if slot is None:
            if self._free:
                slot = self._free.pop()
            else:
                _, slot = self._slots.popitem(last=False)
            slot.token_ids, slot.num_computed_tokens = [], 0
            slot.offset, slot.num_real_tokens = 0, 0
        self._slots[key] = slot  # most recently used last
        return slot
