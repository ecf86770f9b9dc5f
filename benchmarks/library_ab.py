"""Two builds of the native kernels in one process, alternating, on SmolLM2's weights.

`python -m benchmarks.library_ab --base HEAD~1 --rows 16 32 64 --weights bf16`

A change to a kernel is measured against the revision before it without two
processes (a shared 2-core host drifts by 10-20% between runs, more than such
a change): the base revision's `kernels/native` sources are compiled with this
CPU's flags into a temporary folder, both shared objects are loaded side by
side, and each pass multiplies every projection of the model and its tied
head (the 121 weights the GGUF has blocks for) at `--rows` rows through
`weight_linear`, the builds alternating ABBA over `--rounds` pairs of passes on
the same activations. Reported per row count: the median ms a pass of each
build, base over this tree (> 1: this tree is faster), and whether both gave
the same bits. `--weights bf16` multiplies by each weight's bf16 copy (the
avx512_bf16 class's wide steps), `float32` by the float32 weights, `cols8` by the
GGUF's blocks laid out 8 output rows a vector on activations rounded to int16 (that
class's narrow steps, native_layers._cols8); at the engine's row-kernel crossover
and panel size, on `--threads` threads. The base
is called through this tree's `weight_linear` signature and `NativeWeight`
layout (bindings.py), so it must share them.
"""

import argparse
import ctypes
import statistics
import subprocess
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import torch

from benchmarks.machine import machine
from benchmarks.results_file import report
from maas_kernels.native import bindings
from maas_kernels.native import library as native
from maas_services.common.machine_profile import machine_profile
from maas_services.common.model_files import default_model_path
from maas_services.engine import native_layers
from maas_services.engine.loader import load_model
from maas_services.engine.quantization import cpu_kernel
from maas_services.engine.quantization.checkpoint_blocks import (
    EVERY_STEP,
    CheckpointBlock,
    checkpoint_blocks,
)
from maas_services.engine.quantization.int4 import Int4Weight

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
    lib.weight_linear.argtypes, lib.weight_linear.restype = bindings.SIGNATURES["weight_linear"]
    return lib


def native_weight(w: torch.Tensor, bf16: bool, kept: list) -> bindings.Weight:
    """A float32 weight [n, k] as a NativeWeight, with its bf16 copy where bf16; the tensors
    it points into join kept."""
    n, k = w.shape
    copy = w.to(torch.bfloat16) if bf16 else None
    kept += [w, copy]
    bf16_address = 0 if copy is None else copy.data_ptr()
    return bindings.Weight(
        bindings.FLOAT32, w.data_ptr(), 0, 0, 0, 0, n, k, 0, int(bf16), bf16_address
    )


def cols8_weight(block: CheckpointBlock, kept: list) -> bindings.Weight:
    """A checkpoint block in the interleaved int16 layout, as _keep_blocks points a weight
    of the avx512_bf16 class at it."""
    if isinstance(block, Int4Weight):
        n, k = block.packed.shape[0], 2 * block.packed.shape[1]
    else:
        n, k = block.q.shape
    described = bindings.Weight(*native_layers._cols8(block, kept), 0, n, k)
    described.integer_rows, described.integer16 = EVERY_STEP, 1
    return described


def model_weights(weights: str, kept: list) -> list[bindings.Weight]:
    """The model's 121 block-backed weights (30 layers' projections and the tied head)."""
    path = default_model_path()
    model = load_model(path, dtype=torch.float32, progress=False)[0]
    blocks = checkpoint_blocks(model, path)
    if weights == "cols8":
        return [cols8_weight(block, kept) for block in blocks.values()]
    return [
        native_weight(module.weight.detach().contiguous(), weights == "bf16", kept)
        for module in blocks
    ]


def one_pass(lib: ctypes.CDLL, weights: list, rows: int, xs: list, outs: list, threads: int):
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


def compare(
    builds: dict[str, ctypes.CDLL], weights: list, rows: int, rounds: int, threads: int
) -> dict:
    """Passes of "base" and "this" over weights at rows rows, alternating ABBA: the median
    ms of each, base over this, and whether both gave the same bits."""
    generator = torch.Generator().manual_seed(rows)
    xs = [torch.randn(rows, w.k, generator=generator) for w in weights]
    outs = {name: [torch.empty(rows, w.n) for w in weights] for name in builds}
    times = {name: [] for name in builds}
    for round_ in range(rounds + 1):
        for name in ("base", "this") if round_ % 2 == 0 else ("this", "base"):
            start = time.perf_counter()
            one_pass(builds[name], weights, rows, xs, outs[name], threads)
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
    parser.add_argument("--weights", choices=("float32", "bf16", "cols8"), default="bf16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    kept: list = []
    with tempfile.TemporaryDirectory() as folder:
        builds = {"base": base_library(args.base, Path(folder)), "this": bindings.library()}
        weights = model_weights(args.weights, kept)
        rows_results = {}
        for rows in args.rows:
            rows_results[rows] = compare(builds, weights, rows, args.rounds, args.threads)
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
