"""`maas eval perplexity`: the quality gate for quantization.

Loads the model once in float32, scores the held-out text, then quantizes the
same weights (or only casts them, with --quantization none) and scores it
again, and reports the perplexity delta against float32. Exits 1 when the
delta exceeds --max-delta (by default 1% for int8, the issue's bar; no limit
otherwise).
"""

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from maas_services.common.model_files import resolve_model_path
from maas_services.common.quantization_methods import QUANTIZATION_METHODS
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.engine.device import resolve_device, resolve_dtype
from maas_services.engine.loader import load_model
from maas_services.engine.quantization.config import GROUP_SIZES, QuantizationConfig
from maas_services.engine.quantization.memory import quantized_weight_memory
from maas_services.engine.quantization.quantize import quantize_model
from maas_tools.eval.perplexity import DEFAULT_TEXT, perplexity

# 1,024 tokens in windows of 512: the whole command takes about a minute on two
# shared cores (float32 int4 dequantizes every layer on every call: the slowest).
DEFAULT_MAX_TOKENS = 1024
DEFAULT_WINDOW = 512
INT8_MAX_DELTA_PCT = 1.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="maas eval", description="model quality checks")
    sub = parser.add_subparsers(dest="check", required=True)
    ppl = sub.add_parser(
        "perplexity",
        help="perplexity on held-out text, quantized or cast vs float32",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ppl.add_argument("--model", default="", help="GGUF file or HF folder (default: SmolLM2)")
    ppl.add_argument("--quantization", choices=QUANTIZATION_METHODS, default="none")
    ppl.add_argument("--group-size", type=int, choices=GROUP_SIZES, default=64, help="int4 only")
    ppl.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16", "auto"],
        default="float32",
        help="activation dtype of the evaluated model (the baseline is always float32)",
    )
    ppl.add_argument("--device", default="cpu", help="cpu, cuda[:N] or auto")
    ppl.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="UTF-8 text to score")
    ppl.add_argument(
        "--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="score the first N (0: all)"
    )
    ppl.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="tokens per window")
    ppl.add_argument(
        "--max-delta",
        type=float,
        default=None,
        help=f"fail above this perplexity delta in %% (default: {INT8_MAX_DELTA_PCT} for int8)",
    )
    ppl.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    ppl.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def run_perplexity(args: argparse.Namespace) -> dict:
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    path = resolve_model_path(args.model)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    quantization = QuantizationConfig(args.quantization, args.group_size)
    ids = load_tokenizer(path).encode(args.text.read_text(encoding="utf-8"))
    if args.max_tokens:
        ids = ids[: args.max_tokens]
    model, _ = load_model(path, torch.float32, device, progress=False)
    baseline = perplexity(model, ids, args.window, device)
    report = {
        "model": str(path),
        "text": str(args.text),
        "window": args.window,
        "baseline": {"dtype": "float32", **asdict(baseline)},
    }
    if not quantization.enabled and dtype == torch.float32:
        return report
    model = quantize_model(model, quantization, dtype, source=path)
    candidate = perplexity(model, ids, args.window, device)
    report["candidate"] = {
        "quantization": quantization.describe(),
        "dtype": str(dtype).removeprefix("torch."),
        **asdict(candidate),
    }
    report["delta_pct"] = 100 * (candidate.perplexity / baseline.perplexity - 1)
    if quantization.enabled:
        memory = quantized_weight_memory(model)
        report["weight_memory"] = {
            **asdict(memory),
            "ratio_vs_float32": memory.ratio_vs_float32,
            "ratio_vs_bfloat16": memory.ratio_vs_bfloat16,
        }
    return report


def _print_report(report: dict) -> None:
    base = report["baseline"]
    print(f"text      {report['text']}: {base['tokens']} tokens scored, window {report['window']}")
    print(f"float32   perplexity {base['perplexity']:.4f}  ({base['seconds']:.1f} s)")
    if "candidate" not in report:
        return
    cand = report["candidate"]
    print(
        f"{cand['quantization']} ({cand['dtype']})  perplexity {cand['perplexity']:.4f}  "
        f"({cand['seconds']:.1f} s)  delta {report['delta_pct']:+.3f}%"
    )
    if "weight_memory" in report:
        mem = report["weight_memory"]
        print(
            f"weights   {mem['quantized_bytes'] / 2**20:.1f} MiB in {mem['layers']} layers: "
            f"{mem['ratio_vs_float32']:.2f}x smaller than float32, "
            f"{mem['ratio_vs_bfloat16']:.2f}x than bfloat16"
        )


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    report = run_perplexity(args)
    limit = args.max_delta
    if limit is None and args.quantization == "int8":
        limit = INT8_MAX_DELTA_PCT
    passed = limit is None or report.get("delta_pct", 0.0) <= limit
    report["max_delta_pct"] = limit
    report["passed"] = passed
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report)
        if limit is not None:
            print(f"gate      delta <= {limit}%: {'pass' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
