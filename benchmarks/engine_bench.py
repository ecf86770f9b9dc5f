"""Engine benchmarks for the engine-core issue: `make bench-engine`.

All in one run, in the serving default dtype, as ratios against baselines
measured in the same run (the machines are shared and noisy):
- continuous batching vs transformers' static batching (batches of 8 and 32);
- P99 inter-token latency of running decodes while a long prompt arrives,
  with and without chunked prefill;
- TTFT of a request whose long prefix is in the prefix cache vs the first;
- achieved FLOP/s of a batch-64 decode step vs this machine's matmul peak.
Writes JSON and a PNG of the main numbers.
"""

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

import torch

from benchmarks.hf_static import load_hf_model, static_tokens_per_s
from maas_services.common.model_files import default_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.engine.device import resolve_device, resolve_dtype
from maas_services.engine.engine_config import build_configs
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.llm_engine import LLMEngine
from maas_services.engine.loader import load_model
from maas_services.engine.model_runner import ModelRunner
from maas_services.engine.sampling_params import SamplingParams
from maas_services.engine.settings import EngineSettings

TOPICS = ["rivers", "volcanoes", "bread", "chess", "jazz", "bees", "glaciers", "trains"]


def chat_prompt(tokenizer, question: str) -> list[int]:
    return tokenizer.encode_chat([{"role": "user", "content": question}])


def make_engine(model, config, tokenizer, dtype, device, num_blocks=4096, **settings) -> LLMEngine:
    """An engine over a pool of num_blocks, set up by EngineSettings fields."""
    engine, config = build_configs(EngineSettings(**settings), config, num_blocks)
    cache = PagedKVCache.allocate(config, num_blocks, engine.block_size, dtype, device)
    return LLMEngine(engine, config, ModelRunner(model, config, cache, device), tokenizer)


def drain(engine: LLMEngine) -> dict[str, list[float]]:
    """Step until idle; token arrival times per request."""
    arrivals: dict[str, list[float]] = {}
    while engine.has_work:
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            if out.token_ids:
                arrivals.setdefault(out.request_id, []).append(now)
    return arrivals


def matmul_peak(dtype: torch.dtype, device: torch.device, size: int = 4096) -> float:
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    torch.mm(a, b)
    best = 0.0
    for _ in range(3):
        started = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2 * size**3 / (time.perf_counter() - started))
    return best


def bench_continuous_vs_static(model, config, tokenizer, hf_model, dtype, device, n: int) -> dict:
    rng = random.Random(0)
    prompts = [
        chat_prompt(tokenizer, f"Tell me about {TOPICS[i % 8]}, part {i}.") for i in range(n)
    ]
    lengths = [rng.randint(16, 256) for _ in range(n)]
    engine = make_engine(
        model, config, tokenizer, dtype, device, max_num_seqs=n, max_num_batched_tokens=2048
    )
    started = time.perf_counter()
    for i, (prompt, length) in enumerate(zip(prompts, lengths, strict=True)):
        engine.add_request(
            f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=length, ignore_eos=True)
        )
    drain(engine)
    ours = sum(lengths) / (time.perf_counter() - started)
    result = {"requests": n, "output_tokens": sum(lengths), "continuous_tokens_per_s": ours}
    for batch in (8, 32):
        static = static_tokens_per_s(hf_model, prompts, lengths, batch, device)
        result[f"static_batch_{batch}_tokens_per_s"] = static
        result[f"speedup_vs_static_{batch}"] = ours / static
    return result


def bench_chunked_prefill(model, config, tokenizer, dtype, device, long_tokens: int) -> dict:
    long_prompt = [tokenizer.encode(" river")[0]] * long_tokens
    result = {"long_prompt_tokens": long_tokens, "decodes": 16}
    # Unchunked, the budget fits the decodes and the whole prompt, so the prompt
    # is admitted at once and runs in one step (what engines without chunked
    # prefill do); the decodes wait for that step.
    unchunked_budget = long_tokens + 64
    for label, chunked, budget in (("chunked", True, 512), ("unchunked", False, unchunked_budget)):
        engine = make_engine(
            model,
            config,
            tokenizer,
            dtype,
            device,
            max_num_seqs=32,
            max_num_batched_tokens=budget,
            enable_chunked_prefill=chunked,
        )
        for i in range(16):
            engine.add_request(
                f"d{i}",
                chat_prompt(tokenizer, f"Count slowly, run {i}."),
                SamplingParams(temperature=0, max_tokens=200, ignore_eos=True),
            )
        arrivals: dict[str, list[float]] = {}
        for _ in range(20):  # the decodes are running
            for out in engine.step():
                arrivals.setdefault(out.request_id, []).append(time.perf_counter())
        arrived = time.perf_counter()
        engine.add_request("long", long_prompt, SamplingParams(temperature=0, max_tokens=8))
        for rid, times in drain(engine).items():
            arrivals.setdefault(rid, []).extend(times)
        prefilled = arrivals["long"][0]
        # The window that matters: from the long prompt's arrival to its first
        # token, every gap of a running decode that overlaps it.
        gaps = sorted(
            b - a
            for rid, t in arrivals.items()
            if rid != "long"
            for a, b in zip(t, t[1:], strict=False)
            if b > arrived and a < prefilled
        )
        result[f"{label}_itl_p99_s"] = gaps[int(0.99 * (len(gaps) - 1))]
        result[f"{label}_itl_p50_s"] = statistics.median(gaps)
        result[f"{label}_long_prompt_ttft_s"] = prefilled - arrived
    result["p99_itl_ratio_unchunked_over_chunked"] = (
        result["unchunked_itl_p99_s"] / result["chunked_itl_p99_s"]
    )
    return result


