"""Run one scheduled step: a mixed batch of prefill chunks and decodes over the paged pool.

The runner owns the engine's compute path (compute_path.py), chosen once from
the settings and the model as loaded (choose_path, called by core/build.py
before it sizes the KV cache), and passed to every forward.

A step holding rows of a LoRA adapter (issue #34) runs on the engine's path too,
with a StepLora (lora/step_lora.py) that says which rows run which adapter: the
native path adds their low-rank products in C++ beside each projection, the eager
one in torch (the compiled one runs such a step's layers eagerly). An all-base step
has no StepLora and pays nothing for LoRA.
"""

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from maas_services.engine import native_layers
from maas_services.engine.attention_metadata import AttentionMetadata
from maas_services.engine.compiled_forward import Compiled
from maas_services.engine.compute_path import ComputePath
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.lora.adapter import AdapterWeights
from maas_services.engine.lora.step_lora import AdapterStack, StepLora
from maas_services.engine.model import LlamaForCausalLM
from maas_services.engine.model_config import ModelConfig
from maas_services.engine.native_layers import Native
from maas_services.engine.quantization.checkpoint_blocks import CheckpointBlock
from maas_services.engine.scheduler import ScheduledSeq

NOTHING_POOLED = torch.empty(0)


@dataclass
class Forward:
    """What one step's forward returns, rows in the order of its entries."""

    logits: torch.Tensor  # float32 [sum of num_logits, vocab], each entry's rows in order
    pooled: torch.Tensor  # float32 [entries that pool, hidden_size]


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        config: ModelConfig,
        kv_cache: PagedKVCache,
        device: torch.device | str,
        path: ComputePath | None = None,
    ):
        self.model = model
        self.config = config
        self.kv_cache = kv_cache
        self.device = device
        # The engine's path, chosen from its settings before its KV cache was sized
        # (core/build.py: the path's extra_bytes count as weights); else (a draft model,
        # the offline engine, tests) the defaults' choice.
        self.path = path or choose_path(model, compiled=False, native=True)
        # The last LoRA step's adapters side by side, reused while a step holds the same
        # ones (lora/step_lora.py); it keeps their weights alive until the next differs.
        self._lora_stack: AdapterStack | None = None

    @torch.inference_mode()
    def execute(
        self,
        scheduled: list[ScheduledSeq],
        block_copies: list[tuple[int, int]],
        adapters: Mapping[str, AdapterWeights] | None = None,
    ) -> Forward:
        """Compute each entry's new tokens: the logits of those that sample, the
        pooled hidden states of those that pool (Forward).

        adapters: the weights of each adapter a sequence may name (seq.adapter); none
        for a runner whose sequences all run the base (a draft model's, or an engine's
        with no adapter loaded).
        The sequences are left as they are: advancing num_computed_tokens is the
        caller's bookkeeping.
        """
        self.kv_cache.copy_blocks(block_copies)
        # Single-token entries first: attention runs the leading ones as one batch, in
        # groups longest context first (attention_metadata.py); in that order already,
        # each group is a slice of the batch.
        order = sorted(range(len(scheduled)), key=lambda i: _decode_first(scheduled[i]))
        batch = [scheduled[i] for i in order]
        input_ids: list[int] = []
        positions: list[int] = []
        last_row = [0] * len(scheduled)
        spans: list[tuple[str, int, int]] = []
        for i, entry in zip(order, batch, strict=True):
            start = entry.seq.num_computed_tokens
            first_row = len(input_ids)
            input_ids += entry.seq.token_ids[start : start + entry.num_new_tokens]
            positions += range(start, start + entry.num_new_tokens)
            last_row[i] = len(input_ids) - 1
            if adapters:
                spans.append((entry.seq.adapter, first_row, len(input_ids)))
        lora = StepLora.build(spans, adapters, self.device, self._lora_stack) if spans else None
        if lora is not None:
            self._lora_stack = lora.stack
        cpu_positions = torch.tensor(positions, dtype=torch.long)
        meta = AttentionMetadata.build(
            cpu_positions,
            query_lens=[e.num_new_tokens for e in batch],
            context_lens=[e.seq.num_computed_tokens + e.num_new_tokens for e in batch],
            block_tables=[e.seq.block_table for e in batch],
            block_size=self.kv_cache.block_size,
            device=self.device,
        )
        hidden = self.model(
            torch.tensor(input_ids, dtype=torch.long, device=self.device),
            cpu_positions.to(self.device),
            self.kv_cache,
            meta,
            self.path,
            lora,
        )
        # An embedding's vector is its last position's state (embedding.py); a step
        # without one (most steps) gathers nothing.
        pooled = [last_row[i] for i, entry in enumerate(scheduled) if entry.pools]
        pooled_rows = (
            hidden[torch.tensor(pooled, dtype=torch.long, device=self.device)].float()
            if pooled
            else NOTHING_POOLED
        )
        # A sampling entry needs its last position; one with draft tokens needs
        # every drafted position too, to verify them.
        rows = [
            row
            for i, entry in enumerate(scheduled)
            for row in range(last_row[i] - entry.num_logits + 1, last_row[i] + 1)
        ]
        # The LM head is the widest matmul: run it only where a token is sampled
        # (a decode-only step samples at every row, in order: nothing to pick).
        if rows != list(range(hidden.shape[0])):
            hidden = hidden[torch.tensor(rows, dtype=torch.long, device=self.device)]
        return Forward(self.path.logits(self.model, hidden).float(), pooled_rows)


def choose_path(
    model: LlamaForCausalLM,
    compiled: bool,
    native: bool,
    wide_gemm: str = "float32",
    blocks: dict[nn.Module, CheckpointBlock] | None = None,
    blocks_int16: bool = False,
) -> ComputePath:
    """The model's compute path, with why: compiled if asked; else native where its halves
    apply to some layer (blocks: checkpoint_blocks' blocks for its steps, their row kernel
    on int16 activations where blocks_int16); else eager."""
    if compiled:
        return Compiled(model, "--no-enforce-eager")
    if not native:
        return ComputePath("--no-native-layers")
    missing = native_layers.unavailable(model)
    if missing is not None:
        return ComputePath(f"no native halves: {missing}")
    why = "a float32 CPU model and the native library built"
    path = Native(model, why, wide_gemm=wide_gemm, blocks=blocks, blocks_int16=blocks_int16)
    if path.native_layers == 0:
        return ComputePath("no layer's projections are in a native format")
    return path


def _decode_first(entry: ScheduledSeq) -> tuple[bool, int]:
    """Sort key: decodes (one new token) first, longest context first; the rest after."""
    if entry.num_new_tokens == 1:
        return False, -entry.seq.num_computed_tokens
    return True, 0
