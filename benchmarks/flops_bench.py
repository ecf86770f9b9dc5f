"""Achieved FLOP/s of wide decode steps against the machine's matmul peak, in one run.

`python -m benchmarks.flops_bench` (issue #13's fourth target: >= 50% of the
peak at 64-stream decode). In one process:

- the peak: float32 `torch.mm` on a large square, and our panel GEMM on
  SmolLM2's shapes (one layer's native second half, `layer_outputs_f32`:
  o_proj, gate_up and down at --gemm-rows rows), at each thread count,
  sampled before every round of decode steps; the best sample is the peak;
- decode steps of a real engine (benchmarks.step_bench.decoding_engine) at
  each batch, per weight format, at --threads threads (the core's
  compute_threads gives 2 from 32 rows), --rounds rounds of --steps: wall and
  process CPU per step.

A step's work is 2 x (the non-embedding weights + the LM head) x rows plus
attention's 4 x heads x head_dim x context per layer and row, counted from the
model's shape, so int8 weights do the float32 arithmetic they stand for.

With --wide-gemms float32 bf16 (a CPU whose library has the bf16 panel,
native/bf16.h), each batch's decode steps run both wide GEMMs on one engine,
its compute path swapped per round and the order reversed every round; the peak
gains the bf16 panel's own sample, and each side's "of peak" is against the
peak of its own arithmetic (float32: torch.mm and the float32 panel; bf16: the
bf16 panel). --gemm-rows-ab 8 32 64 256 first times the panels alone: layer 0's
four projections (SmolLM2's shapes, the model's weights) per wide GEMM at those
rows, interleaved, at 1 thread (thread CPU: robust to a shared machine) and at
--threads (wall). int8 (--wide-gemm int8, opt-in) runs every step from the GGUF's
own blocks through the int8 kernel; its peak is that kernel's on the same half.
"""

import argparse
import ctypes
import functools
import gc
import json
import statistics
import time
from pathlib import Path

from maas_services.engine.machine_defaults import use_core_omp

use_core_omp()  # the core's OpenMP, before torch loads it

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.machine import load_average_1m, machine  # noqa: E402
from benchmarks.order import in_turn  # noqa: E402
from benchmarks.results_file import report  # noqa: E402
from benchmarks.step_bench import decoding_engine  # noqa: E402
from maas_kernels.native import bindings  # noqa: E402
from maas_services.common.model_files import default_model_path  # noqa: E402
from maas_services.common.tokenizer_loader import load_tokenizer  # noqa: E402
from maas_services.engine.loader import load_model  # noqa: E402
from maas_services.engine.model_config import ModelConfig  # noqa: E402
from maas_services.engine.native_layers import WIDE_GEMMS, Native, NativeHalves  # noqa: E402
from maas_services.engine.quantization import cpu_kernel  # noqa: E402
from maas_services.engine.quantization.checkpoint_blocks import (  # noqa: E402
    CheckpointBlock,
    checkpoint_blocks,
)
from maas_services.engine.quantization.config import QuantizationConfig  # noqa: E402


def best_seconds(call, repeats: int, clock=time.perf_counter) -> float:
    call()  # warm: page faults, per-thread buffers, the OpenMP team
    best = float("inf")
    for _ in range(repeats):
        started = clock()
        call()
        best = min(best, clock() - started)
    return best


def torch_mm_gflops(size: int, repeats: int) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    return 2 * size**3 / best_seconds(lambda: torch.mm(a, b, out=out), repeats) / 1e9


def panel_gemm_gflops(halves: NativeHalves, config: ModelConfig, rows: int, repeats: int) -> float:
    attended = torch.randn(rows, config.num_heads * config.head_dim)
    residual = torch.randn(rows, config.hidden_size)
    h, i = config.hidden_size, config.intermediate_size
    flops = 2 * rows * (config.num_heads * config.head_dim * h + 2 * h * i + i * h)
    return flops / best_seconds(lambda: halves.outputs(attended, residual), repeats) / 1e9


def weight_flops_per_row(config: ModelConfig) -> int:
    h, d = config.hidden_size, config.head_dim
    qkv = h * d * (config.num_heads + 2 * config.num_kv_heads)
    layer = qkv + config.num_heads * d * h + 3 * h * config.intermediate_size
    return 2 * (config.num_layers * layer + config.vocab_size * h)


def attention_flops(config: ModelConfig, contexts: list[int]) -> int:
    """Scores and the weighted sum of values: 2 x 2 x heads x head_dim per position."""
    per_position = 4 * config.num_heads * config.head_dim * config.num_layers
    return per_position * sum(contexts)


# The peak samples of each wide GEMM's arithmetic.
PEAK_KINDS = {
    "float32": ("torch_mm", "panel_gemm"),
    "bf16": ("panel_gemm_bf16",),
    "int8": ("int8_kernel",),
}


