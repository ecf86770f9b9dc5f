"""The AVX2 int8/int4 matmuls at M activation rows: which way wins, per M.

One "step" is every matmul of a decode step of SmolLM2-135M at M rows: the
four projections of each of --layers decoder layers plus the LM head, with
distinct random weights per layer, so that (as in the model) they come from
DRAM rather than cache. Candidates, each on the same weights and rows:

- float32: F.linear on float32 weights (what a float32 engine runs);
- dequantize: the whole weight into a float32 buffer, then F.linear (the
  code before this benchmark: a float32 write and read of every weight);
- kernel: matmul.cpp's register kernel on all M rows in one call (its
  output rows in tiles whose weights stay in L2 while each group of four
  activation rows passes over them, each weight dequantized in registers
  once per group): what cpu_kernel runs for a few rows;
- tiles: --tile-bytes of output rows dequantized at a time into one reused
  buffer that stays in L2, then torch.mm of that tile (session 6's path
  above 32 rows);
- gemm: matmul.cpp's panels, one call: --panel-bytes of output rows
  dequantized once into a float32 buffer, then its register-blocked
  micro-kernel over every activation row: what cpu_kernel runs above a few
  rows.

The candidates run interleaved, best of --repeats; the result is ms per step,
of wall time and of the thread's CPU time.
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.results_file import update_results
from maas_kernels.native import bindings
from maas_kernels.quant_int4_ref import quantize_int4
from maas_kernels.quant_int8_ref import quantize_int8
from maas_services.engine.quantization import cpu_kernel

# (out_features, in_features): qkv_proj, o_proj, gate_up_proj, down_proj.
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
HEAD_SHAPE = (49152, 576)


class Weight:
    """One weight in float32 and in the method's format, with pointers for the library."""

    def __init__(self, dense: torch.Tensor, method: str):
        self.dense = dense
        self.n, self.k = dense.shape
        self.method = method
        lib = bindings.library()
        if method == "int8":
            self.q, self.scale = quantize_int8(dense)
            self.row_bytes, self.matmul_fn, self.dequant_fn, self.gemm_fn = (
                self.k,
                lib.int8_matmul_f32,
                lib.int8_dequantize_f32,
                lib.int8_gemm_f32,
            )
        else:
            self.packed, self.scales, self.mins = quantize_int4(dense, 32)
            self.row_bytes, self.matmul_fn, self.dequant_fn, self.gemm_fn = (
                self.k // 2,
                lib.int4_matmul_f32,
                lib.int4_dequantize_f32,
                lib.int4_gemm_f32,
            )

    def pointers(self, first_row: int) -> tuple:
        """The weight's arguments to the library, from output row first_row on."""
        if self.method == "int8":
            q, scale = self.q.data_ptr(), self.scale.data_ptr()
            return (q + first_row * self.k, scale + 4 * first_row, 0)
        groups = self.k // 32
        offset = 4 * first_row * groups
        return (
            self.packed.data_ptr() + first_row * self.row_bytes,
            self.scales.data_ptr() + offset,
            self.mins.data_ptr() + offset,
            32,
        )


def run_float32(x, w, args):
    return F.linear(x, w.dense)


def run_dequantize(x, w, args):
    dense = torch.empty(w.n, w.k)
    w.dequant_fn(*w.pointers(0), w.n, w.k, dense.data_ptr(), 1)
    return F.linear(x, dense)


def _kernel(x, w, out, first_row=0):
    m = x.shape[0]
    w.matmul_fn(x.data_ptr(), m, x.stride(0), *w.pointers(first_row), w.n, w.k, out.data_ptr(), 1)


def run_kernel(x, w, args):
    out = torch.empty(x.shape[0], w.n)
    _kernel(x, w, out)
    return out


def run_gemm(x, w, args):
    out = torch.empty(x.shape[0], w.n)
    m = x.shape[0]
    w.gemm_fn(
        x.data_ptr(), m, x.stride(0), *w.pointers(0), w.n, w.k, out.data_ptr(), args.panel_bytes, 1
    )
    return out


