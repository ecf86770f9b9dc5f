"""Weight-only quantization against float32, in one run: `make bench-accel`, "quantization".

For float32, bfloat16 and each quantized variant of the bundled SmolLM2:
- weight memory of the quantized linear layers against the same layers in
  float32 and in bfloat16 (the issue's bars: int8 >= 1.9x, int4 >= 3.5x,
  checked against bfloat16, the stricter of the two);
- perplexity on the held-out text (tools/eval/data) and its delta
  against float32 (bar: int8 within 1%);
- decode tokens/s through the engine at batch 1 and a larger batch, and the
  speedup against float32 measured in the same run (the machines are shared
  and noisy: each number is the best of --repeats runs).

Every variant starts from one float32 load, so they all quantize the same
weights. The results go under the "quantization" key of --output, which
other accelerator benchmarks (speculative decoding) share: keys already in
the file are kept.
"""

import argparse
import copy
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from benchmarks.results_file import update_results
from maas_services.common.model_files import default_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.engine.kv_budget import model_bytes
from maas_services.engine.loader import load_model
from maas_services.engine.offline import offline_engine
from maas_services.engine.quantization.config import QuantizationConfig
from maas_services.engine.quantization.memory import quantized_weight_memory
from maas_services.engine.quantization.quantize import quantize_model
from maas_services.engine.sampling_params import SamplingParams
from maas_tools.eval.perplexity import DEFAULT_TEXT, perplexity

# name -> (quantization, activation dtype). bf16 is how an AMX/AVX512-BF16 CPU serves,
# float32 how an AVX2 CPU does (its bf16 matmuls are unusable): the float32 variants
# run cpu_kernel's AVX2 matmuls.
VARIANTS = {
    "float32": (QuantizationConfig("none"), torch.float32),
    "bfloat16": (QuantizationConfig("none"), torch.bfloat16),
    "int8": (QuantizationConfig("int8"), torch.bfloat16),
    "int8-float32": (QuantizationConfig("int8"), torch.float32),
    "int4-g64": (QuantizationConfig("int4", 64), torch.bfloat16),
    "int4-g128": (QuantizationConfig("int4", 128), torch.bfloat16),
    # Group 32 keeps the GGUF file's own Q4_1 blocks: no requantization at all.
    "int4-g32-gguf": (QuantizationConfig("int4", 32), torch.bfloat16),
    "int4-g32-gguf-float32": (QuantizationConfig("int4", 32), torch.float32),
    "int4-g64-float32": (QuantizationConfig("int4", 64), torch.float32),
    # The LM head left in float32, to measure what the int8 head buys.
    "int8-float32-float-head": (QuantizationConfig("int8", quantize_head=False), torch.float32),
    "int4-g32-gguf-float32-float-head": (
        QuantizationConfig("int4", 32, quantize_head=False),
        torch.float32,
    ),
}
BASELINE = "float32"
BARS = {"int8": 1.9, "int4-g64": 3.5, "int4-g128": 3.5}  # weight memory ratio vs bfloat16
INT8_MAX_DELTA_PCT = 1.0
SPEEDUPS = {"tokens_per_s": "speedup_vs_float32", "tokens_per_cpu_s": "cpu_speedup_vs_float32"}
QUESTION = "Tell me about the history of bread, part {}."


def decode_tokens_per_s(
    model, config, tokenizer, batch: int, new_tokens: int
) -> tuple[float, float]:
    """Decode tokens per second of wall time and of process CPU time, prefill excluded.

    CPU time holds better on shared cores: it does not count the time another
    process held the core (with one torch thread nothing else runs in parallel).
    """
    # 256 tokens a request: the prompt and what it decodes fit.
    engine = offline_engine(model, config, tokenizer, batch, 256)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    for i in range(batch):
        messages = [{"role": "user", "content": QUESTION.format(i)}]
        engine.add_request(str(i), tokenizer.encode_chat(messages), params)
    # The first step prefills every prompt (they fit the token budget) and samples
    # each one's first token; what follows is decoding only.
    engine.step()
    started, cpu_started = time.perf_counter(), time.process_time()
    while engine.has_work:
        engine.step()
    tokens = batch * (new_tokens - 1)
    return tokens / (time.perf_counter() - started), tokens / (time.process_time() - cpu_started)


