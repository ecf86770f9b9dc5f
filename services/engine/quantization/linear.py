"""What every quantized Linear shares: the nn.Linear interface the model calls."""

import torch
from torch import nn


class QuantizedLinear(nn.Module):
    """Stands in for nn.Linear (and FusedLinear) in the model; subclasses own the weight.

    The quantized weight and its scales are buffers, so they move with the
    module and are counted apart from the parameters; the bias, if any, stays
    a float parameter in the model dtype.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        shard_sizes: list[int] | None,
    ):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        # Attention splits its fused qkv output by these, as it does FusedLinear's.
        self.shard_sizes = shard_sizes
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)
        # Whether the CPU's float32 row kernel rounds the activations to int8 for integer
        # dot products (QuantizationConfig.activations; quantize_model sets it).
        self.int8_activations = False
        # Whether the weight is the checkpoint's own blocks as they are, not a rounding of
        # its float values (quantize_model sets it; holds_checkpoint_weights reads it).
        self.from_file = False

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [M, in_features] @ W^T -> [M, out_features] in rows' dtype."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.matmul(x.reshape(-1, self.in_features))
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        """Bytes of the stored weight: quantized values, scales and minimums (no bias)."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"
