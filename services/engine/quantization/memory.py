"""How much memory the quantized linear layers take, against the same layers in float."""

from dataclasses import dataclass

from torch import nn

from maas_services.engine.quantization.linear import QuantizedLinear


@dataclass
class WeightMemory:
    quantized_bytes: int  # quantized values + scales (+ minimums) of the quantized layers
    float32_bytes: int  # the same layers' weights in float32
    bfloat16_bytes: int  # ... and in bfloat16
    layers: int

    @property
    def ratio_vs_float32(self) -> float:
        return self.float32_bytes / self.quantized_bytes

    @property
    def ratio_vs_bfloat16(self) -> float:
        return self.bfloat16_bytes / self.quantized_bytes


def quantized_weight_memory(model: nn.Module) -> WeightMemory:
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    if not layers:
        raise ValueError("the model has no quantized layers")
    weights = sum(m.in_features * m.out_features for m in layers)
    return WeightMemory(
        quantized_bytes=sum(m.weight_bytes() for m in layers),
        float32_bytes=4 * weights,
        bfloat16_bytes=2 * weights,
        layers=len(layers),
    )
