"""CPU decode attention, native vs torch path: `python -m benchmarks.attention_bench`.

Two sections, each an A/B in one process with the order swapped every round:

- layer: one layer's paged_attention call for a batch of decodes, SmolLM2-135M's
  shapes (9 heads, 3 KV heads, head_dim 64, the engine's block size), q/k/v as
  views of one fused projection, each sequence's blocks consecutive as the free
  list hands them out; thread CPU us per call (process CPU at 2 threads, whose
  team's second thread thread_time misses), and the metadata build per step with
  and without the torch path's decode groups.
- step: whole decode steps of the real engine (benchmarks.step_bench's), native
  and torch attention swapped per step (ABBA), thread CPU ms per step.
- pool: whole decode steps of two engines alike but for their KV pool's dtype
  (float32, bf16: --kv-cache-dtype), the serving path's matmuls (this machine's
  --wide-gemm default), steps of one then the other (ABBA), wall ms per step.
"""

import argparse
import json
import os
import random
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

from maas_services.engine.machine_defaults import use_core_omp

use_core_omp()  # the core's OpenMP, before torch loads it

import torch  # noqa: E402

from benchmarks.machine import load_average_1m, machine  # noqa: E402
from benchmarks.order import in_turn  # noqa: E402
from benchmarks.results_file import update_results  # noqa: E402
from benchmarks.step_bench import decoding_engine  # noqa: E402
from maas_kernels.native import bindings  # noqa: E402
from maas_services.common.block_hash import BLOCK_SIZE  # noqa: E402
from maas_services.engine import native_attention  # noqa: E402
from maas_services.engine.attention import paged_attention  # noqa: E402
from maas_services.engine.attention_metadata import AttentionMetadata  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
CONTEXTS = {"50-300": (50, 300), "1000-2000": (1000, 2000)}
PATHS = ("native", "torch")


def _path(name: str):
    return native_attention.torch_path() if name == "torch" else nullcontext()


