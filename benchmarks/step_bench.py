"""Where a decode step's CPU goes at a batch size: `python -m benchmarks.step_bench`.

The engine in this process (no gRPC, no core process), float32, as many
compute threads as the core would use (--threads), the peer benchmark's shape
of work: greedy decodes of short prompts, all in the decode phase. Per batch it
reports wall and thread CPU per step, the step's phases (StepStats), and with
--profile torch's per-op CPU time in classes (linear, attention, elementwise,
sampler), as shares of the ops' time.

With --threads-ab 1 2 it runs each batch's decode steps on one and two
threads in alternating rounds instead, and reports wall ms and tokens/s per
count (the numbers behind the core's --compute-wide-rows; docs/engine.md).

With --native-ab it swaps every layer's dense halves between the native ones
(services/engine/native_layers.py) and torch's every step (ABBA) on one
engine, and reports thread CPU and wall ms per step for each; --one-call-ab
likewise swaps a decode step's layers between one native call for all of them
and three a layer (the halves and attention); --blocks-ab between steps from
the GGUF's own blocks (--kernel-weights checkpoint; --kernel-activations int16
for their int16 row kernel) and from the weights --wide-gemm computes from
(float32, or bf16 copies: then the blocks serve up to BF16_BLOCKS_ROWS rows,
interleaved); --wide-gemm-ab A B between two --wide-gemm choices, both with the
GGUF's blocks (--kernel-activations as given), e.g. int8 against bf16.
--kv-cache-dtype bf16 gives the engine a bf16 pool, as the avx512_bf16 class's
default.

For an A/B of code, run it from two trees in turn (`--label`), e.g. a base revision
exported with `git archive REV | tar -x -C /tmp/base`, and compare the medians; for a
change to the kernels alone, benchmarks/library_ab.py runs both builds in one process.
"""

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from maas_services.engine.machine_defaults import use_core_omp

use_core_omp()  # the core's OpenMP, before torch loads it

import torch  # noqa: E402

from benchmarks.machine import load_average_1m, machine  # noqa: E402
from benchmarks.order import in_turn  # noqa: E402
from maas_services.common.model_files import default_model_path  # noqa: E402
from maas_services.common.quantization_methods import QUANTIZATION_METHODS  # noqa: E402
from maas_services.common.tokenizer_loader import load_tokenizer  # noqa: E402
from maas_services.engine import native_layers  # noqa: E402
from maas_services.engine.compute_path import ComputePath  # noqa: E402
from maas_services.engine.loader import load_model  # noqa: E402
from maas_services.engine.offline import offline_engine  # noqa: E402
from maas_services.engine.quantization.checkpoint_blocks import checkpoint_blocks  # noqa: E402
from maas_services.engine.quantization.config import ACTIVATIONS, QuantizationConfig  # noqa: E402
from maas_services.engine.sampling_params import SamplingParams  # noqa: E402
from maas_services.engine.settings import EngineSettings  # noqa: E402

# torch op name -> class. What matches none is "other ops".
OP_CLASSES = {
    "linear": ("aten::addmm", "aten::mm", "aten::linear", "aten::matmul", "aten::bmm"),
    "attention": (
        "aten::_scaled_dot_product",
        "aten::scaled_dot_product",
        "aten::index_select",
        "aten::index_copy",
        "aten::_softmax",
        "aten::baddbmm",
    ),
    "sampler": ("aten::argmax", "aten::max", "aten::stack", "aten::searchsorted", "aten::topk"),
    "elementwise": (
        "aten::mul",
        "aten::add",
        "aten::sub",
        "aten::neg",
        "aten::cat",
        "aten::rsqrt",
        "aten::pow",
        "aten::mean",
        "aten::silu",
        "aten::to",
        "aten::_to_copy",
        "aten::copy_",
        "aten::embedding",
        "aten::cos",
        "aten::sin",
    ),
}


def op_class(name: str) -> str:
    for cls, prefixes in OP_CLASSES.items():
        if name.startswith(prefixes):
            return cls
    return "other ops"


def decoding_engine(
    model, config, tokenizer, batch: int, prompt_len: int, steps: int, kv_dtype=None
):
    """An engine (its KV pool of kv_dtype, else the model's) whose batch requests have all
    finished prefill and decode from here."""
    engine = offline_engine(
        model, config, tokenizer, batch, prompt_len + steps + 16, kv_dtype=kv_dtype
    )
    rng = random.Random(batch)
    params = SamplingParams(temperature=0, max_tokens=steps + 4, ignore_eos=True)
    for i in range(batch):
        prompt = [rng.randrange(100, config.vocab_size) for _ in range(prompt_len)]
        engine.add_request(f"r{i}", prompt, params)
    while engine.scheduler.waiting or any(
        seq.num_computed_tokens < seq.num_prompt_tokens for seq in engine.scheduler.running
    ):
        engine.step()
    engine.step()  # the first decode after prefill
    return engine


