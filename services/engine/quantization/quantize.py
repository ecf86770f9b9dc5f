"""Replace a loaded model's linear layers with quantized ones."""

from pathlib import Path

import torch
from torch import nn

from maas_kernels.native import bindings
from maas_services.engine.model import LlamaForCausalLM
from maas_services.engine.quantization.config import QUANTIZED_MODULES, QuantizationConfig
from maas_services.engine.quantization.file_blocks import FileBlocks, file_blocks
from maas_services.engine.quantization.gguf_blocks import GROUP_SIZE
from maas_services.engine.quantization.int4 import Int4Weight, int4_group_size, make_int4_linear
from maas_services.engine.quantization.int8 import Int8Linear, Int8Weight
from maas_services.engine.quantization.linear import QuantizedLinear


def quantize_model(
    model: LlamaForCausalLM,
    quantization: QuantizationConfig,
    dtype: torch.dtype,
    source: str | Path | None = None,
) -> LlamaForCausalLM:
    """Quantize the QUANTIZED_MODULES in place from their float weights; cast the rest to dtype.

    The float weights should be float32: quantizing bf16 weights would round
    them twice. An int4 layer whose inputs the group size does not divide
    takes the largest smaller group that does (int4_group_size). For int4
    with group 32 from a GGUF file (source), the file's own Q4_0/Q4_1 blocks
    are used as they are: the layers then hold exactly the weights the file
    holds, instead of a requantization of their dequantized values; so does
    the head, from a GGUF file's Q8_0 blocks (quantize_head).
    """
    if not quantization.enabled:
        return model.to(dtype)
    int4_blocks = quantization.method == "int4" and quantization.group_size == GROUP_SIZE
    # The file's Q8_0 head only where the CPU's float32 kernels run it (they take its scale
    # per 32 inputs).
    on_cpu = model.model.embed_tokens.weight.device.type == "cpu"
    head_blocks = quantization.quantize_head and dtype == torch.float32 and on_cpu
    found = file_blocks(model, source) if int4_blocks or head_blocks else FileBlocks({}, None)
    from_file = found.projections if int4_blocks else {}
    for name, module in list(model.named_modules()):
        parent, _, child = name.rpartition(".")
        if child in QUANTIZED_MODULES:
            quantized = _quantize(module, quantization, dtype, from_file.get(name))
            quantized.from_file = name in from_file
            setattr(model.get_submodule(parent), child, quantized)
    if quantization.quantize_head:
        quantize_head(model, dtype, found.head if head_blocks else None)
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            module.int8_activations = quantization.activations == "int8"
    if dtype == torch.float32:
        bindings.library()  # built (once per machine) at load, not by the first request
    return model.to(dtype)


def _quantize(
    linear: nn.Linear,
    quantization: QuantizationConfig,
    dtype: torch.dtype,
    from_file: Int4Weight | None,
) -> QuantizedLinear:
    shard_sizes = getattr(linear, "shard_sizes", None)
    if quantization.method == "int8":
        return Int8Linear(linear.weight, linear.bias, dtype, shard_sizes)
    if from_file is None:
        group_size = int4_group_size(linear.in_features, quantization.group_size)
        weight = Int4Weight.quantize(linear.weight, group_size)
    else:
        weight = from_file.to(linear.weight.device)  # the file is read on the CPU
    return make_int4_linear(weight, linear.bias, dtype, shard_sizes)


def quantize_head(
    model: LlamaForCausalLM, dtype: torch.dtype, file_head: Int8Weight | None = None
) -> None:
    """The LM head as an Int8Linear of its own; a tied embedding keeps its float copy.

    int8 whatever the layers' method: the head's error lands straight in the
    logits, and int8 is what llama.cpp's files keep their output matrix in
    (SmolLM2's GGUF: Q8_0). From a GGUF file's Q8_0 blocks as they are (file_head,
    which quantize_model passes only where the CPU's float32 kernels run the head:
    they take the blocks' scale per 32 inputs), then the head is exactly the file's.
    Otherwise requantized per row (+0.2-0.3% perplexity on SmolLM2,
    docs/quantization.md). The lookup only
    reads a row per token, so the float table costs memory (an extra quarter of
    it), not time.
    """
    head = model.model.embed_tokens if model.lm_head is None else model.lm_head
    model.lm_head = Int8Linear(head.weight.data if file_head is None else file_head, None, dtype)
    model.lm_head.from_file = file_head is not None


def holds_checkpoint_weights(model: nn.Module) -> bool:
    """Whether every weight is the checkpoint's (no layer quantized here, or each one taken
    from the file's blocks as they are): then the model is the float32 reference's."""
    return all(m.from_file for m in model.modules() if isinstance(m, QuantizedLinear))
