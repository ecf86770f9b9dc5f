"""What sampling costs a decode step: the engine's sampler against the textbook one.

`python -m benchmarks.sampler_bench` takes SmolLM2's own next-token logits
(transformers generating --rows sampled answers to chat prompts, --steps
tokens each, every position's logits kept), then times one sampler call per
step over all rows, for each sampling setting, at the engine's thread count:

- `sampler`: services/engine/sampler.Sampler, as the engine calls it;
- `textbook`: the same settings the way transformers and the engine before
  it did them, per row: top-p from a sort of the whole vocabulary, the token
  from torch.multinomial (one exponential draw per token).

Milliseconds per step (median over the steps), each row its own request with
its own generator, as in a real batch. Greedy is there for scale: its rows
never reach either path's per-row work.

With --baseline DIR (a tree of another revision, e.g. `git archive REV | tar
-x -C DIR`), that tree's services/engine/sampler.py is timed too, step by
step in turn with this one's on seeded requests, and the tokens the two drew
are compared: `baseline`, `baseline_over_sampler`, `same_tokens`.
"""

import argparse
import dataclasses
import importlib.util
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.engine_bench import TOPICS, chat_prompt
from benchmarks.hf_static import left_padded, load_hf_model
from benchmarks.machine import machine
from benchmarks.order import in_turn
from benchmarks.results_file import report
from maas_services.common.model_files import default_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.engine.sampler import Sampler, make_generator
from maas_services.engine.sampling_params import SamplingParams

SETTINGS = {
    "greedy": SamplingParams(temperature=0),
    "temperature_1": SamplingParams(),  # OpenAI's default
    "top_p_0.9": SamplingParams(top_p=0.9),
    "top_p_0.95_temperature_0.8": SamplingParams(top_p=0.95, temperature=0.8),
    "top_k_50": SamplingParams(top_k=50),
    "top_p_0.9_min_p_0.05": SamplingParams(top_p=0.9, min_p=0.05),
    "top_k_50_top_p_0.9": SamplingParams(top_k=50, top_p=0.9),
}


@dataclass
class Request:
    params: SamplingParams
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    generator: torch.Generator = field(default_factory=lambda: make_generator(None))
    grammar: None = None


def model_logits(rows: int, steps: int) -> list[torch.Tensor]:
    """[rows, vocab] float32 logits for each of `steps` sampled positions."""
    path = default_model_path()
    tokenizer = load_tokenizer(path)
    model = load_hf_model(path, torch.float32, torch.device("cpu"))
    prompts = [
        chat_prompt(tokenizer, f"Tell me a story about {TOPICS[i % 8]}.") for i in range(rows)
    ]
    ids, mask = left_padded(prompts)
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=True,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return [step.float().clone() for step in out.logits]


def textbook(logits: torch.Tensor, requests: list[Request]) -> list[int]:
    """Per row: temperature, top-k, top-p by a full sort, then torch.multinomial."""
    tokens = []
    for row, request in zip(logits, requests, strict=True):
        params = request.params
        if params.temperature == 0:
            tokens.append(int(row.argmax()))
            continue
        row = row / params.temperature
        if params.top_k:
            row[row < row.topk(params.top_k).values[-1]] = float("-inf")
        if params.top_p < 1:
            ranked, order = row.sort(descending=True)
            probs = ranked.softmax(-1)
            row[order[probs.cumsum(-1) - probs >= params.top_p]] = float("-inf")
        probs = row.softmax(-1)
        tokens.append(int(torch.multinomial(probs, 1, generator=request.generator)))
    return tokens


def time_steps(sample, steps: list[torch.Tensor], params: SamplingParams) -> float:
    """Median ms of one call over a step's rows."""
    requests = [Request(params) for _ in range(len(steps[0]))]
    took = []
    for logits in steps:
        started = time.perf_counter()
        sample(logits, requests)
        took.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(took), 3)


def baseline_sampler(tree: Path):
    """Another revision's Sampler class, from its tree."""
    spec = importlib.util.spec_from_file_location(
        "baseline_sampler", tree / "services" / "engine" / "sampler.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Sampler


def time_beside(sampler, baseline, steps: list[torch.Tensor], params: SamplingParams) -> dict:
    """Median ms of each sampler's call, in turn per step, on seeded requests (each
    sampler its own, with the same seeds), and the share of tokens both drew alike."""
    rows = len(steps[0])

    def seeded() -> list[Request]:
        return [
            Request(dataclasses.replace(params, seed=row), generator=make_generator(row))
            for row in range(rows)
        ]

    took: dict[str, list[float]] = {"sampler": [], "baseline": []}
    same = 0
    for i, logits in enumerate(steps):
        tokens = {}
        for name in in_turn(("sampler", "baseline"), i):
            sample = sampler if name == "sampler" else baseline
            requests = seeded()
            for request in requests:
                request.output_ids = [0] * i  # the position: a seeded draw depends on it
            started = time.perf_counter()
            tokens[name] = sample(logits, requests)
            took[name].append((time.perf_counter() - started) * 1000)
        same += sum(a == b for a, b in zip(tokens["sampler"], tokens["baseline"], strict=True))
    ms = {name: round(statistics.median(values), 3) for name, values in took.items()}
    return ms | {
        "baseline_over_sampler": round(ms["baseline"] / ms["sampler"], 2),
        "same_tokens": f"{same}/{rows * len(steps)}",
    }


def run(args) -> dict:
    torch.manual_seed(0)
    steps = model_logits(args.rows, args.steps)
    torch.set_num_threads(args.threads)
    sampler = Sampler(eos_token_ids=[])
    results = {}
    baseline = args.baseline and baseline_sampler(args.baseline)(eos_token_ids=[])
    for name, params in SETTINGS.items():
        if baseline:
            ms = time_beside(sampler, baseline, steps, params)
        else:
            ms = {"sampler": time_steps(sampler, steps, params)}
        ms["textbook"] = time_steps(textbook, steps, params)
        ms["textbook_over_sampler"] = round(ms["textbook"] / ms["sampler"], 2)
        results[name] = ms
    return {
        "machine": machine(),
        "command": "python -m benchmarks.sampler_bench "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "output" and v is not None),
        "rows": args.rows,
        "steps": args.steps,
        "threads": args.threads,
        "ms_per_step": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=32, help="requests sampled in one step")
    parser.add_argument("--steps", type=int, default=64, help="positions generated per row")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, as the engine's")
    parser.add_argument(
        "--baseline", type=Path, help="a tree of another revision whose sampler is timed beside"
    )
    parser.add_argument("--output", type=Path, help="write the JSON here too")
    args = parser.parse_args()
    report(run(args), args.output)


if __name__ == "__main__":
    main()
