"""Compile seconds and peak memory of grammars against what cost.py counts in them.

Each grammar compiles in a fresh worker (services/common/grammar/worker.py),
the way the tokenizer and the engine compile, against SmolLM2's vocabulary,
with the cost caps lifted so the over-cap shapes are measured too. Prints a
markdown table (docs/structured-outputs.md, "Cost caps") and the worker's
start-up cost.

    nice .venv/bin/python -m benchmarks.grammar_cost_bench
"""

import json
import os
import time

from benchmarks.structured_schemas import SCHEMAS
from maas_services.common.grammar import cost
from maas_services.common.grammar.spec import GrammarSpec
from maas_services.common.grammar.vocab import tokenizer_info
from maas_services.common.grammar.worker import GrammarWorker, WorkerLimits
from maas_services.common.model_files import default_model_path
from maas_services.common.tokenizer_loader import load_tokenizer

CLASS = '[^"\\nab]'


def repeated(rules: int, low: int, high: int, item: str = CLASS) -> str:
    body = [f"r{i} ::= {item}{{{low},{high}}}" for i in range(rules)]
    return "root ::= " + " ".join(f"r{i}" for i in range(rules)) + "\n" + "\n".join(body)


def shapes() -> list[tuple[str, GrammarSpec]]:
    attack = GrammarSpec("ebnf", repeated(10, 4, 128))
    out = [("the issue's attack: 10 x [^\"\\nab]{4,128}", attack)]
    for rules, high in ((1, 64), (1, 256), (1, 1024), (4, 128), (8, 128), (16, 64), (32, 32)):
        spec = GrammarSpec("ebnf", repeated(rules, 0, high))
        out.append((f'{rules} x [^"\\nab]{{0,{high}}}', spec))
    for rules, high in ((8, 128), (64, 16)):
        spec = GrammarSpec("ebnf", repeated(rules, 0, high, "[a-z]"))
        out.append((f"{rules} x [a-z]{{0,{high}}}", spec))
    classes = GrammarSpec("ebnf", repeated(256, 1, 1, "[a-z] [0-9] [A-Z] [_-]"))
    out.append(("256 rules of 4 classes", classes))
    out.append(("regex [a-z]{0,512}", GrammarSpec("regex", "[a-z]{0,512}")))
    long_string = json.dumps({"type": "string", "maxLength": 1000})
    out.append(("schema: string maxLength 1000", GrammarSpec("json_schema", long_string)))
    for i, (_, schema) in enumerate(SCHEMAS):
        out.append((f"benchmark schema {i}", GrammarSpec("json_schema", json.dumps(schema))))
    return out


def main() -> None:
    info_json = tokenizer_info(load_tokenizer(default_model_path())).serialize_json()
    # No caps, no deadline: the point is to see what the caps must refuse.
    lifted = cost.CostCaps(rules=1 << 30, classes=1 << 30, repeat_bound=1 << 30)
    limits = WorkerLimits(deadline_s=600, memory_bytes=8 << 30, caps=lifted)
    print(f"TokenizerInfo JSON: {len(info_json) / 1e6:.1f} MB")
    print("| grammar | chars | rules | classes | repeat bound | CPU s | wall s | peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, spec in shapes():
        worker = GrammarWorker(info_json, limits)
        started = time.perf_counter()
        worker.start()
        start_s = time.perf_counter() - started
        measured = cost.measure(cost.parse(spec))
        started = time.perf_counter()
        answer = worker.compile(spec)
        wall = time.perf_counter() - started
        rss = _peak_rss_mb(worker._process)
        print(
            f"| {name} | {len(spec.text)} | {measured.rules} | {measured.classes} | "
            f"{measured.repeat_bound} | {answer.cpu_seconds:.2f} | {wall:.2f} | {rss} |"
        )
    print(f"worker start-up (spawn, import, vocabulary): {start_s:.2f} s wall")


def _peak_rss_mb(process) -> int:
    """The child's peak resident set, from the kernel once it has exited."""
    process.stdin.close()
    _, _, usage = os.wait4(process.pid, 0)
    process.returncode = 0
    process.stdout.close()
    return usage.ru_maxrss >> 10


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
