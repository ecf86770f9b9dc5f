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
"""

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path

from maas_services.engine.machine_defaults import use_core_omp

use_core_omp()  # the core's OpenMP, before torch loads it

import torch  # noqa: E402

from benchmarks.machine import machine  # noqa: E402
from benchmarks.step_bench import decoding_engine  # noqa: E402
from maas_services.common.model_files import default_model_path  # noqa: E402
from maas_services.common.tokenizer_loader import load_tokenizer  # noqa: E402
from maas_services.engine.loader import load_model  # noqa: E402
from maas_services.engine.model_config import ModelConfig  # noqa: E402
from maas_services.engine.native_layers import NativeHalves  # noqa: E402
from maas_services.engine.quantization.config import QuantizationConfig  # noqa: E402


def best_seconds(call, repeats: int) -> float:
    call()  # warm: page faults, per-thread buffers, the OpenMP team
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
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


class Peak:
    """The matmul peak, sampled between rounds of decode steps so both see the same load.

    The best sample of the run is the peak: a busy machine only ever slows a
    sample down.
    """

    def __init__(self, model, config: ModelConfig, args: argparse.Namespace):
        self.halves = NativeHalves.of(model.model.layers[0])  # keeps that layer alive
        self.config, self.args = config, args
        self.samples: dict[str, dict[str, list[float]]] = {
            str(n): {"torch_mm": [], "panel_gemm": []} for n in args.peak_threads
        }

    def sample(self) -> None:
        args = self.args
        for n in args.peak_threads:
            torch.set_num_threads(n)
            row = self.samples[str(n)]
            row["torch_mm"].append(torch_mm_gflops(args.mm_size, args.repeats))
            if self.halves is not None:
                row["panel_gemm"].append(
                    panel_gemm_gflops(self.halves, self.config, args.gemm_rows, args.repeats)
                )
        torch.set_num_threads(args.threads)

    def best(self) -> float:
        return max(max(v) for row in self.samples.values() for v in row.values() if v)

    def summary(self) -> dict:
        return {
            n: {f"{kind}_gflops_best": round(max(v), 1) for kind, v in row.items() if v}
            | {f"{kind}_gflops_p50": round(statistics.median(v), 1) for kind, v in row.items() if v}
            for n, row in self.samples.items()
        }


def decode_steps(engine, config, peak: Peak, rounds: int, steps: int) -> dict:
    """rounds of steps decode steps, the peak sampled before each round."""
    walls, cpus, flops, loads = [], [], [], []
    for _ in range(rounds):
        peak.sample()
        loads.append(round(os.getloadavg()[0], 2))
        for _ in range(steps):
            contexts = [seq.num_computed_tokens + 1 for seq in engine.scheduler.running]
            wall, cpu = time.perf_counter(), time.process_time()
            engine.step()
            cpus.append(time.process_time() - cpu)
            walls.append(time.perf_counter() - wall)
            flops.append(
                weight_flops_per_row(config) * len(contexts) + attention_flops(config, contexts)
            )
    wall = statistics.median(walls)
    return {
        "wall_ms_p50": round(1e3 * wall, 1),
        "process_cpu_ms_p50": round(1e3 * statistics.median(cpus), 1),
        "gflop_per_step": round(statistics.median(flops) / 1e9, 2),
        "achieved_gflops": round(statistics.median(flops) / wall / 1e9, 2),
        "load_average_1m": loads,
    }


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
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = default_model_path()
    tokenizer = load_tokenizer(path)
    result = {"machine": machine(), "args": vars(args) | {"output": str(args.output)}}
    model, config = load_model(path, torch.float32, progress=False)
    peak = Peak(model, config, args)
    decode: dict[str, dict] = {}
    loaded = "none"
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
            steps = args.rounds * args.steps
            engine = decoding_engine(model, config, tokenizer, batch, args.prompt_len, steps)
            row = decode_steps(engine, config, peak, args.rounds, args.steps)
            decode.setdefault(format_, {})[str(batch)] = row
            print(json.dumps({"format": format_, "batch": batch} | row), flush=True)
            del engine
    best = peak.best()
    for rows in decode.values():
        for row in rows.values():
            row["of_peak"] = round(row["achieved_gflops"] / best, 3)
    result |= {"peak": peak.summary(), "peak_gflops": round(best, 1), "decode": decode}
    print(json.dumps({"peak": result["peak"], "peak_gflops": result["peak_gflops"]}))
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