def layer_inputs(
    batch: int,
    low: int,
    high: int,
    seed: int,
    pool_dtype: torch.dtype = torch.float32,
    shuffled: bool = False,
):
    """A layer's q, k, v and pools for batch decodes of low-high positions, and the
    arguments of their AttentionMetadata.build. Each sequence's blocks are consecutive, as
    the free list hands them to a lone sequence, or where shuffled scattered over the pool,
    as sequences that grew side by side hold them."""
    rng = random.Random(seed)
    contexts = sorted((rng.randint(low, high) for _ in range(batch)), reverse=True)
    needed = [-(-c // BLOCK_SIZE) for c in contexts]
    ids = list(range(1, 1 + sum(needed)))
    if shuffled:
        rng.shuffle(ids)
    tables, start = [], 0
    for n in needed:
        tables.append(ids[start : start + n])
        start += n
    shape = (1 + start, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k_cache, v_cache = torch.randn(shape).to(pool_dtype), torch.randn(shape).to(pool_dtype)
    fused = torch.randn(batch, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
    q, k, v = fused.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=1)
    views = q.view(batch, HEADS, HEAD_DIM), k.view(batch, KV_HEADS, HEAD_DIM)
    views += (v.view(batch, KV_HEADS, HEAD_DIM),)
    build = (torch.tensor(contexts) - 1, [1] * batch, contexts, tables, BLOCK_SIZE, "cpu")
    return (*views, k_cache, v_cache), build


def _cpu_clock(threads: int):
    return time.thread_time if threads == 1 else time.process_time


def layer(batches, threads_list, rounds: int, calls: int) -> list[dict]:
    rows = []
    for threads in threads_list:
        torch.set_num_threads(threads)
        clock = _cpu_clock(threads)
        for batch in batches:
            for label, (low, high) in CONTEXTS.items():
                tensors, build = layer_inputs(batch, low, high, seed=batch)
                meta = AttentionMetadata.build(*build)
                _ = meta.decode_groups  # the torch path's, built once a step, not per layer
                per_call = {name: [] for name in PATHS}
                loads = []
                for round_ in range(rounds):
                    for name in in_turn(PATHS, round_):
                        with _path(name), torch.inference_mode():
                            paged_attention(*tensors, meta)  # warm
                            started = clock()
                            for _ in range(calls):
                                paged_attention(*tensors, meta)
                            per_call[name].append((clock() - started) / calls)
                    loads.append(load_average_1m())
                us = {name: round(1e6 * statistics.median(v), 1) for name, v in per_call.items()}
                metadata = metadata_us(build, clock, rounds, calls)
                row = {"threads": threads, "batch": batch, "contexts": label, "cpu_us": us}
                row |= {"torch_over_native": round(us["torch"] / us["native"], 2)}
                row |= {"metadata_us": metadata, "load_average_1m": loads}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def metadata_us(build, clock, rounds: int, calls: int) -> dict:
    """A step's metadata build, without (native path) and with the decode groups (torch)."""
    times = {"native": [], "torch": []}
    for round_ in range(rounds):
        for name in in_turn(PATHS, round_):
            started = clock()
            for _ in range(calls):
                meta = AttentionMetadata.build(*build)
                if name == "torch":
                    _ = meta.decode_groups
            times[name].append((clock() - started) / calls)
    return {name: round(1e6 * statistics.median(v), 1) for name, v in times.items()}


def _smollm(threads: int):
    """The bundled model in float32 and its tokenizer, torch on `threads` threads."""
    from maas_services.common.model_files import default_model_path
    from maas_services.common.tokenizer_loader import load_tokenizer
    from maas_services.engine.loader import load_model

    torch.set_num_threads(threads)
    path = default_model_path()
    model, config = load_model(path, torch.float32, progress=False)
    return model, config, load_tokenizer(path)


def step(batches, prompt_len: int, steps: int, threads: int) -> list[dict]:
    model, config, tokenizer = _smollm(threads)
    clock = _cpu_clock(threads)
    rows = []
    for batch in batches:
        engine = decoding_engine(model, config, tokenizer, batch, prompt_len, 2 * steps)
        cpu = {name: [] for name in PATHS}
        loads = []
        for i in range(2 * steps):
            name = in_turn(PATHS, i // 2)[i % 2]
            with _path(name):
                started = clock()
                engine.step()
                cpu[name].append(clock() - started)
            if i % 8 == 0:
                loads.append(load_average_1m())
        ms = {name: round(1e3 * statistics.median(v), 2) for name, v in cpu.items()}
        row = {"threads": threads, "batch": batch, "prompt_len": prompt_len, "cpu_ms": ms}
        row |= {"native_over_torch": round(ms["native"] / ms["torch"], 3)}
        row |= {"load_average_1m": loads}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def pool(batches, prompt_len: int, steps: int, threads: int) -> list[dict]:
    from maas_services.common.machine_profile import machine_profile
    from maas_services.engine.machine_defaults import resolve
    from maas_services.engine.model_runner import choose_path
    from maas_services.engine.settings import EngineSettings

    model, config, tokenizer = _smollm(threads)
    wide_gemm = resolve(EngineSettings(), machine_profile(), False, os.environ).settings.wide_gemm
    serving = choose_path(model, compiled=False, native=True, wide_gemm=wide_gemm)
    pools = {"float32": torch.float32, "bf16": torch.bfloat16}
    rows = []
    for batch in batches:
        engines = {}
        for name, dtype in pools.items():
            engine = decoding_engine(model, config, tokenizer, batch, prompt_len, 2 * steps, dtype)
            engine.runner.path = serving
            engines[name] = engine
        walls = {name: [] for name in pools}
        loads = []
        for i in range(2 * steps):
            name = in_turn(pools, i // 2)[i % 2]
            started = time.perf_counter()
            engines[name].step()
            walls[name].append(time.perf_counter() - started)
            if i % 8 == 0:
                loads.append(load_average_1m())
        ms = {name: round(1e3 * statistics.median(v), 2) for name, v in walls.items()}
        row = {"threads": threads, "batch": batch, "prompt_len": prompt_len, "wide_gemm": wide_gemm}
        row |= {"wall_ms": ms, "float32_over_bf16": round(ms["float32"] / ms["bf16"], 3)}
        row |= {"load_average_1m": loads}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--section", choices=["layer", "step", "pool"], default="layer")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20, help="layer calls per round")
    parser.add_argument(
        "--prompt-len", type=int, default=200, help="step, pool: each stream's prompt"
    )
    parser.add_argument("--steps", type=int, default=20, help="step, pool: steps per path")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/attention.json"))
    args = parser.parse_args()
    assert bindings.library() is not None, "the native library did not build"
    result = {"machine": machine(), "args": vars(args) | {"output": str(args.output)}}
    if args.section == "layer":
        result["rows"] = layer(args.batches, args.threads, args.rounds, args.calls)
    elif args.section == "step":
        result["rows"] = step(args.batches, args.prompt_len, args.steps, args.threads[0])
    else:
        result["rows"] = pool(args.batches, args.prompt_len, args.steps, args.threads[-1])
    result["load_after"] = os.getloadavg()
    update_results(args.output, args.section, result)


if __name__ == "__main__":
    main()
