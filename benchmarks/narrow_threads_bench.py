"""A second compute thread at narrow decode steps: `python -m benchmarks.narrow_threads_bench`.

The core computes a step of fewer than --compute-wide-rows rows on one thread
fewer than --torch-threads (services/engine/core/compute_threads.py). That rule
was measured when a step was thousands of small torch ops; now a float32 step
is ~90 native calls, each one parallel region over output rows, and a batch-1
int8 step is mostly weight reading. Two sections, both in this process:

- "kernels": the int8 and int4 row kernels alone over SmolLM2-135M's
  projection shapes (30 layers + head) at 1-4 rows, random weights, 1 and 2
  threads alternating per pass: whether weight reading scales with the core.
  With --activations float32 int8, each thread count also alternates the
  float32 row kernels with the integer ones (native/qdot.cpp), keyed "N-int8";
  the steps section then alternates two engines, one per setting.
- "steps": real decode steps of a SmolLM2 engine (float32, int8, int4) at each
  batch, the thread count swapped per step (ABBA), wall and process CPU per step.

Wall time is what a stream sees; process CPU covers the whole OpenMP team.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

from maas_services.engine.machine_defaults import use_core_omp

use_core_omp()  # the core's OpenMP, before torch loads it

import torch  # noqa: E402

from benchmarks.machine import load_average_1m, machine  # noqa: E402
from benchmarks.step_bench import decoding_engine  # noqa: E402
from maas_services.common.model_files import default_model_path  # noqa: E402
from maas_services.common.tokenizer_loader import load_tokenizer  # noqa: E402
from maas_services.engine.loader import load_model  # noqa: E402
from maas_services.engine.quantization import cpu_kernel  # noqa: E402
from maas_services.engine.quantization.config import QuantizationConfig  # noqa: E402

# SmolLM2-135M's fused projections per layer (out, in) and the tied head.
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
HEAD_SHAPE = (49152, 576)
LAYERS = 30
FORMATS = {"float32": ("none", 64), "int8": ("int8", 64), "int4-g32": ("int4", 32)}


def _summary(n: int, walls: list[float], cpus: list[float]) -> dict:
    """Medians, and the medians of the samples in which the team had n cores' CPU.

    Beside other busy processes (each session its own autogroup) a team of two
    often gets one core's time between them: process CPU / wall tells how many
    cores it had, and the "had_cores" samples what a free second core adds.
    """
    cores = [c / w for c, w in zip(cpus, walls, strict=True)]
    had = [w for w, c in zip(walls, cores, strict=True) if c >= 0.75 * n]
    return {
        "wall_ms_p50": round(1e3 * statistics.median(walls), 2),
        "process_cpu_ms_p50": round(1e3 * statistics.median(cpus), 2),
        "cores_p50": round(statistics.median(cores), 2),
        "had_cores_samples": len(had),
        "had_cores_wall_ms_p50": round(1e3 * statistics.median(had), 2) if had else None,
        "samples": len(walls),
    }


def _weights(kind: str) -> list[tuple[int, tuple]]:
    """(in_features, the kernel's weight arguments) per projection, random values."""
    shapes = [s for _ in range(LAYERS) for s in LAYER_SHAPES] + [HEAD_SHAPE]
    weights = []
    for n, k in shapes:
        if kind == "int8":
            q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
            weights.append((k, (q, torch.rand(n) / 64)))
        else:
            packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
            groups = k // 32
            weights.append(
                (k, (packed, torch.rand(n, groups) / 16, -torch.rand(n, groups) / 2, 32))
            )
    return weights


def _variant(threads: int, activations: str) -> str:
    return str(threads) if activations == "float32" else f"{threads}-{activations}"


def kernels(rows_list: list[int], counts: list[int], passes: int, activations: list[str]) -> dict:
    """Wall ms per pass over the model's weights, and the weight bytes read per second."""
    variants = [(n, a) for n in counts for a in activations]
    order = variants + variants[::-1]
    result = {}
    for kind, matmul in (("int8", cpu_kernel.int8_matmul), ("int4", cpu_kernel.int4_matmul)):
        weights = _weights(kind)
        nbytes = sum(t.nbytes for _, w in weights for t in w if isinstance(t, torch.Tensor))
        for rows in rows_list:
            inputs = {k: torch.randn(rows, k) for k, _ in weights}
            walls: dict[tuple, list[float]] = {v: [] for v in variants}
            cpus: dict[tuple, list[float]] = {v: [] for v in variants}
            for i in range(passes * len(variants)):
                n, act = variant = order[i % len(order)]
                torch.set_num_threads(n)
                wall, cpu = time.perf_counter(), time.process_time()
                for k, w in weights:
                    matmul(inputs[k], *w, int8_activations=act == "int8")
                cpus[variant].append(time.process_time() - cpu)
                walls[variant].append(time.perf_counter() - wall)
            row = {}
            for n, act in variants:
                key = _variant(n, act)
                row[key] = _summary(n, walls[n, act], cpus[n, act])
                row[key]["weight_gb_per_s"] = round(nbytes / row[key]["wall_ms_p50"] / 1e6, 2)
            key = f"{kind}_rows{rows}"
            result[key] = row | {"load_average_1m": load_average_1m()}
            print(json.dumps({"kernel": kind, "rows": rows} | result[key]), flush=True)
    return result


def steps(
    fmt: str,
    batches: list[int],
    counts: list[int],
    per_count: int,
    prompt_len: int,
    activations: list[str],
) -> dict:
    """Decode steps per batch, the thread count (and with two settings of activations, the
    engine: one per setting, on its own copy of the model) swapped every step, ABBA."""
    method, group = FORMATS[fmt]
    if method == "none":
        activations = ["float32"]  # the setting only applies to quantized weights
    path = default_model_path()
    tokenizer = load_tokenizer(path)
    models = {}
    for act in activations:
        quantization = QuantizationConfig(method, group, activations=act)
        models[act] = load_model(path, torch.float32, progress=False, quantization=quantization)
    variants = [(n, a) for n in counts for a in activations]
    order = variants + variants[::-1]
    result = {}
    for batch in batches:
        total = per_count * len(variants)
        engines = {
            act: decoding_engine(model, config, tokenizer, batch, prompt_len, total)
            for act, (model, config) in models.items()
        }
        walls: dict[tuple, list[float]] = {v: [] for v in variants}
        cpus: dict[tuple, list[float]] = {v: [] for v in variants}
        loads = [load_average_1m()]
        for i in range(total):
            n, act = variant = order[i % len(order)]
            torch.set_num_threads(n)
            wall, cpu = time.perf_counter(), time.process_time()
            engines[act].step()
            cpus[variant].append(time.process_time() - cpu)
            walls[variant].append(time.perf_counter() - wall)
        loads.append(load_average_1m())
        row = {}
        for n, act in variants:
            key = _variant(n, act)
            row[key] = _summary(n, walls[n, act], cpus[n, act])
            row[key]["tokens_per_s"] = round(1e3 * batch / row[key]["wall_ms_p50"], 2)
        result[str(batch)] = row | {"load_average_1m": loads}
        print(json.dumps({"format": fmt, "batch": batch} | result[str(batch)]), flush=True)
        del engines
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sections", nargs="+", default=["kernels", "steps"])
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--kernel-rows", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--activations", nargs="+", default=["float32"], choices=["float32", "int8"],
        help="the quantized row kernels' activations: float32, int8 (qdot.cpp), or both",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=24, help="steps per thread count and batch")
    parser.add_argument("--passes", type=int, default=12, help="kernel passes per thread count")
    parser.add_argument("--prompt-len", type=int, default=48)
    parser.add_argument(
        "--output", type=Path, default=Path("benchmarks/results/narrow_threads.json")
    )
    args = parser.parse_args()
    result = {
        "machine": machine(),
        "args": vars(args) | {"output": str(args.output)},
        "load_before": load_average_1m(),
    }
    if "kernels" in args.sections:
        result["kernels"] = kernels(args.kernel_rows, args.threads, args.passes, args.activations)
    if "steps" in args.sections:
        result["steps"] = {
            fmt: steps(
                fmt, args.batches, args.threads, args.steps, args.prompt_len, args.activations
            )
            for fmt in args.formats
        }
    result["load_after"] = load_average_1m()
    args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
