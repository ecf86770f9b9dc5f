"""Two builds of the native kernels in one process, alternating, on SmolLM2's weights.

`python -m benchmarks.library_ab --base HEAD~1 --rows 16 32 64 --weights bf16`

A change to a kernel is measured against the revision before it without two
processes (a shared 2-core host drifts by 10-20% between runs, more than such
a change): the base revision's `kernels/native` sources are compiled with this
CPU's flags into a temporary folder, both shared objects are loaded side by
side, and each pass multiplies every weight the engine's native path multiplies
by (native_layers.Native: SmolLM2's 30 layers' four projections and, where native,
its tied head) at `--rows` rows through `weight_linear`, the builds alternating
ABBA over `--rounds` pairs of passes on the same activations. Reported per row
count: the median ms a pass of each build, base over this tree (> 1: this tree is
faster), and whether both gave the same bits. `--weights` picks the path:
`float32` (the float32 weights), `bf16` (their bf16 copies: the avx512_bf16
class's wide steps) or `checkpoint` (that class's default: the GGUF's blocks,
interleaved, on int16 activations up to BF16_BLOCKS_ROWS rows, the bf16 copies
above); at the engine's row-kernel crossover and panel size, on `--threads`
threads. The base is called through this tree's `weight_linear` signature and
`NativeWeight` layout (bindings.py), so it must share them.

`--attention CONTEXT` times the paged decode attention instead: a pass is SmolLM2's
30 layers' calls (each its own pools, `--kv-cache-dtype` entries, blocks shuffled:
attention_bench's layer inputs) for `--rows` decodes of CONTEXT positions each,
through native_attention's own call.
"""

import argparse
import ctypes
import statistics
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path

import torch

from benchmarks.attention_bench import layer_inputs
from benchmarks.machine import machine
from benchmarks.results_file import report
from maas_kernels.native import bindings
from maas_kernels.native import library as native
from maas_services.common.machine_profile import machine_profile
from maas_services.common.model_files import default_model_path
from maas_services.engine import native_attention, native_layers
from maas_services.engine.attention_metadata import AttentionMetadata
from maas_services.engine.loader import load_model
from maas_services.engine.quantization import cpu_kernel
from maas_services.engine.quantization.checkpoint_blocks import checkpoint_blocks

REPOSITORY = Path(__file__).resolve().parent.parent


def base_library(revision: str, folder: Path) -> ctypes.CDLL:
    """revision's kernels compiled with this CPU's flags into folder, loaded, with
    weight_linear bound as this tree declares it."""
    archive = subprocess.run(
        ["git", "archive", revision, "kernels/native"],
        cwd=REPOSITORY,
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    compiler = native.find_compiler()
    if compiler is None:
        raise SystemExit("no C++ compiler (set CXX or install g++)")
    target = folder / "base.so"
    sources = tuple(sorted((folder / "kernels" / "native").glob("*.cpp")))
    native.build(target, compiler, native.build_flags(machine_profile().flags), sources)
    lib = ctypes.CDLL(str(target))
    for name in ("weight_linear", "paged_attention_decode"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = bindings.SIGNATURES[name]
    return lib


def native_path(weights: str) -> tuple[torch.nn.Module, native_layers.Native]:
    """SmolLM2 and the engine's native path over it for --weights (which keeps its
    weights alive)."""
    path = default_model_path()
    model = load_model(path, dtype=torch.float32, progress=False)[0]
    checkpoint = weights == "checkpoint"
    return model, native_layers.Native(
        model,
        "library_ab",
        wide_gemm="float32" if weights == "float32" else "bf16",
        blocks=checkpoint_blocks(model, path) if checkpoint else None,
        blocks_int16=checkpoint,
    )


def linear_pass(weights: list, rows: int, threads: int) -> Callable[[ctypes.CDLL], list]:
    """A pass of every weight over the same rows of activations, by a given build."""
    generator = torch.Generator().manual_seed(rows)
    xs = [torch.randn(rows, w.k, generator=generator) for w in weights]
    outputs = {}  # each build's own, allocated once (outside the timing)

    def run(lib: ctypes.CDLL) -> list:
        if id(lib) not in outputs:
            outputs[id(lib)] = [torch.empty(rows, w.n) for w in weights]
        outs = outputs[id(lib)]
        for weight, x, out in zip(weights, xs, outs, strict=True):
            lib.weight_linear(
                ctypes.addressof(weight),
                x.data_ptr(),
                rows,
                weight.k,
                out.data_ptr(),
                cpu_kernel.MAX_ROW_KERNEL_ROWS,
                cpu_kernel.PANEL_BYTES,
                threads,
            )
        return outs

    return run


def attention_pass(
    layers: int, decodes: int, context: int, pool_dtype: torch.dtype
) -> Callable[[ctypes.CDLL], list]:
    """A step's decode attention over layers layers (each its own pools and shuffled
    tables: attention_bench's layer inputs) for decodes sequences of context positions,
    by a given build (on torch's thread count)."""
    calls = []
    for layer in range(layers):
        tensors, build = layer_inputs(
            decodes, context, context, seed=layer, pool_dtype=pool_dtype, shuffled=True
        )
        calls.append((tensors, AttentionMetadata.build(*build)))

    def run(lib: ctypes.CDLL) -> list:
        return [
            native_attention.store_and_attend(*tensors, meta, library=lib)
            for tensors, meta in calls
        ]

    return run


def compare(builds: dict[str, ctypes.CDLL], one_pass: Callable, rounds: int) -> dict:
    """Passes of "base" and "this", alternating ABBA: the median ms of each, base over
    this, and whether both gave the same bits."""
    times, outs = {name: [] for name in builds}, {}
    for round_ in range(rounds + 1):
        for name in ("base", "this") if round_ % 2 == 0 else ("this", "base"):
            start = time.perf_counter()
            outs[name] = one_pass(builds[name])
            if round_:  # the first round warms both
                times[name].append((time.perf_counter() - start) * 1e3)
    base_ms, this_ms = (statistics.median(times[name]) for name in ("base", "this"))
    return {
        "base_ms": round(base_ms, 2),
        "this_ms": round(this_ms, 2),
        "base_over_this": round(base_ms / this_ms, 3),
        "same_bits": all(map(torch.equal, outs["base"], outs["this"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", required=True, help="the git revision to compare against")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--weights", choices=("float32", "bf16", "checkpoint"), default="bf16")
    parser.add_argument(
        "--attention",
        type=int,
        metavar="CONTEXT",
        help="time decode attention over CONTEXT positions (--rows decodes), not the weights",
    )
    parser.add_argument(
        "--kv-cache-dtype", choices=("float32", "bf16"), default="bf16", help="--attention's pools"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        builds = {"base": base_library(args.base, Path(folder)), "this": bindings.library()}
        model, compute_path = native_path(args.weights)  # it keeps the weights alive
        weights = compute_path.weights()
        torch.set_num_threads(args.threads)
        pool_dtype = torch.bfloat16 if args.kv_cache_dtype == "bf16" else torch.float32
        rows_results = {}
        for rows in args.rows:
            if args.attention:
                layers = model.config.num_layers
                one_pass = attention_pass(layers, rows, args.attention, pool_dtype)
            else:
                one_pass = linear_pass(weights, rows, args.threads)
            rows_results[rows] = compare(builds, one_pass, args.rounds)
            print(rows, rows_results[rows], flush=True)
    report(
        {
            "machine": machine(),
            "args": vars(args) | {"output": str(args.output)},
            "rows": rows_results,
        },
        args.output,
    )


if __name__ == "__main__":
    main()