def bench_prefix_cache(model, config, tokenizer, dtype, device, prefix_tokens: int) -> dict:
    engine = make_engine(model, config, tokenizer, dtype, device, max_num_batched_tokens=2048)
    words = " ".join(f"fact {i}: the {TOPICS[i % 8]} are lovely." for i in range(prefix_tokens))
    prefix = tokenizer.encode(words)[:prefix_tokens]

    def ttft(request_id: str, question: str) -> float:
        started = time.perf_counter()
        engine.add_request(
            request_id,
            prefix + tokenizer.encode(question),
            SamplingParams(temperature=0, max_tokens=1),
        )
        drain(engine)
        return time.perf_counter() - started

    first = ttft("first", " What is fact 3?")
    second = ttft("second", " What is fact 7?")
    return {
        "prefix_tokens": prefix_tokens,
        "first_ttft_s": first,
        "cached_ttft_s": second,
        "ttft_ratio": first / second,
    }


def bench_efficiency(model, config, tokenizer, dtype, device, peak: float) -> dict:
    engine = make_engine(
        model, config, tokenizer, dtype, device, max_num_seqs=64, max_num_batched_tokens=8192
    )
    for i in range(64):
        engine.add_request(
            f"e{i}",
            chat_prompt(tokenizer, f"Describe {TOPICS[i % 8]} {i}."),
            SamplingParams(temperature=0, max_tokens=200, ignore_eos=True),
        )
    engine.step()  # prefill everything
    for _ in range(5):
        engine.step()
    steps, started = 20, time.perf_counter()
    for _ in range(steps):
        engine.step()
    step_s = (time.perf_counter() - started) / steps
    contexts = [s.num_tokens for s in engine.scheduler.running]
    linear = (
        sum(
            p.numel()
            for name, p in model.named_parameters()
            if p.dim() == 2 and "embed" not in name
        )
        + config.vocab_size * config.hidden_size
    )
    attention = sum(
        4 * ctx * config.num_heads * config.head_dim * config.num_layers for ctx in contexts
    )
    flops = 2 * linear * len(contexts) + attention
    return {
        "batch": len(contexts),
        "mean_context": statistics.fmean(contexts),
        "step_s": step_s,
        "tokens_per_s": len(contexts) / step_s,
        "achieved_flops": flops / step_s,
        "matmul_peak_flops": peak,
        "fraction_of_peak": flops / step_s / peak,
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    cs = results["continuous_vs_static"]
    axes[0].bar(
        ["maas continuous", "HF static 8", "HF static 32"],
        [
            cs["continuous_tokens_per_s"],
            cs["static_batch_8_tokens_per_s"],
            cs["static_batch_32_tokens_per_s"],
        ],
        color=["tab:green", "tab:gray", "tab:gray"],
    )
    axes[0].set_title(f"Output tokens/s, {cs['requests']} requests")
    cp = results["chunked_prefill"]
    axes[1].bar(
        ["chunked", "unchunked"],
        [cp["chunked_itl_p99_s"] * 1e3, cp["unchunked_itl_p99_s"] * 1e3],
        color=["tab:green", "tab:gray"],
    )
    axes[1].set_title(f"P99 ITL (ms), 16 decodes + {cp['long_prompt_tokens']}-token prompt")
    pc = results["prefix_cache"]
    axes[2].bar(
        ["first", "prefix cached"],
        [pc["first_ttft_s"] * 1e3, pc["cached_ttft_s"] * 1e3],
        color=["tab:gray", "tab:green"],
    )
    axes[2].set_title(f"TTFT (ms), {pc['prefix_tokens']}-token shared prefix")
    fig.suptitle(f"maas engine, {results['dtype']} on {results['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/engine.json"))
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--long-prompt", type=int, default=4000)
    parser.add_argument("--prefix", type=int, default=2000)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()

    device = resolve_device("auto")
    dtype = resolve_dtype(args.dtype, device)
    path = default_model_path()
    model, config = load_model(path, dtype=dtype, device=device, progress=False)
    tokenizer = load_tokenizer(path)
    # transformers computes GGUF checkpoints in float32 (its fastest path for them).
    hf_model = load_hf_model(path, torch.float32, device)
    peak = matmul_peak(dtype, device)
    results = {
        "benchmark": "engine",
        "command": "make bench-engine",
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "matmul_peak_flops": peak,
        "matmul_peak_float32_flops": matmul_peak(torch.float32, device),
    }
    print("continuous vs static batching...", flush=True)
    results["continuous_vs_static"] = bench_continuous_vs_static(
        model, config, tokenizer, hf_model, dtype, device, args.requests
    )
    print("chunked prefill...", flush=True)
    results["chunked_prefill"] = bench_chunked_prefill(
        model, config, tokenizer, dtype, device, args.long_prompt
    )
    print("prefix cache...", flush=True)
    results["prefix_cache"] = bench_prefix_cache(
        model, config, tokenizer, dtype, device, args.prefix
    )
    print("efficiency...", flush=True)
    results["efficiency"] = bench_efficiency(model, config, tokenizer, dtype, device, peak)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.output.with_suffix(".png"))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
