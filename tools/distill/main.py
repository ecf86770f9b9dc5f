"""`maas distill-draft`: a draft model for speculative decoding, made from the target.

1. The target writes passages on varied topics, then summaries, rewrites and
   edits of them (prompts.py), through the engine with continuous batching.
2. A small Llama with the target's vocabulary (student.py) learns those
   sequences (train.py).
3. The draft is saved as a Hugging Face folder that `maas serve engine
   --speculative-method draft --speculative-draft-model DIR` loads, with
   distill.json beside it: what was done, how long it took, and the draft's
   agreement with the target on held-out answers.

The generated text is kept in DIR/data.json and reused when the generation
flags match, so trying another draft shape costs only the training.
"""

import argparse
import dataclasses
import json
import random
import time
from pathlib import Path

import torch

from maas_services.common.model_files import default_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.engine.checkpoint import save_model
from maas_services.engine.device import resolve_dtype
from maas_services.engine.loader import load_model
from maas_services.engine.offline import generate, offline_engine
from maas_services.engine.sampling_params import SamplingParams
from maas_tools.distill.prompts import edit_prompts, passage_prompts
from maas_tools.distill.student import StudentShape, init_student, student_config
from maas_tools.distill.train import TrainConfig, agreement, pack, train

DEFAULT_OUTPUT = Path(".maas/drafts/smollm2-135m-draft")
HELD_OUT = 0.1  # share of passages kept out of training to measure agreement


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="maas distill-draft", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="", help="target GGUF or HF folder (default: bundled)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    data = parser.add_argument_group("the target's text")
    data.add_argument("--passages", type=int, default=64)
    data.add_argument("--edits-per-passage", type=int, default=3)
    data.add_argument("--passage-tokens", type=int, default=120)
    data.add_argument("--edit-tokens", type=int, default=160)
    data.add_argument("--batch", type=int, default=48, help="sequences generated at once")
    data.add_argument("--regenerate", action="store_true", help="ignore DIR/data.json")
    shape = parser.add_argument_group("the draft")
    for field in dataclasses.fields(StudentShape):
        shape.add_argument(f"--{field.name.replace('_', '-')}", type=int, default=field.default)
    training = parser.add_argument_group("training")
    for field in dataclasses.fields(TrainConfig):
        if field.name != "seed":
            flag = f"--{field.name.replace('_', '-')}"
            training.add_argument(flag, type=type(field.default), default=field.default)
    return parser


def make_data(args, model, config, tokenizer) -> dict:
    """Prompt and answer token ids of every sequence the target wrote."""
    engine = offline_engine(model, config, tokenizer, args.batch, 512)
    prompts: list[list[int]] = []

    def answer(texts: list[str], max_tokens: int, temperature: float, label: str):
        ids = [tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
        prompts.extend(ids)
        # Each request its own seed: the data does not depend on batch composition.
        params = [
            SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=args.seed + i)
            for i in range(len(texts))
        ]
        return generate(engine, ids, params, progress=label)

    # Passages sampled, for variety; edits greedy, as latency-sensitive traffic mostly is.
    passages = answer(
        passage_prompts(args.passages, args.seed),
        args.passage_tokens,
        0.8,
        "The target writes passages",
    )
    edits = answer(
        edit_prompts([tokenizer.decode(p) for p in passages], args.edits_per_passage, args.seed),
        args.edit_tokens,
        0.0,
        "The target edits them",
    )
    return {"params": generation_params(args), "prompts": prompts, "answers": passages + edits}


def split_by_passage(count: int, args) -> tuple[list[int], list[int]]:
    """Held-out and training sequence indices, whole passages (and their edits) apart.

    An edit repeats its passage, so splitting sequence by sequence would score
    the draft on text it learned by heart.
    """
    passages = list(range(args.passages))
    random.Random(args.seed).shuffle(passages)
    held_passages = set(passages[: max(1, int(len(passages) * HELD_OUT))])

    def passage_of(index: int) -> int:
        # Sequences are the passages in order, then each passage's edits together.
        if index < args.passages:
            return index
        return (index - args.passages) // args.edits_per_passage

    held = [i for i in range(count) if passage_of(i) in held_passages]
    return held, [i for i in range(count) if passage_of(i) not in held_passages]


def generation_params(args) -> dict:
    names = ("model", "seed", "passages", "edits_per_passage", "passage_tokens", "edit_tokens")
    return {name: getattr(args, name) for name in names}


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    path = Path(args.model) if args.model else default_model_path()
    started = time.perf_counter()
    target, config = load_model(path, resolve_dtype("auto", torch.device("cpu")))
    tokenizer = load_tokenizer(path)
    data_file = args.output / "data.json"
    data = json.loads(data_file.read_text()) if data_file.exists() else {}
    if args.regenerate or data.get("params") != generation_params(args):
        data = make_data(args, target, config, tokenizer)
        args.output.mkdir(parents=True, exist_ok=True)
        data_file.write_text(json.dumps(data))
    generated = time.perf_counter()

    sequences = [p + a for p, a in zip(data["prompts"], data["answers"], strict=True)]
    starts = [len(p) for p in data["prompts"]]
    held, kept = split_by_passage(len(sequences), args)
    shape = StudentShape(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(StudentShape)}
    )
    training = TrainConfig(
        seed=args.seed,
        **{
            f.name: getattr(args, f.name)
            for f in dataclasses.fields(TrainConfig)
            if f.name != "seed"
        },
    )
    draft = init_student(target, student_config(config, shape), args.seed)
    # Each sequence ends with the end-of-turn token, as the chat template would close it.
    end = [config.eos_token_id] if config.eos_token_id is not None else []
    losses = train(draft, pack([sequences[i] + end for i in kept], training.window), training)
    trained = time.perf_counter()

    held_agreement = agreement(draft, [sequences[i] for i in held], [starts[i] for i in held])
    report = {
        "target": str(path),
        "draft": dataclasses.asdict(shape),
        "draft_parameters": sum(p.numel() for p in draft.parameters()),
        "target_parameters": sum(p.numel() for p in target.parameters()),
        "training": dataclasses.asdict(training),
        "sequences": {"train": len(kept), "held_out": len(held)},
        "train_tokens": sum(len(sequences[i]) for i in kept),
        "generation_seconds": round(generated - started, 1),
        "training_seconds": round(trained - generated, 1),
        "loss": {
            "first": round(losses[0], 3),
            "last_10_mean": round(sum(losses[-10:]) / len(losses[-10:]), 3),
        },
        "held_out_top1_agreement": round(held_agreement, 4),
    }
    save_model(draft, args.output, {"draft_of": str(path)})
    (args.output / "distill.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(f"wrote {args.output}")
    return 0
