"""Multi-LoRA serving cost in one engine: `python -m benchmarks.lora_bench --output F`.

In this process (no gRPC, no core process), float32, the default SmolLM2:

- throughput: output tokens/s of 32 greedy streams spread over 8 adapters (4 each)
  against the same 32 streams on the base alone, both on the engine's path (native:
  the low-rank products in C++, native/lora.cpp), and the adapters' streams again on
  the eager path (the products in torch, lora/step_lora.py: what adapter steps ran
  before the native products, this change's A/B); after a warm-up run of each, in
  rounds whose order reverses every round (so a drift of the machine's load weighs on
  all alike), medians reported;
- time to first token for an adapter not yet loaded: load_adapter, then one request
  naming it, until its first token, against the same request on the base.

The adapters are random rank-8 PEFT folders on all seven projections (their effect
does not matter here, only their shapes), written to a temporary folder.
"""

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from benchmarks.machine import machine
from benchmarks.order import in_turn
from benchmarks.results_file import report
from maas_services.common.model_files import default_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.engine.compute_path import EAGER
from maas_services.engine.loader import load_model
from maas_services.engine.lora.adapter import PROJECTIONS, module_shapes
from maas_services.engine.model_config import ModelConfig
from maas_services.engine.offline import offline_engine
from maas_services.engine.sampling_params import SamplingParams


def write_adapter(folder: Path, config: ModelConfig, rank: int, seed: int) -> Path:
    """A PEFT LoRA folder with random weights on every projection."""
    generator = torch.Generator().manual_seed(seed)
    shapes = module_shapes(config)
    tensors = {}
    for layer in range(config.num_layers):
        for projection, (module, shard) in PROJECTIONS.items():
            in_features, outs = shapes[module]
            part = "self_attn" if module in ("qkv_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{projection}"
            tensors[f"{key}.lora_A.weight"] = 0.02 * torch.randn(
                rank, in_features, generator=generator
            )
            tensors[f"{key}.lora_B.weight"] = 0.02 * torch.randn(
                outs[shard], rank, generator=generator
            )
    folder.mkdir(parents=True)
    save_file(tensors, folder / "adapter_model.safetensors")
    peft = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(PROJECTIONS),
    }
    (folder / "adapter_config.json").write_text(json.dumps(peft))
    return folder


def run_streams(engine, prompts: list[list[int]], adapters: list[str], new_tokens: int) -> dict:
    """Every stream at once until all finish: output tokens/s over the whole run."""
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    started = time.perf_counter()
    for i, (prompt, adapter) in enumerate(zip(prompts, adapters, strict=True)):
        engine.add_request(f"r{i}", prompt, params, adapter=adapter)
    generated = 0
    while engine.has_work:
        generated += sum(len(out.token_ids) for out in engine.step())
    seconds = time.perf_counter() - started
    return {
        "output_tokens": generated,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(generated / seconds, 1),
    }


def first_token_seconds(engine, prompt: list[int], adapter: str, source: str | None) -> float:
    """From the load (when a source is given) to the request's first token."""
    started = time.perf_counter()
    if source is not None:
        engine.load_adapter(adapter, source)
    engine.add_request(
        f"ttft-{adapter}-{started}",
        prompt,
        SamplingParams(temperature=0, max_tokens=1),
        adapter=adapter,
    )
    while engine.has_work:
        if any(out.token_ids for out in engine.step()):
            break
    seconds = time.perf_counter() - started
    while engine.has_work:
        engine.step()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4, help="throughput runs of each kind")
    parser.add_argument("--ttft-rounds", type=int, default=5)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    model_path = default_model_path()
    model, config = load_model(model_path, torch.float32, progress=False)
    tokenizer = load_tokenizer(model_path)
    engine = offline_engine(
        model, config, tokenizer, args.streams, args.prompt_len + args.new_tokens + 16
    )
    rng = random.Random(0)
    prompts = [
        [rng.randrange(100, config.vocab_size) for _ in range(args.prompt_len)]
        for _ in range(args.streams)
    ]
    with tempfile.TemporaryDirectory() as scratch:
        names = [f"lora{i}" for i in range(args.adapters)]
        for i, name in enumerate(names):
            engine.load_adapter(name, str(write_adapter(Path(scratch, name), config, args.rank, i)))
        spread = [names[i % len(names)] for i in range(args.streams)]
        native_path = engine.runner.path

        def run_kind(kind: str) -> dict:
            engine.runner.path = EAGER if kind == "lora_eager" else native_path
            adapters = [""] * args.streams if kind == "base" else spread
            return run_streams(engine, prompts, adapters, args.new_tokens)

        kinds = ("base", "lora", "lora_eager")
        for kind in kinds:  # warm-up: first-call allocations, page faults
            run_kind(kind)
        runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
        for round_ in range(args.rounds):
            for kind in in_turn(kinds, round_):
                runs[kind].append(run_kind(kind))
        engine.runner.path = native_path

        cold, warm_base = [], []
        for i in range(args.ttft_rounds):
            name = f"cold{i}"
            source = str(write_adapter(Path(scratch, name), config, args.rank, 100 + i))
            cold.append(first_token_seconds(engine, prompts[i], name, source))
            warm_base.append(first_token_seconds(engine, prompts[i], "", None))
            engine.unload_adapter(name)

    def tokens_per_s(kind: str) -> float:
        return statistics.median(r["tokens_per_s"] for r in runs[kind])

    results = {
        "benchmark": "lora_bench",
        "machine": machine(),
        "compute_path": engine.runner.path.name,
        "settings": vars(args) | {"output": str(args.output) if args.output else None},
        "throughput": {
            "runs": runs,
            "base_tokens_per_s": tokens_per_s("base"),
            "lora_tokens_per_s": tokens_per_s("lora"),
            "lora_eager_tokens_per_s": tokens_per_s("lora_eager"),
            "lora_over_base": round(tokens_per_s("lora") / tokens_per_s("base"), 3),
            "lora_eager_over_base": round(tokens_per_s("lora_eager") / tokens_per_s("base"), 3),
        },
        "ttft_unloaded_adapter": {
            "load_and_first_token_s_p50": round(statistics.median(cold), 4),
            "base_first_token_s_p50": round(statistics.median(warm_base), 4),
            "rounds": len(cold),
        },
    }
    report(results, args.output)


if __name__ == "__main__":
    main()
