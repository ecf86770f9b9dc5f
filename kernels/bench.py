"""Each Triton kernel against its torch twin on SmolLM2-135M's shapes.

On a GPU node: `python -m maas_kernels.bench --output benchmarks/results/kernels.json`.
Both sides run on the same CUDA tensors, the twin as plain torch ops, and each
is timed as the mean over back-to-back calls between two synchronisations, so
launch overhead counts as it does in the eager engine. The JSON has one record
per case: shape, microseconds per call for twin and kernel, the speedup, and
the largest difference between their outputs.

The command needs a GPU. tests/unit/kernels/test_bench.py calls run() on the
CPU, the kernels in Triton's interpreter, to keep the script working; those
times mean nothing.
"""

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

BLOCK_SIZE = 16  # the engine's default
GROUP_SIZE = 64  # divides SmolLM2's hidden size, 576; 128 does not


@dataclass(frozen=True)
class ModelShape:
    """The sizes the kernels see; SmolLM2-135M-Instruct's by default."""

    hidden: int = 576
    intermediate: int = 1536
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    theta: float = 1e5


@dataclass
class Case:
    name: str
    shape: str
    twin: Callable[[], object]
    kernel: Callable[[], object]


def _cases(
    device: str,
    dtype: torch.dtype,
    model: ModelShape,
    tokens: int,
    decode_batch: int,
    context: int,
) -> list[Case]:
    # Imported on first use: a kernel is compiled or interpreted as TRITON_INTERPRET
    # reads when its module is first imported, which a caller on the CPU sets first.
    from maas_kernels.activation import silu_and_mul_triton
    from maas_kernels.activation_ref import silu_and_mul_reference
    from maas_kernels.paged_attention import paged_attention_decode_triton
    from maas_kernels.paged_attention_ref import paged_attention_decode_reference
    from maas_kernels.quant_int4 import int4_matmul_triton
    from maas_kernels.quant_int4_ref import int4_matmul_reference, quantize_int4
    from maas_kernels.quant_int8 import int8_matmul_triton
    from maas_kernels.quant_int8_ref import int8_matmul_reference, quantize_int8
    from maas_kernels.rms_norm import rms_norm_residual_triton
    from maas_kernels.rms_norm_ref import rms_norm_residual_reference
    from maas_kernels.rotary import rotary_embedding_triton
    from maas_kernels.rotary_ref import rotary_cos_sin_reference, rotary_embedding_reference

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device).to(dtype)

    hidden, intermediate = model.hidden, model.intermediate
    heads, kv_heads, head_dim = model.heads, model.kv_heads, model.head_dim
    x, residual, weight = randn(tokens, hidden), randn(tokens, hidden), randn(hidden)
    gate_up = randn(tokens, 2 * intermediate)
    q, k = randn(tokens, heads, head_dim), randn(tokens, kv_heads, head_dim)
    positions = torch.arange(tokens, device=device)
    cos, sin = rotary_cos_sin_reference(positions, head_dim, model.theta, dtype)
    blocks_per_seq = -(-context // BLOCK_SIZE)
    num_blocks = decode_batch * blocks_per_seq
    k_cache = randn(num_blocks, BLOCK_SIZE, kv_heads, head_dim)
    v_cache = randn(num_blocks, BLOCK_SIZE, kv_heads, head_dim)
    tables = torch.randperm(num_blocks, device=device).view(decode_batch, blocks_per_seq)
    lens = torch.full((decode_batch,), context, device=device)
    decode_q = randn(decode_batch, heads, head_dim)
    gate_up_weight = torch.randn(2 * intermediate, hidden, device=device) / hidden**0.5
    q8, scale = quantize_int8(gate_up_weight)
    packed, scales, mins = quantize_int4(gate_up_weight, GROUP_SIZE)
    cases = [
        Case(
            "rms_norm_residual",
            f"[{tokens}, {hidden}]",
            lambda: rms_norm_residual_reference(x, residual, weight, 1e-5),
            lambda: rms_norm_residual_triton(x, residual, weight, 1e-5),
        ),
        Case(
            "silu_and_mul",
            f"[{tokens}, {2 * intermediate}]",
            lambda: silu_and_mul_reference(gate_up),
            lambda: silu_and_mul_triton(gate_up),
        ),
        Case(
            "rotary_embedding",
            f"q [{tokens}, {heads}, {head_dim}], k [{tokens}, {kv_heads}, {head_dim}]",
            lambda: rotary_embedding_reference(q, k, cos, sin),
            lambda: rotary_embedding_triton(q, k, cos, sin),
        ),
        Case(
            "paged_attention_decode",
            f"{decode_batch} seqs x {context} positions, block {BLOCK_SIZE}",
            lambda: paged_attention_decode_reference(decode_q, k_cache, v_cache, tables, lens),
            lambda: paged_attention_decode_triton(decode_q, k_cache, v_cache, tables, lens),
        ),
    ]
    # The MLP's gate/up projection, for a decode batch and for a prefill chunk.
    for m in (decode_batch, tokens):
        activations = randn(m, hidden)
        shape = f"[{m}, {hidden}] @ [{2 * intermediate}, {hidden}]^T"
        cases += [
            Case(
                "int8_matmul",
                shape,
                lambda a=activations: int8_matmul_reference(a, q8, scale),
                lambda a=activations: int8_matmul_triton(a, q8, scale),
            ),
            Case(
                f"int4_matmul (group {GROUP_SIZE})",
                shape,
                lambda a=activations: int4_matmul_reference(a, packed, scales, mins, GROUP_SIZE),
                lambda a=activations: int4_matmul_triton(a, packed, scales, mins, GROUP_SIZE),
            ),
        ]
    return cases


def _timed(fn: Callable[[], object], device: str, repeats: int) -> tuple[float, object]:
    """Microseconds per call, and the output for the comparison."""
    out = fn()  # the first call compiles the kernel
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e6, out


def _max_difference(a: object, b: object) -> float:
    pairs = zip(a, b, strict=True) if isinstance(a, tuple) else [(a, b)]
    return max((x.float() - y.float()).abs().max().item() for x, y in pairs)


def run(
    device: str,
    dtype: torch.dtype,
    model: ModelShape,
    tokens: int,
    decode_batch: int,
    context: int,
    repeats: int,
) -> list[dict]:
    """One record per case. On the CPU, set TRITON_INTERPRET=1 before the first call."""
    torch.manual_seed(0)
    records = []
    for case in _cases(device, dtype, model, tokens, decode_batch, context):
        twin_us, twin_out = _timed(case.twin, device, repeats)
        kernel_us, kernel_out = _timed(case.kernel, device, repeats)
        records.append(
            {
                "kernel": case.name,
                "shape": case.shape,
                "twin_us": round(twin_us, 2),
                "triton_us": round(kernel_us, 2),
                "speedup": round(twin_us / kernel_us, 2),
                "max_abs_diff": _max_difference(twin_out, kernel_out),
            }
        )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, help="write the JSON here as well as to stdout")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--tokens", type=int, default=512, help="tokens of a prefill chunk")
    parser.add_argument("--decode-batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=1024, help="positions per decode")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("no CUDA device: these numbers only mean something on a GPU")
    records = run(
        "cuda",
        getattr(torch, args.dtype),
        ModelShape(),
        args.tokens,
        args.decode_batch,
        args.context,
        args.repeats,
    )
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": args.dtype,
        "cases": records,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