def measure(engine, steps: int) -> dict:
    walls, cpus = [], []
    phases: dict[str, list[float]] = {}
    for _ in range(steps):
        wall, cpu = time.perf_counter(), time.thread_time()
        engine.step()
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - wall)
        for phase, seconds in engine.last_stats.phase_seconds.items():
            phases.setdefault(phase, []).append(seconds)
    return {
        "wall_ms_p50": 1e3 * statistics.median(walls),
        "cpu_ms_p50": 1e3 * statistics.median(cpus),
        "phase_ms_p50": {k: 1e3 * statistics.median(v) for k, v in phases.items()},
    }


def threads_ab(engine, counts: list[int], rounds: int, steps: int) -> dict:
    """Decode steps on each thread count in turn, the order reversed every round.

    Wall time is what a stream sees; process CPU covers every thread of the team.
    The contexts grow a token a step, and the alternating order spreads that
    evenly over the counts.
    """
    batch = len(engine.scheduler.running)
    walls: dict[int, list[float]] = {n: [] for n in counts}
    cpus: dict[int, list[float]] = {n: [] for n in counts}
    loads = []
    for round_ in range(rounds):
        for n in in_turn(counts, round_):
            torch.set_num_threads(n)
            for _ in range(steps):
                wall, cpu = time.perf_counter(), time.process_time()
                engine.step()
                cpus[n].append(time.process_time() - cpu)
                walls[n].append(time.perf_counter() - wall)
        loads.append(load_average_1m())
    rows = {}
    for n in counts:
        wall = statistics.median(walls[n])
        rows[str(n)] = {
            "wall_ms_p50": round(1e3 * wall, 1),
            "tokens_per_s": round(batch / wall, 2),
            "process_cpu_ms_p50": round(1e3 * statistics.median(cpus[n]), 1),
        }
    return {"threads": rows, "load_average_1m": loads}


def native_ab(engine, steps: int) -> dict:
    """Decode steps with the native layer halves and torch's, swapped per step (ABBA)."""
    model = engine.runner.model
    return paths_ab(
        engine, steps, {"native": native_layers.Native(model, "A"), "torch": ComputePath("B")}
    )


def one_call_ab(engine, steps: int) -> dict:
    """Decode steps with every layer in one native call and three calls a layer (ABBA)."""
    model = engine.runner.model
    paths = {
        "one_call": native_layers.Native(model, "A"),
        "per_layer": native_layers.Native(model, "B", one_call=False),
    }
    return paths_ab(engine, steps, paths)


def blocks_ab(engine, steps: int, source: Path, wide_gemm: str, int16: bool) -> dict:
    """Decode steps reading the checkpoint's blocks (their row kernel on int16 activations
    where int16) and the weights wide_gemm computes from (float32, or their bf16 copies),
    ABBA."""
    model = engine.runner.model
    blocks = checkpoint_blocks(model, source)
    paths = {
        "checkpoint": native_layers.Native(
            model, "A", wide_gemm=wide_gemm, blocks=blocks, blocks_int16=int16
        ),
        wide_gemm: native_layers.Native(model, "B", wide_gemm=wide_gemm),
    }
    return paths_ab(engine, steps, paths)


def wide_gemm_ab(engine, steps: int, source: Path, choices: list[str], int16: bool) -> dict:
    """Decode steps under two --wide-gemm choices, both with the checkpoint's blocks, ABBA."""
    model = engine.runner.model
    blocks = checkpoint_blocks(model, source)
    paths = {
        choice: native_layers.Native(
            model, choice, wide_gemm=choice, blocks=blocks, blocks_int16=int16
        )
        for choice in choices
    }
    return paths_ab(engine, steps, paths)


def paths_ab(engine, steps: int, paths: dict[str, ComputePath]) -> dict:
    """swapped_ab between two compute paths (name -> path) of the engine's runner."""
    runner = engine.runner
    sides = {name: (lambda p=path: setattr(runner, "path", p)) for name, path in paths.items()}
    return swapped_ab(engine, steps, sides)


def swapped_ab(engine, steps: int, sides: dict) -> dict:
    """Decode steps on two sides (name -> what sets the engine up for it), swapped per
    step in ABBA order; the first side stays set up after.

    Thread CPU is the step's whole compute on one thread (--threads 1); the
    contexts grow a token a step, and the ABBA order spreads that over both sides.
    """
    first, second = sides
    cpus: dict[str, list[float]] = {first: [], second: []}
    walls: dict[str, list[float]] = {first: [], second: []}
    loads = []
    for i in range(steps):
        side = (first, second, second, first)[i % 4]
        sides[side]()
        wall, cpu = time.perf_counter(), time.thread_time()
        engine.step()
        cpus[side].append(time.thread_time() - cpu)
        walls[side].append(time.perf_counter() - wall)
        if i % 16 == 0:
            loads.append(load_average_1m())
    sides[first]()
    rows = {
        side: {
            "cpu_ms_p50": round(1e3 * statistics.median(cpus[side]), 2),
            "wall_ms_p50": round(1e3 * statistics.median(walls[side]), 2),
        }
        for side in cpus
    }
    cpu_ratio = rows[first]["cpu_ms_p50"] / rows[second]["cpu_ms_p50"]
    wall_ratio = rows[first]["wall_ms_p50"] / rows[second]["wall_ms_p50"]
    return {
        "sides": rows,
        f"{first}_over_{second}_cpu": round(cpu_ratio, 3),
        f"{first}_over_{second}_wall": round(wall_ratio, 3),
        "load_average_1m": loads,
    }


