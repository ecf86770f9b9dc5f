"""Structured-output benchmark (#19): `make bench-structured`.

- Output tokens/s of a 32-stream greedy batch where half the requests carry a
  JSON schema, against the same batch with no schema (target: at most 10%
  slower). The schema's one string must be longer than max_tokens allows, so
  every row, constrained or free, produces exactly max_tokens tokens and the
  two runs do the same model work; the difference is the grammar's cost
  (mask fill, mask apply, matcher advance). Runs alternate, free then
  constrained, `--repeats` pairs after a full-size warm-up pair; the figure
  is the median of the pairs' ratios (a pair shares the machine's load of
  the moment), and the process CPU time per output token is reported too,
  which a shared machine disturbs less than wall time.
- Compile time of the twenty test schemas (benchmarks/structured_schemas.py)
  on a fresh compiler (cold) and again (cached), plus building the
  vocabulary's tokenizer info once.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.engine_bench import chat_prompt, drain, make_engine
from benchmarks.machine import cpu_model, load_average_1m
from benchmarks.structured_schemas import SCHEMAS
from maas_services.common.grammar.compiler import GrammarCompiler
from maas_services.common.grammar.spec import GrammarSpec
from maas_services.common.grammar.vocab import tokenizer_info
from maas_services.common.model_files import default_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.engine.device import resolve_device, resolve_dtype
from maas_services.engine.loader import load_model
from maas_services.engine.sampling_params import SamplingParams

LONG_TEXT = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 2000, "maxLength": 4000}},
    "required": ["story"],
}


def batch_tokens_per_s(
    engine, tokenizer, streams: int, max_tokens: int, constrained: bool
) -> tuple[float, float]:
    """(output tokens per wall second, process CPU milliseconds per output token)."""
    for i in range(streams):
        grammar = (
            GrammarSpec("json_schema", json.dumps(LONG_TEXT)) if constrained and i % 2 else None
        )
        params = SamplingParams(
            temperature=0, max_tokens=max_tokens, ignore_eos=True, grammar=grammar
        )
        engine.add_request(f"r{i}", chat_prompt(tokenizer, f"Tell story {i} as JSON."), params)
    started, cpu = time.perf_counter(), time.process_time()
    arrivals = drain(engine)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    produced = sum(len(times) for times in arrivals.values())
    assert produced == streams * max_tokens, produced
    return produced / elapsed, 1000 * cpu / produced


def compile_times(tokenizer, vocab_size: int) -> dict:
    started = time.perf_counter()
    info = tokenizer_info(tokenizer, vocab_size)
    info_s = time.perf_counter() - started
    compiler = GrammarCompiler(info)
    specs = [GrammarSpec("json_schema", json.dumps(schema)) for _, schema in SCHEMAS]
    passes = []
    for _ in range(2):
        started = time.perf_counter()
        for spec in specs:
            compiler.compile(spec)
        passes.append(time.perf_counter() - started)
    return {
        "tokenizer_info_seconds": round(info_s, 3),
        "schemas": len(specs),
        "cold_total_ms": round(passes[0] * 1000, 2),
        "cached_total_ms": round(passes[1] * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--output", type=Path, default=Path("benchmarks/results/structured_output.json")
    )
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()

    device = resolve_device("auto")
    dtype = resolve_dtype(args.dtype, device)
    path = default_model_path()
    tokenizer = load_tokenizer(path)
    model, config = load_model(path, dtype=dtype, device=device, progress=False)
    compiled = compile_times(tokenizer, config.vocab_size)
    engine = make_engine(
        model,
        config,
        tokenizer,
        dtype,
        device,
        max_num_seqs=args.streams,
        max_num_batched_tokens=2048,
    )
    engine.grammar_compiler()  # built once at start, as the server does
    runs: dict[str, list[tuple[float, float]]] = {"free": [], "half_constrained": []}
    for repeat in range(args.repeats + 1):
        for name, constrained in (("free", False), ("half_constrained", True)):
            run = batch_tokens_per_s(engine, tokenizer, args.streams, args.max_tokens, constrained)
            if repeat:  # the first pair warms up, at full size
                runs[name].append(run)
    ratios = [m[0] / f[0] for f, m in zip(runs["free"], runs["half_constrained"], strict=True)]
    free = statistics.median(tok_s for tok_s, _ in runs["free"])
    mixed = statistics.median(tok_s for tok_s, _ in runs["half_constrained"])
    cpu_free = statistics.median(ms for _, ms in runs["free"])
    cpu_mixed = statistics.median(ms for _, ms in runs["half_constrained"])
    result = {
        "machine": {
            "cpu": cpu_model(),
            "threads": torch.get_num_threads(),
            "device": str(device),
            "dtype": str(dtype),
            # Shared machines: a load above the core count makes the ratio noisy.
            "load_average_1m_at_end": load_average_1m(),
        },
        "batch": {
            "streams": args.streams,
            "constrained_streams": args.streams // 2,
            "max_tokens": args.max_tokens,
            "free_output_tok_s_median": round(free, 1),
            "half_constrained_output_tok_s_median": round(mixed, 1),
            "slowdown_percent": round(100 * (1 - statistics.median(ratios)), 1),
            "target_slowdown_percent": 10,
            "pair_slowdowns_percent": [round(100 * (1 - r), 1) for r in ratios],
            "cpu_ms_per_token_median": {"free": round(cpu_free, 2), "half": round(cpu_mixed, 2)},
            "cpu_slowdown_percent": round(100 * (cpu_mixed / cpu_free - 1), 1),
            "runs_tok_s": {k: [round(v[0], 1) for v in vs] for k, vs in runs.items()},
        },
        "compile": compiled,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