def layer_halves(
    model, wide_gemms: list[str], blocks: dict[nn.Module, CheckpointBlock]
) -> dict[str, NativeHalves | None]:
    """Layer 0's native halves with each wide GEMM (they keep that layer alive); int8's
    from the checkpoint's blocks."""
    layer = model.model.layers[0]
    return {
        w: NativeHalves.of(
            layer,
            wide_bf16=w != "float32",
            blocks=blocks if w == "int8" else None,
            wide_int8=w == "int8",
        )
        for w in wide_gemms
    }


def native_path(model, wide_gemm: str, blocks: dict[nn.Module, CheckpointBlock]) -> Native:
    """The decode steps' compute path for a wide GEMM (int8: with the blocks)."""
    int8 = wide_gemm == "int8"
    return Native(model, wide_gemm, wide_gemm=wide_gemm, blocks=blocks if int8 else None)


class Peak:
    """The matmul peak, sampled between rounds of decode steps so both see the same load.

    The best sample of the run is the peak: a busy machine only ever slows a
    sample down.
    """

    def __init__(self, model, config: ModelConfig, args: argparse.Namespace, blocks: dict):
        self.halves = layer_halves(model, args.wide_gemms, blocks)
        self.config, self.args = config, args
        kinds = [kind for w in args.wide_gemms for kind in PEAK_KINDS[w]]
        self.samples: dict[str, dict[str, list[float]]] = {
            str(n): {kind: [] for kind in kinds} for n in args.peak_threads
        }

    def sample(self) -> None:
        args = self.args
        for n in args.peak_threads:
            torch.set_num_threads(n)
            row = self.samples[str(n)]
            if "torch_mm" in row:
                row["torch_mm"].append(torch_mm_gflops(args.mm_size, args.repeats))
            for wide, halves in self.halves.items():
                if halves is not None:
                    row[PEAK_KINDS[wide][-1]].append(
                        panel_gemm_gflops(halves, self.config, args.gemm_rows, args.repeats)
                    )
        torch.set_num_threads(args.threads)

    def best(self, wide_gemm: str = "float32") -> float:
        kinds = PEAK_KINDS[wide_gemm]
        return max(
            max(v) for row in self.samples.values() for k, v in row.items() if v and k in kinds
        )

    def summary(self) -> dict:
        return {
            n: {f"{kind}_gflops_best": round(max(v), 1) for kind, v in row.items() if v}
            | {f"{kind}_gflops_p50": round(statistics.median(v), 1) for kind, v in row.items() if v}
            for n, row in self.samples.items()
        }


def decode_steps(engine, config, peak: Peak, rounds: int, steps: int, paths: dict) -> dict:
    """rounds of steps decode steps on each compute path (wide GEMM -> Native), the peak
    sampled before each round, the paths' order reversed every round."""
    sides = list(paths)
    walls, cpus, flops = ({side: [] for side in sides} for _ in range(3))
    batch = len(engine.scheduler.running)
    loads = []
    for round_ in range(rounds):
        peak.sample()
        loads.append(load_average_1m())
        for side in in_turn(sides, round_):
            engine.runner.path = paths[side]
            for _ in range(steps):
                contexts = [seq.num_computed_tokens + 1 for seq in engine.scheduler.running]
                wall, cpu = time.perf_counter(), time.process_time()
                engine.step()
                cpus[side].append(time.process_time() - cpu)
                walls[side].append(time.perf_counter() - wall)
                flops[side].append(
                    weight_flops_per_row(config) * len(contexts) + attention_flops(config, contexts)
                )
    rows = {}
    for side in sides:
        wall = statistics.median(walls[side])
        rows[side] = {
            "wall_ms_p50": round(1e3 * wall, 1),
            "tokens_per_s": round(batch / wall, 1),
            "process_cpu_ms_p50": round(1e3 * statistics.median(cpus[side]), 1),
            # What a shared machine's preemption leaves out: tokens per CPU second.
            "tokens_per_cpu_s": round(batch / statistics.median(cpus[side]), 1),
            "gflop_per_step": round(statistics.median(flops[side]) / 1e9, 2),
            "achieved_gflops": round(statistics.median(flops[side]) / wall / 1e9, 2),
        }
    return rows | {"load_average_1m": loads}


def run_projections(projections: list, threads: int) -> None:
    """weight_linear on each (Weight, x, out): the rows past the row kernels, so the panels."""
    lib = bindings.library()
    for weight, x, out in projections:
        lib.weight_linear(
            ctypes.addressof(weight),
            x.data_ptr(),
            x.shape[0],
            x.shape[1],
            out.data_ptr(),
            cpu_kernel.MAX_ROW_KERNEL_ROWS,
            cpu_kernel.PANEL_BYTES,
            threads,
        )


