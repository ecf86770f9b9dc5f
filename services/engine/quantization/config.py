"""The --quantization flags as one value."""

from dataclasses import dataclass
from typing import Literal

from maas_services.common.quantization_methods import QUANTIZATION_METHODS, QuantizationMethod

Activations = Literal["float32", "int8"]
ACTIVATIONS: tuple[Activations, ...] = ("float32", "int8")
# Group sizes torch's CPU int4 kernel and kernels/quant_int4.py both take.
GROUP_SIZES = (32, 64, 128)
# The projections of each decoder layer: nearly all the weights outside the
# embedding. The embedding stays a float lookup (quantizing a lookup table saves
# memory but no time); the LM head is quantized apart, in int8 (quantize_head).
QUANTIZED_MODULES = frozenset({"qkv_proj", "o_proj", "gate_up_proj", "down_proj"})


@dataclass(frozen=True)
class QuantizationConfig:
    method: QuantizationMethod = "none"
    # int4 only: how many consecutive input weights of a row share a scale and a minimum.
    group_size: int = 64
    # The LM head (the tied embedding's matrix when tied) in int8 per row too: at
    # one stream it is the largest read of a decode step (113 MB in float32 for
    # SmolLM2, against ~60 MB for all its int4 decoder layers). False only to
    # measure against the float head.
    quantize_head: bool = True
    # How the CPU's float32 kernels take the activations at a few rows (decode): as
    # they are, or rounded to int8 per block of 32 for integer dot products, as
    # llama.cpp's Q8 x Q4 (native/qdot.cpp).
    activations: Activations = "float32"

    def __post_init__(self) -> None:
        if self.method not in QUANTIZATION_METHODS:
            raise ValueError(f"quantization {self.method!r} is not one of {QUANTIZATION_METHODS}")
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"activations {self.activations!r} are not one of {ACTIVATIONS}")
        if self.group_size not in GROUP_SIZES:
            raise ValueError(f"int4 group size {self.group_size} is not one of {GROUP_SIZES}")

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    def describe(self) -> str:
        """A short name for logs and reports: none, int8, int4-g64, int8-float-head."""
        name = f"int4-g{self.group_size}" if self.method == "int4" else self.method
        return name if self.quantize_head or not self.enabled else f"{name}-float-head"
