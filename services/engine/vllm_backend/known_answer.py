"""The vLLM backend's start-up known-answer check: vLLM's own prompt logprobs.

The adapter asks vLLM for the log-probability of every token of the known
texts (services/engine/known_answer.py), one /v1/completions call per text:
token ids in (the adapter already checked that vLLM's tokenizer is ours), one
token out, `prompt_logprobs: 0` (vLLM's extension: each prompt token's own
logprob, no alternatives). The score is then judged as the native engine's is.

One text per call, in turn: with --enable-lora, vLLM 0.32 maps LoRA slots to
prompt-logprob rows per sequence, not per token, and a step holding two
sequences' prompt logprobs kills its engine core (vllm-project/vllm#29955);
one sequence's mapping broadcasts over its rows. Nothing else runs at start.
"""

import asyncio

import httpx

from maas_services.common.model_files import resolve_model_path
from maas_services.common.text_tokenizer import TextTokenizer
from maas_services.engine.known_answer import Score, known_token_ids, score_of
from maas_services.engine.known_answer_check import judge_score
from maas_services.engine.settings import EngineSettings


async def score_vllm(client: httpx.AsyncClient, served_model: str, texts: list[list[int]]) -> Score:
    started = asyncio.get_running_loop().time()
    logprobs = []
    for ids in texts:
        body = {
            "model": served_model,
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": 0,
        }
        reply = (await client.post("/v1/completions", json=body)).raise_for_status().json()
        (choice,) = reply["choices"]
        # The first token has no logprob (None): it is context only.
        logprobs += [
            entry[str(token)]["logprob"]
            for token, entry in zip(ids[1:], choice["prompt_logprobs"][1:], strict=True)
        ]
    return score_of(logprobs, started, asyncio.get_running_loop().time())


async def check_vllm(
    client: httpx.AsyncClient, served_model: str, tokenizer: TextTokenizer, settings: EngineSettings
) -> str:
    """Why this vLLM server must not serve; empty when it passed (or --known-answer off)."""
    if settings.known_answer == "off":
        return ""
    score = await score_vllm(client, served_model, known_token_ids(tokenizer))
    # The reference may have to be computed first: our float32 model, seconds of torch.
    path = resolve_model_path(settings.model_path)
    verdict = await asyncio.to_thread(judge_score, score, settings, path, "vllm")
    return verdict.failure