def gemm_ab(model, args: argparse.Namespace, blocks: dict) -> dict:
    """GFLOP/s of layer 0's four projections per wide GEMM at each of --gemm-rows-ab rows:
    1 thread by thread CPU, --threads by wall, best of --repeats, the sides interleaved."""
    halves = layer_halves(model, args.wide_gemms, blocks)
    clocks = {"1_thread_cpu": (1, time.thread_time)}
    clocks[f"{args.threads}_threads_wall"] = (args.threads, time.perf_counter)
    results: dict[str, dict] = {}
    for rows in args.gemm_rows_ab:
        projections = {}
        for side, h in halves.items():
            layer = h.described
            weights = (layer.qkv, layer.o, layer.gate_up, layer.down)
            projections[side] = [
                (w, torch.randn(rows, w.k), torch.empty(rows, w.n)) for w in weights
            ]
        flops = 2 * rows * sum(w.n * w.k for w, _, _ in projections[args.wide_gemms[0]])
        row: dict[str, dict] = {side: {} for side in halves}
        for key, (threads, clock) in clocks.items():
            torch.set_num_threads(threads)
            best = dict.fromkeys(halves, float("inf"))
            for round_ in range(args.repeats):
                for side in in_turn(halves, round_):
                    call = functools.partial(run_projections, projections[side], threads)
                    best[side] = min(best[side], best_seconds(call, 1, clock))
            for side in halves:
                row[side][f"gflops_{key}"] = round(flops / best[side] / 1e9, 1)
        if "float32" in row and "bf16" in row:
            row["bf16_over_float32"] = {
                key: round(row["bf16"][key] / row["float32"][key], 2) for key in row["float32"]
            }
        results[str(rows)] = row
        print(json.dumps({"gemm_rows": rows} | row), flush=True)
    torch.set_num_threads(args.threads)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--formats", nargs="+", default=["none", "int8"])
    parser.add_argument("--prompt-len", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="decode steps a round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peak-threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--mm-size", type=int, default=2048)
    parser.add_argument("--gemm-rows", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="best of, per peak sample")
    parser.add_argument(
        "--wide-gemms",
        nargs="+",
        choices=WIDE_GEMMS,
        default=["float32"],
        help="the native layers' wide GEMMs to run each batch's steps with, swapped per round",
    )
    parser.add_argument(
        "--gemm-rows-ab",
        type=int,
        nargs="*",
        default=[],
        help="first time layer 0's projections per --wide-gemms at these rows",
    )
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = default_model_path()
    tokenizer = load_tokenizer(path)
    result = {"machine": machine(), "args": vars(args) | {"output": str(args.output)}}
    model, config = load_model(path, torch.float32, progress=False)
    gemm: dict[str, dict] = {}
    loaded = "none"
    for format_ in args.formats if args.gemm_rows_ab else []:
        if format_ != loaded:
            loaded = format_
            model, config = load_model(
                path, torch.float32, progress=False, quantization=QuantizationConfig(format_, 64)
            )
        gemm[format_] = gemm_ab(model, args, checkpoint_blocks(model, path))
    if loaded != "none":
        loaded = "none"
        del model
        gc.collect()
        model, config = load_model(path, torch.float32, progress=False)
    peak = Peak(model, config, args, checkpoint_blocks(model, path))
    decode: dict[str, dict] = {}
    for format_ in args.formats:
        if format_ != loaded:
            loaded = format_
            del model
            gc.collect()
            quantization = QuantizationConfig(format_, 64)
            model, config = load_model(
                path, torch.float32, progress=False, quantization=quantization
            )
        for batch in args.batches:
            steps = args.rounds * args.steps * len(args.wide_gemms)
            engine = decoding_engine(model, config, tokenizer, batch, args.prompt_len, steps)
            blocks = checkpoint_blocks(engine.runner.model, path)
            paths = {w: native_path(engine.runner.model, w, blocks) for w in args.wide_gemms}
            row = decode_steps(engine, config, peak, args.rounds, args.steps, paths)
            decode.setdefault(format_, {})[str(batch)] = row
            print(json.dumps({"format": format_, "batch": batch} | row), flush=True)
            del engine, paths
    peaks = {w: peak.best(w) for w in args.wide_gemms}
    for rows in decode.values():
        for row in rows.values():
            for w in args.wide_gemms:
                row[w]["of_peak"] = round(row[w]["achieved_gflops"] / peaks[w], 3)
    for faster, base in (("bf16", "float32"), ("int8", "bf16")):
        if faster in args.wide_gemms and base in args.wide_gemms:
            for rows in decode.values():
                for row in rows.values():
                    row[f"{faster}_over_{base}_tokens_per_s"] = round(
                        row[faster]["tokens_per_s"] / row[base]["tokens_per_s"], 3
                    )
    result |= {
        "gemm": gemm,
        "peak": peak.summary(),
        "peak_gflops": {w: round(p, 1) for w, p in peaks.items()},
        "decode": decode,
    }
    report(result, args.output)


if __name__ == "__main__":
    main()
