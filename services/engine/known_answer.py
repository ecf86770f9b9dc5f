"""The start-up known-answer check: a replica computes a known answer before it serves.

A backend can load a model and still compute it wrongly on some CPU: vLLM
0.32's eager bf16 path answers nonsense on an AMX Xeon while its /health says
200 (issue #32). So every engine replica, native or vLLM, scores a few fixed
texts before it reports ready: the perplexity of KNOWN_TEXTS (each text one
sequence, every token after the first predicted from those before it, the
token-weighted mean over all texts) must be within `tolerance` of the
reference the platform's float32 path computed for the same model
(known_answer_reference.py). Where no reference can be had (a cluster whose
ModelDeployment gives none), the perplexity must be below SANITY_BOUND, which
catches a backend that computes garbage, not one a few per cent off.

A replica that fails stays NOT_SERVING and says why (its log, its load
report). How each backend scores the texts: score_native here (the serving
model's own forward and compute path, native layers, quantization and all), and
services/engine/vllm_backend/known_answer.py (vLLM's prompt logprobs).

Tolerance (--known-answer-tolerance, relative), measured on SmolLM2-135M
(docs/engine.md, "Start-up known-answer check"): against the float32 torch
reference, float32 with native layers is 0.00% off, bf16 +0.54%, int8
-0.93%, int4 from the file's own blocks (group 32) -0.14%, vLLM's float32
0.00% and its bf16 +1.07%; noise of 3% of each weight's spread gives +7.5%,
of 10% +195%. The default 5% passes every right configuration with over 4x
room and fails the 3% noise. Quantization is opt-in and serves other
weights: int4 requantized at groups of 64 or 128 (a second rounding of the
4-bit file) scores +89% and +74%, so an engine quantized at load is allowed
QUANTIZED_TOLERANCE; garbage is still far beyond it.
"""

import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from maas_services.common.text_tokenizer import TextTokenizer
from maas_services.engine.compute_path import EAGER, ComputePath
from maas_services.engine.model import LlamaForCausalLM
from maas_services.engine.scoring import window_logits

# Three kinds of text, ~230 SmolLM2 tokens in all: a prefill of tens of ms on a
# 135M model. Public-domain prose (the opening of the Gettysburg Address),
# plain facts, and code.
KNOWN_TEXTS = (
    "Four score and seven years ago our fathers brought forth on this continent, a new "
    "nation, conceived in Liberty, and dedicated to the proposition that all men are "
    "created equal. Now we are engaged in a great civil war, testing whether that nation, "
    "or any nation so conceived and so dedicated, can long endure.",
    "Paris is the capital and the largest city of France. It stands on the river Seine, in "
    "the north of the country. Water boils at one hundred degrees Celsius at sea level and "
    "freezes at zero. A week has seven days, and a year has twelve months.",
    "def fibonacci(n):\n"
    '    """Return the n-th Fibonacci number."""\n'
    "    a, b = 0, 1\n"
    "    for _ in range(n):\n"
    "        a, b = b, a + b\n"
    "    return a\n",
)
# Names the texts in a cached reference: new texts make every cached one stale.
TEXTS_DIGEST = hashlib.sha256("\0".join(KNOWN_TEXTS).encode()).hexdigest()[:16]
# Without a reference: SmolLM2-135M, about the weakest model served, scores
# 8.3 on these texts; a model that computes garbage scores hundreds or more.
SANITY_BOUND = 40.0
# The least tolerance of an engine whose weights were quantized at load, so are not the
# reference's; one that serves the checkpoint's own blocks as they are
# (quantize.holds_checkpoint_weights) holds the reference's weights and is judged as float32.
QUANTIZED_TOLERANCE = 1.5


@dataclass(frozen=True)
class Score:
    perplexity: float
    tokens: int  # tokens scored (each text's first is context only)
    seconds: float


@dataclass(frozen=True)
class Verdict:
    perplexity: float
    # None: judged against SANITY_BOUND.
    reference: float | None
    # Empty when it passed; else why the replica must not serve.
    failure: str

    @property
    def passed(self) -> bool:
        return not self.failure


def known_token_ids(tokenizer: TextTokenizer) -> list[list[int]]:
    return [tokenizer.encode(text) for text in KNOWN_TEXTS]


def score_of(token_logprobs: Sequence[float], started: float, ended: float) -> Score:
    """The texts' perplexity from the log-probability of every scored token."""
    nll = -math.fsum(token_logprobs)
    count = len(token_logprobs)
    return Score(math.exp(nll / count), count, ended - started)


@torch.inference_mode()
def score_native(
    model: LlamaForCausalLM,
    texts: list[list[int]],
    device: torch.device | str = "cpu",
    path: ComputePath = EAGER,
    kv_dtype: torch.dtype | None = None,
) -> Score:
    """Score the texts with `model`'s own forward through the engine's compute path: one
    prefill each over a fresh KV pool of the serving pool's dtype (tools/eval/perplexity.py),
    so the serving pool is left untouched."""
    started = time.perf_counter()
    logprobs: list[float] = []
    for ids in texts:
        logits = window_logits(model, ids, device, path, kv_dtype)[:-1].float().log_softmax(-1)
        targets = torch.tensor(ids[1:], device=logits.device)
        logprobs += logits.gather(1, targets[:, None]).squeeze(1).tolist()
    return score_of(logprobs, started, time.perf_counter())


def judge(perplexity: float, reference: float | None, tolerance: float) -> Verdict:
    """Pass within `tolerance` (relative) of the reference, or below SANITY_BOUND without one."""
    if reference is None:
        if perplexity < SANITY_BOUND:  # False for NaN too
            return Verdict(perplexity, None, "")
        why = (
            f"known-answer perplexity {perplexity:.3f} is not below the sanity bound "
            f"{SANITY_BOUND:g} (no float32 reference for this model)"
        )
        return Verdict(perplexity, None, why)
    off = perplexity / reference - 1
    if abs(off) <= tolerance:  # False for NaN too
        return Verdict(perplexity, reference, "")
    why = (
        f"known-answer perplexity {perplexity:.3f} is {off:+.1%} off the float32 "
        f"reference {reference:.3f} (tolerance {tolerance:.0%}): this backend computes "
        "the model wrongly on this machine"
    )
    return Verdict(perplexity, reference, why)
