import torch

from maas_kernels.bench import ModelShape, run


def test_the_benchmark_runs_every_kernel_against_its_twin_end_to_end():
    # Tiny shapes in the interpreter: the script works; the times mean nothing here.
    model = ModelShape(hidden=64, intermediate=48, heads=4, kv_heads=2, head_dim=16)
    records = run("cpu", torch.float32, model, tokens=3, decode_batch=2, context=20, repeats=1)
    assert [r["kernel"] for r in records] == [
        "rms_norm_residual",
        "silu_and_mul",
        "rotary_embedding",
        "paged_attention_decode",
        "int8_matmul",
        "int4_matmul (group 64)",
        "int8_matmul",
        "int4_matmul (group 64)",
    ]
    for record in records:
        assert record["twin_us"] > 0 and record["triton_us"] > 0
        assert record["max_abs_diff"] < 1e-3, record
