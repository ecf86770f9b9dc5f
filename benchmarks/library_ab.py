"""Two builds of the native kernels in one process, alternating, on SmolLM2's weights.

`python -m benchmarks.library_ab --base HEAD~1 --rows 16 32 64 --wide-gemm bf16`

A change to a kernel is measured against the revision before it without two
processes (a shared 2-core host drifts by 10-20% between runs, more than such
a change): the base revision's `kernels/native` sources are compiled with this
CPU's flags into a temporary folder, both shared objects are loaded side by
side, and each pass multiplies every projection of the model and its tied
head (the 121 weights the GGUF has blocks for) at `--rows` rows through
`weight_linear`, the builds alternating ABBA over `--rounds` pairs of passes on
the same activations. Reported per row count: the median ms a pass of each
build, base over this tree (> 1: this tree is faster), and whether both gave
the same bits. `--wide-gemm bf16` multiplies by each weight's bf16 copy (the
avx512_bf16 class's wide steps), `float32` by the float32 weights; both at the
engine's row-kernel crossover and panel size, on `--threads` threads.
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
from maas_services.engine.loader import load_model
from maas_services.engine.quantization import cpu_kernel
from maas_services.engine.quantization.checkpoint_blocks import checkpoint_blocks

REPOSITORY = Path(__file__).resolve().parent.parent


def base_library(revision: str, folder: Path) -> Path:
    """revision's kernels compiled with this CPU's flags, into folder."""
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
    return target


def model_weights(wide_gemm: str) -> tuple[list[tuple[bindings.Weight, int, int]], list]:
    """The model's 121 block-backed weights as NativeWeights (float32, with a bf16 copy
    for bf16), and the tensors they point into."""
    path = default_model_path()
    model = load_model(path, dtype=torch.float32, progress=False)[0]
    kept, weights = [], []
    for module in checkpoint_blocks(model, path):
        w = module.weight.detach().contiguous()
        n, k = w.shape
        copy = w.to(torch.bfloat16) if wide_gemm == "bf16" else None
        kept += [w, copy]
        described = bindings.Weight(
            bindings.FLOAT32,
            w.data_ptr(),
            0,
            0,
            0,
            0,
            n,
            k,
            0,
            int(copy is not None),
            0 if copy is None else copy.data_ptr(),
        )
        weights.append((described, n, k))
    return weights, kept


def one_pass(lib: ctypes.CDLL, weights: list, rows: int, xs: list, outs: list, threads: int):
    for (weight, _, k), x, out in zip(weights, xs, outs, strict=True):
        lib.weight_linear(
            ctypes.addressof(weight),
            x.data_ptr(),
            rows,
            k,
            out.data_ptr(),
            cpu_kernel.MAX_ROW_KERNEL_ROWS,
            cpu_kernel.PANEL_BYTES,
            threads,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", required=True, help="the git revision to compare against")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--wide-gemm", choices=("float32", "bf16"), default="bf16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        builds = {
            "base": bindings.bind(ctypes.CDLL(str(base_library(args.base, Path(folder))))),
            "this": bindings.library(),
        }
        weights, _kept = model_weights(args.wide_gemm)
        rows_results = {}
        for rows in args.rows:
            generator = torch.Generator().manual_seed(rows)
            xs = [torch.randn(rows, k, generator=generator) for _, _, k in weights]
            outs = {name: [torch.empty(rows, n) for _, n, _ in weights] for name in builds}
            times = {name: [] for name in builds}
            for round_ in range(args.rounds + 1):
                order = ("base", "this") if round_ % 2 == 0 else ("this", "base")
                for name in order:
                    start = time.perf_counter()
                    one_pass(builds[name], weights, rows, xs, outs[name], args.threads)
                    if round_:  # the first round warms both
                        times[name].append((time.perf_counter() - start) * 1e3)
            base_ms, this_ms = (statistics.median(times[name]) for name in ("base", "this"))
            same = all(map(torch.equal, outs["base"], outs["this"]))
            rows_results[rows] = {
                "base_ms": round(base_ms, 2),
                "this_ms": round(this_ms, 2),
                "base_over_this": round(base_ms / this_ms, 3),
                "same_bits": same,
            }
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
