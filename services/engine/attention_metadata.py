"""Where one step's tokens sit in the paged KV pool, built once and shared by every layer.

A step's batch is the new tokens of several sequences back to back. Leading
sequences with a single new token (decodes) are attended to in groups of
similar context length; each sequence after them (a prefill chunk) gets a call
of its own.
"""

from dataclasses import dataclass
from functools import cached_property

import torch

# Positions gathered per decode group. On CPU a gather padded to the longest
# decode of a 32-stream batch is tens of MB: its fresh allocation page-faults
# and SDPA then reads it back from memory. Groups of ~1024 positions (768 KiB of
# float32 keys at 3 KV heads x 64) stay in cache between the gather and the
# read: 5-6x less CPU time per layer at batch 32-64 with contexts 40-2000,
# ~1.8x with contexts 40-290 (docs/engine.md, "Decode attention").
DECODE_GROUP_POSITIONS = 1024


@dataclass
class DecodeGroup:
    rows: torch.Tensor  # [n]: the group's decodes, as rows of the batch
    # The first of rows when they are consecutive rows in order (the runner orders
    # decodes longest first, so all its groups are): attention then slices the
    # batch instead of gathering and scattering its rows. None otherwise.
    first: int | None
    # [n * blocks of the longest]: each decode's blocks, padded with block 0.
    block_ids: torch.Tensor
    # A group of one decode whose blocks are consecutive in the pool (a lone stream's
    # usually are: the free list hands them out in order): the first of them, and
    # attention reads the pool in place instead of gathering. None otherwise.
    first_block: int | None
    positions: int  # the longest context in the group: the gathered positions attended
    # [n, 1, 1, positions]: True where the position is in that decode's context;
    # None when every decode of the group has the same context.
    mask: torch.Tensor | None


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens]: pool slot (block * block_size + offset) per new token
    query_start_loc: list[int]  # [seqs + 1]: where each sequence's new tokens start in the batch
    context_lens: list[int]  # per sequence: positions it attends over, computed plus new
    block_tables: torch.Tensor  # [seqs, most blocks], padded with block 0
    num_decodes: int  # the leading sequences with exactly one new token
    # [decodes]: each decode's context length, on the device (the paged decode kernel's input).
    decode_context_lens: torch.Tensor
    # Per prefill chunk, the blocks holding its context.
    prefill_block_ids: list[torch.Tensor]
    # Per prefill chunk, [new, context]: a new token sees the positions up to its own,
    # including the ones computed in earlier steps.
    prefill_masks: list[torch.Tensor]
    block_size: int
    group_positions: int  # the decode groups' gather budget

    @cached_property
    def decode_groups(self) -> list[DecodeGroup]:
        """The decodes longest context first, cut so each group pads only to its own longest.

        Built at first use: only the torch path reads them (the Triton kernel and the
        native CPU one read the block tables in place), and at 64 decodes they cost
        about a millisecond a step.
        """
        device = self.block_tables.device
        if device.type == "cuda":
            return []
        return _decode_groups(
            self.context_lens[: self.num_decodes],
            self.block_tables,
            self.block_size,
            self.group_positions,
            device,
        )

    @classmethod
    def build(
        cls,
        positions: torch.Tensor,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str,
        group_positions: int = DECODE_GROUP_POSITIONS,
    ) -> "AttentionMetadata":
        """positions: the batch's token positions, on the CPU; the rest per sequence.

        Each block table must cover its sequence's context. A decode longer than
        group_positions gets a group of its own.
        """
        num_seqs = len(query_lens)
        query_start_loc = [0]
        for n in query_lens:
            query_start_loc.append(query_start_loc[-1] + n)
        blocks_needed = [-(-ctx // block_size) for ctx in context_lens]
        width = max(blocks_needed, default=0)
        tables = torch.tensor(
            [
                table[:needed] + [0] * (width - needed)
                for table, needed in zip(block_tables, blocks_needed, strict=True)
            ],
            dtype=torch.long,
        ).view(num_seqs, width)
        seq_of_token = torch.repeat_interleave(torch.tensor(query_lens))
        slots = tables[seq_of_token, positions // block_size] * block_size + positions % block_size
        device_tables = tables.to(device)

        num_decodes = next((i for i, n in enumerate(query_lens) if n != 1), num_seqs)
        decode_ctx = torch.tensor(context_lens[:num_decodes], device=device)
        prefills = range(num_decodes, num_seqs)
        return cls(
            slot_mapping=slots.to(device),
            query_start_loc=query_start_loc,
            context_lens=list(context_lens),
            block_tables=device_tables,
            num_decodes=num_decodes,
            decode_context_lens=decode_ctx,
            prefill_block_ids=[device_tables[i, : blocks_needed[i]] for i in prefills],
            prefill_masks=[
                torch.ones(query_lens[i], context_lens[i], dtype=torch.bool, device=device).tril(
                    context_lens[i] - query_lens[i]
                )
                for i in prefills
            ],
            block_size=block_size,
            group_positions=group_positions,
        )


def _decode_groups(
    context_lens: list[int],
    tables: torch.Tensor,
    block_size: int,
    group_positions: int,
    device: torch.device | str,
) -> list[DecodeGroup]:
    """Decodes longest first; a group grows while its padded gather fits group_positions."""
    order = sorted(range(len(context_lens)), key=lambda i: -context_lens[i])
    blocks_of = [-(-n // block_size) for n in context_lens]
    members: list[list[int]] = []
    for i in order:
        if members and (len(members[-1]) + 1) * blocks_of[members[-1][0]] * block_size <= (
            group_positions
        ):
            members[-1].append(i)
        else:
            members.append([i])
    # Two host-to-device copies for all groups, whatever their number.
    rows = torch.tensor(order, dtype=torch.long).to(device)
    block_ids = torch.cat(
        [tables[group, : blocks_of[group[0]]].flatten() for group in members]
        or [torch.empty(0, dtype=torch.long)]
    ).to(device)
    lens = torch.tensor([context_lens[i] for i in order], device=device)
    groups, start, offset = [], 0, 0
    for group in members:
        longest = context_lens[group[0]]
        n = len(group)
        blocks = n * blocks_of[group[0]]
        mask = None
        if context_lens[group[-1]] != longest:
            gathered = torch.arange(longest, device=device)
            mask = (gathered < lens[start : start + n, None])[:, None, None, :]
        consecutive = group == list(range(group[0], group[0] + n))
        ids = tables[group[0], : blocks_of[group[0]]].tolist() if n == 1 else []
        in_place = bool(ids) and ids == list(range(ids[0], ids[0] + len(ids)))
        groups.append(
            DecodeGroup(
                rows=rows[start : start + n],
                first=group[0] if consecutive else None,
                block_ids=block_ids[offset : offset + blocks],
                first_block=ids[0] if in_place else None,
                positions=longest,
                mask=mask,
            )
        )
        start += n
        offset += blocks
    return groups