def build_variant(name, float_model, ids, args):
    """The variant's model and everything measured about it but its speed."""
    quantization, dtype = VARIANTS[name]
    model = quantize_model(copy.deepcopy(float_model), quantization, dtype, source=args.model)
    result = {
        "quantization": quantization.describe(),
        "dtype": str(dtype).removeprefix("torch."),
        "model_bytes": model_bytes(model),
    }
    if quantization.enabled:
        memory = quantized_weight_memory(model)
        result["weight_memory"] = {
            "quantized_bytes": memory.quantized_bytes,
            "float32_bytes": memory.float32_bytes,
            "bfloat16_bytes": memory.bfloat16_bytes,
            "ratio_vs_float32": round(memory.ratio_vs_float32, 3),
            "ratio_vs_bfloat16": round(memory.ratio_vs_bfloat16, 3),
        }
    ppl = perplexity(model, ids, args.window)
    result["perplexity"] = round(ppl.perplexity, 4)
    result["perplexity_tokens"] = ppl.tokens
    return model, result


def time_variants(models: dict, config, tokenizer, args) -> dict:
    """Best wall and CPU tokens/s per variant and batch, the variants interleaved.

    Each repeat times every variant in turn, so a burst of load from another
    process lands on all of them rather than on whichever ran then.
    """
    wall = {name: {str(b): 0.0 for b in args.batches} for name in models}
    cpu = {name: {str(b): 0.0 for b in args.batches} for name in models}
    for _ in range(args.repeats):
        for batch in args.batches:
            for name, model in models.items():
                w, c = decode_tokens_per_s(model, config, tokenizer, batch, args.new_tokens)
                wall[name][str(batch)] = round(max(wall[name][str(batch)], w), 2)
                cpu[name][str(batch)] = round(max(cpu[name][str(batch)], c), 2)
    return {"tokens_per_s": wall, "tokens_per_cpu_s": cpu}


def summarize(variants: dict) -> dict:
    base = variants[BASELINE]
    for result in variants.values():
        result["perplexity_delta_pct"] = round(
            100 * (result["perplexity"] / base["perplexity"] - 1), 3
        )
        for key, speedup in SPEEDUPS.items():
            result[speedup] = {
                batch: round(tps / base[key][batch], 2) for batch, tps in result[key].items()
            }
    checks = {
        f"{name}_memory_ratio_vs_bfloat16_ge_{bar}": (
            variants[name]["weight_memory"]["ratio_vs_bfloat16"] >= bar
        )
        for name, bar in BARS.items()
        if name in variants
    }
    if "int8" in variants:
        checks["int8_perplexity_delta_le_1pct"] = (
            variants["int8"]["perplexity_delta_pct"] <= INT8_MAX_DELTA_PCT
        )
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/accel.json"))
    parser.add_argument("--model", type=Path, default=None, help="default: bundled SmolLM2")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=32, help="decoded per request")
    parser.add_argument("--repeats", type=int, default=2, help="best of this many timings")
    parser.add_argument("--ppl-tokens", type=int, default=1024)
    parser.add_argument("--window", type=int, default=512)
    # One thread: on shared cores a second OpenMP thread waits on a core another
    # process holds, and a decode step, a few hundred small matmuls, slows ~30x.
    parser.add_argument("--torch-threads", type=int, default=1, help="0: torch's default")
    args = parser.parse_args()
    load_before = os.getloadavg()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    args.model = args.model or default_model_path()
    names = [BASELINE, *(n for n in args.variants if n != BASELINE)]

    tokenizer = load_tokenizer(args.model)
    ids = tokenizer.encode(DEFAULT_TEXT.read_text(encoding="utf-8"))[: args.ppl_tokens]
    float_model, config = load_model(args.model, torch.float32, progress=False)
    models, variants = {}, {}
    for name in names:
        print(f"{name}...", flush=True)
        models[name], variants[name] = build_variant(name, float_model, ids, args)
    speeds = time_variants(models, config, tokenizer, args)
    for name, result in variants.items():
        result.update({key: per_variant[name] for key, per_variant in speeds.items()})
    section = {
        "command": "python -m benchmarks.quant_bench " + " ".join(sys.argv[1:]),
        "load_average_before": load_before,
        "model": str(args.model),
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "text": DEFAULT_TEXT.name,
        "window": args.window,
        "new_tokens": args.new_tokens,
        "baseline": BASELINE,
        "checks": summarize(variants),
        "variants": variants,
    }
    section["load_average_after"] = os.getloadavg()
    update_results(args.output, "quantization", section)
    print(json.dumps(section, indent=2))


if __name__ == "__main__":
    main()
