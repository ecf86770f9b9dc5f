"""The float32 reference the start-up known-answer check compares with (known_answer.py).

The platform's float32 path is our model in float32 on the CPU with torch's own
ops: no native layers, no quantization, no compile; the path tests hold against
transformers. It scores the known texts once per model and the answer is kept
beside the model, in the model cache folder keyed by the model file's identity
(services/common/model_cache.py), with the digest of the texts it scored: a
new model file or new texts compute it again. Two replicas starting at once may
both compute it; each publishes whole with an atomic rename.

Where the reference comes from is the engine's --known-answer setting:
"cache" (this module: read, else compute and keep), a number (a ModelDeployment
gives it: a cluster's pods need not load a float32 copy of a large model),
"bound" (none: the sanity bound) or "off".
"""

import json
import sys
from pathlib import Path

import torch

from maas_services.common.logging import get_logger
from maas_services.common.model_cache import derived_folder, publish
from maas_services.common.model_files import resolve_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.engine.known_answer import TEXTS_DIGEST, known_token_ids, score_native
from maas_services.engine.loader import load_model

log = get_logger(__name__)

CACHE_FILE = "known-answer.json"


def cached_reference(model_path: Path) -> float | None:
    try:
        kept = json.loads((derived_folder(model_path) / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return float(kept["perplexity"]) if kept.get("texts") == TEXTS_DIGEST else None


def compute_reference(model_path: Path) -> float:
    """Score the known texts on the float32 torch path, and keep the answer beside the model."""
    model, _ = load_model(model_path, torch.float32, "cpu", progress=False)
    score = score_native(model, known_token_ids(load_tokenizer(model_path)))
    kept = {"texts": TEXTS_DIGEST, "perplexity": score.perplexity, "tokens": score.tokens}
    publish(
        derived_folder(model_path),
        CACHE_FILE,
        lambda path: path.write_text(json.dumps(kept, indent=2)),
    )
    log.info(
        "known_answer_reference_computed",
        model=str(model_path),
        perplexity=round(score.perplexity, 4),
        tokens=score.tokens,
        seconds=round(score.seconds, 3),
    )
    return score.perplexity


def reference(setting: str, model_path: Path) -> float | None:
    """The reference perplexity --known-answer names; None: judge by the sanity bound."""
    if setting == "bound":
        return None
    if setting != "cache":
        return float(setting)
    return cached_reference(model_path) or compute_reference(model_path)


def main(argv: list[str] | None = None) -> int:
    """`python -m maas_services.engine.known_answer_reference [MODEL]`: print the reference
    (e.g. for a ModelDeployment's engine.knownAnswerPerplexity)."""
    args = sys.argv[1:] if argv is None else argv
    print(reference("cache", resolve_model_path(args[0] if args else None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