def run_tiles(x, w, args):
    rows = max(8, args.tile_bytes // (4 * w.k) // 8 * 8)
    tile = torch.empty(rows, w.k)
    # Transposed: each tile's products are a contiguous block of out^T's rows.
    out_t = torch.empty(w.n, x.shape[0])
    for first in range(0, w.n, rows):
        count = min(rows, w.n - first)
        w.dequant_fn(*w.pointers(first), count, w.k, tile.data_ptr(), 1)
        torch.mm(tile[:count], x.T, out=out_t[first : first + count])
    return out_t.T.contiguous()


CANDIDATES = {
    "float32": run_float32,
    "dequantize": run_dequantize,
    "kernel": run_kernel,
    "tiles": run_tiles,
    "gemm": run_gemm,
}


def step_ms(run, x_by_k, weights, args) -> tuple[float, float]:
    """Wall and thread CPU ms: on shared cores the CPU time leaves out the preempted time."""
    started, cpu_started = time.perf_counter(), time.thread_time()
    for w in weights:
        run(x_by_k[w.k], w, args)
    return 1000 * (time.perf_counter() - started), 1000 * (time.thread_time() - cpu_started)


def check(weights, args) -> None:
    """Every candidate computes the same product (float32 sums in another order)."""
    x = torch.randn(max(args.rows), weights[2].k)
    want = F.linear(x, cpu_dense(weights[2]))
    for name, run in CANDIDATES.items():
        if name != "float32":
            got = run(x, weights[2], args)
            error = ((got - want).abs().max() / want.abs().max()).item()
            assert error < 1e-5, f"{name}: relative error {error}"


def cpu_dense(w: Weight) -> torch.Tensor:
    dense = torch.empty(w.n, w.k)
    w.dequant_fn(*w.pointers(0), w.n, w.k, dense.data_ptr(), 1)
    return dense


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/quant_kernel.json"))
    parser.add_argument("--methods", nargs="+", default=["int8", "int4"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 33, 48, 64, 128, 256])
    parser.add_argument(
        "--candidates", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES)
    )
    parser.add_argument("--layers", type=int, default=8, help="decoder layers in a step")
    parser.add_argument("--tile-bytes", type=int, default=256 * 1024)
    parser.add_argument("--panel-bytes", type=int, default=cpu_kernel.PANEL_BYTES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--section", default="panels", help="key of the results file")
    args = parser.parse_args()
    if bindings.library() is None:
        sys.exit("the AVX2 kernels do not run on this machine")
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    torch.manual_seed(0)
    shapes = LAYER_SHAPES * args.layers + [HEAD_SHAPE]
    results = {}
    for method in args.methods:
        weights = [Weight(torch.randn(n, k) * 0.02, method) for n, k in shapes]
        check(weights, args)
        best = {name: {} for name in args.candidates}
        best_cpu = {name: {} for name in args.candidates}
        for m in args.rows:
            x_by_k = {k: torch.randn(m, k) for k in {k for _, k in shapes}}
            for _ in range(args.repeats):
                for name in args.candidates:
                    ms, cpu_ms = step_ms(CANDIDATES[name], x_by_k, weights, args)
                    best[name][str(m)] = round(min(best[name].get(str(m), ms), ms), 2)
                    best_cpu[name][str(m)] = round(
                        min(best_cpu[name].get(str(m), cpu_ms), cpu_ms), 2
                    )
            print(
                method,
                m,
                {name: (best[name][str(m)], best_cpu[name][str(m)]) for name in args.candidates},
                flush=True,
            )
        results[method] = {"ms_per_step": best, "thread_cpu_ms_per_step": best_cpu}
        del weights
    section = {
        "command": "python -m benchmarks.quant_kernel_bench " + " ".join(sys.argv[1:]),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "platform": platform.platform(),
        "threads": 1,
        "layers": args.layers,
        "tile_bytes": args.tile_bytes,
        "panel_bytes": args.panel_bytes,
        "methods": results,
    }
    update_results(args.output, args.section, section)
    print(json.dumps(section, indent=2))


if __name__ == "__main__":
    main()