def set_threads_cost_us(counts: list[int], calls: int = 2000) -> float:
    """Microseconds per torch.set_num_threads call, alternating between the counts."""
    started = time.perf_counter()
    for i in range(calls):
        torch.set_num_threads(counts[i % len(counts)])
    return round(1e6 * (time.perf_counter() - started) / calls, 2)


def profile(engine, steps: int) -> dict:
    """torch's self time per op class, ms per step, beside the steps' thread CPU.

    The profiler's op times are wall time inside each op: on a loaded machine
    they include time the thread waited for a core, so read them as shares.
    """
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        started = time.thread_time()
        for _ in range(steps):
            engine.step()
        total = time.thread_time() - started
    classes: dict[str, float] = {}
    top = []
    for event in prof.key_averages():
        ms = event.self_cpu_time_total / 1e3 / steps
        classes[op_class(event.key)] = classes.get(op_class(event.key), 0.0) + ms
        top.append((ms, event.key, event.count // steps))
    top.sort(reverse=True)
    return {
        "profiled_cpu_ms_per_step": 1e3 * total / steps,
        "classes_ms_per_step": {k: round(v, 3) for k, v in classes.items()},
        "top_ops": [{"op": k, "ms": round(ms, 3), "calls": n} for ms, k, n in top[:20]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--prompt-len", type=int, default=48)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--threads-ab",
        type=int,
        nargs="+",
        help="decode steps on these thread counts, interleaved (--rounds of --steps each)",
    )
    parser.add_argument("--rounds", type=int, default=4, help="--threads-ab rounds")
    parser.add_argument("--native-ab", action="store_true", help="native vs torch layer halves")
    parser.add_argument(
        "--one-call-ab",
        action="store_true",
        help="every layer of a decode step in one native call vs three calls a layer",
    )
    parser.add_argument(
        "--blocks-ab",
        action="store_true",
        help="steps from the GGUF's own blocks vs from the weights --wide-gemm reads",
    )
    parser.add_argument("--wide-gemm", choices=native_layers.WIDE_GEMMS, default="float32")
    parser.add_argument(
        "--wide-gemm-ab",
        nargs=2,
        choices=native_layers.WIDE_GEMMS,
        metavar=("A", "B"),
        help="steps under --wide-gemm A vs B, both from the GGUF's blocks",
    )
    parser.add_argument("--kernel-activations", choices=("float32", "int16"), default="float32")
    parser.add_argument("--kv-cache-dtype", choices=("model", "bf16"), default="model")
    parser.add_argument("--quantization", choices=QUANTIZATION_METHODS, default="none")
    parser.add_argument("--group-size", type=int, default=64, help="int4: 32 = the GGUF's blocks")
    parser.add_argument(
        "--activations",
        choices=ACTIVATIONS,
        default=EngineSettings().quantization_activations,
        help="quantized weights: how narrow kernels take the activations (default: the engine's)",
    )
    parser.add_argument("--label", default="")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = default_model_path()
    quantization = QuantizationConfig(
        args.quantization, args.group_size, activations=args.activations
    )
    model, config = load_model(path, torch.float32, progress=False, quantization=quantization)
    tokenizer = load_tokenizer(path)
    result = {
        "label": args.label,
        "machine": machine(),
        "load_before": os.getloadavg(),
        "args": vars(args) | {"output": str(args.output)},
        "batches": {},
    }
    if args.threads_ab:
        result["set_num_threads_us"] = set_threads_cost_us(args.threads_ab)
    int16 = args.kernel_activations == "int16"
    for batch in args.batches:
        steps = 2 * args.steps if args.profile else args.steps
        if args.threads_ab:
            steps = args.steps * args.rounds * len(args.threads_ab)
        if args.native_ab or args.one_call_ab or args.blocks_ab or args.wide_gemm_ab:
            steps = 2 * args.steps
        kv_dtype = torch.bfloat16 if args.kv_cache_dtype == "bf16" else None
        engine = decoding_engine(
            model, config, tokenizer, batch, args.prompt_len, steps, kv_dtype=kv_dtype
        )
        if args.threads_ab:
            row = threads_ab(engine, args.threads_ab, args.rounds, args.steps)
        elif args.native_ab:
            row = native_ab(engine, 2 * args.steps)
        elif args.one_call_ab:
            row = one_call_ab(engine, 2 * args.steps)
        elif args.blocks_ab:
            row = blocks_ab(engine, 2 * args.steps, path, args.wide_gemm, int16)
        elif args.wide_gemm_ab:
            row = wide_gemm_ab(engine, 2 * args.steps, path, args.wide_gemm_ab, int16)
        else:
            row = measure(engine, args.steps)
        if args.profile:
            row |= profile(engine, args.steps)
        result["batches"][batch] = row
        print(json.dumps({"label": args.label, "batch": batch} | row), flush=True)
    result["load_after"] = os.getloadavg()
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
