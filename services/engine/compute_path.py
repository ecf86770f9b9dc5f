"""How the decoder layers' dense halves run: one object per engine, chosen once at load.

A decoder layer (model.DecoderLayer) is paged attention between two dense
halves with fixed shapes: attention_inputs (norm, q/k/v projection, rotary)
and attention_outputs (output projection, norm, MLP). The rest of a step is the
same whatever runs them. An engine runs them one of three ways:

- eager (ComputePath, this module): the layers' own methods, through
  maas_kernels.ops: the Triton kernels on CUDA, their torch twins elsewhere;
- compiled (compiled_forward.Compiled, --no-enforce-eager): torch.compile of
  those same methods;
- native (native_layers.Native, the default on a float32 CPU with the library
  built): the C++ halves (native/layer.cpp), and where every layer has them, a
  decode-only step as one native call for all the layers.

model_runner.choose_path picks one from the settings and the model as loaded and
says why; ModelRunner holds it and passes it to LlamaForCausalLM.forward, whose
default is eager (tests, evaluation and the dense reference call the model
directly). Nothing is patched onto the modules: the model's code plus the path's
class is everything that runs.

A step whose rows run LoRA adapters passes its share of them (lora/step_lora.py)
to each half and to decode_step: every path adds the low-rank products beside
the projections it runs (the native path in C++, native/lora.h).
"""

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from maas_services.engine.attention_metadata import AttentionMetadata
    from maas_services.engine.kv_cache import PagedKVCache
    from maas_services.engine.lora.step_lora import LayerLora, StepLora
    from maas_services.engine.model import DecoderLayer, LlamaForCausalLM


class ComputePath:
    """The eager path, and the interface the compiled and native paths override."""

    name = "eager"
    # Memory the path keeps beside the model's own tensors (the native path's bf16 weight
    # copies): the KV budget counts it as weights (core/build.py).
    extra_bytes = 0

    def __init__(self, reason: str):
        self.reason = reason  # why this engine runs this path: logged once, at load

    def attention_inputs(
        self,
        layer: "DecoderLayer",
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lora: "LayerLora | None" = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's q, k, v and stream (DecoderLayer.attention_inputs)."""
        return layer.attention_inputs(x, residual, cos, sin, lora)

    def attention_outputs(
        self,
        layer: "DecoderLayer",
        attended: torch.Tensor,
        residual: torch.Tensor,
        lora: "LayerLora | None" = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's MLP output and stream (DecoderLayer.attention_outputs)."""
        return layer.attention_outputs(attended, residual, lora)

    def decode_step(
        self,
        model: "LlamaForCausalLM",
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: "PagedKVCache",
        meta: "AttentionMetadata",
        lora: "StepLora | None" = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Every layer of the step at once, as the layer loop returns them, or None where
        this path leaves the step to the layer loop (always, here)."""
        return None

    def logits(self, model: "LlamaForCausalLM", hidden: torch.Tensor) -> torch.Tensor:
        """The LM head of the final hidden states (LlamaForCausalLM.compute_logits)."""
        return model.compute_logits(hidden)

    def describe(self) -> dict[str, object]:
        """The path's fields for the engine_ready log."""
        return {"compute_path": self.name, "compute_path_reason": self.reason, "native_layers": 0}


# What the model runs when called directly, without a runner.
EAGER = ComputePath("called without a runner")
