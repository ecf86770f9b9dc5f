"""Where one step's tokens sit in the paged KV pool, built once and shared by every layer.

A step's batch is the new tokens of several sequences back to back. Leading
sequences with a single new token (decodes) are attended to in one batched
call; each sequence after them (a prefill chunk) gets a call of its own.
"""

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens]: pool slot (block * block_size + offset) per new token
    query_start_loc: list[int]  # [seqs + 1]: where each sequence's new tokens start in the batch
    context_lens: list[int]  # per sequence: positions it attends over, computed plus new
    block_tables: torch.Tensor  # [seqs, most blocks], padded with block 0
    num_decodes: int  # the leading sequences with exactly one new token
    # The decodes' block tables cut to the longest decode context, flattened:
    # one index_select gathers every decode's blocks.
    decode_block_ids: torch.Tensor
    # [decodes]: each decode's context length, on the device (the paged decode kernel's input).
    decode_context_lens: torch.Tensor
    # [decodes, 1, 1, gathered positions]: True where the position is in that decode's
    # context; the rest is padding out to the longest decode.
    decode_mask: torch.Tensor
    # Per prefill chunk, the blocks holding its context.
    prefill_block_ids: list[torch.Tensor]
    # Per prefill chunk, [new, context]: a new token sees the positions up to its own,
    # including the ones computed in earlier steps.
    prefill_masks: list[torch.Tensor]

    @classmethod
    def build(
        cls,
        positions: torch.Tensor,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str,
    ) -> "AttentionMetadata":
        """positions: the batch's token positions, on the CPU; the rest per sequence.

        Each block table must cover its sequence's context.
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
        tables = tables.to(device)

        num_decodes = next((i for i, n in enumerate(query_lens) if n != 1), num_seqs)
        decode_blocks = max(blocks_needed[:num_decodes], default=0)
        decode_ctx = torch.tensor(context_lens[:num_decodes], device=device)
        gathered = torch.arange(decode_blocks * block_size, device=device)
        prefills = range(num_decodes, num_seqs)
        return cls(
            slot_mapping=slots.to(device),
            query_start_loc=query_start_loc,
            context_lens=list(context_lens),
            block_tables=tables,
            num_decodes=num_decodes,
            decode_block_ids=tables[:num_decodes, :decode_blocks].flatten(),
            decode_context_lens=decode_ctx,
            decode_mask=(gathered < decode_ctx[:, None])[:, None, None, :],
            prefill_block_ids=[tables[i, : blocks_needed[i]] for i in prefills],
            prefill_masks=[
                torch.ones(query_lens[i], context_lens[i], dtype=torch.bool, device=device).tril(
                    context_lens[i] - query_lens[i]
                )
                for i in prefills
            ],
        )
