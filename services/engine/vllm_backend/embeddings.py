"""An embedding request over the vLLM backend: one /v1/embeddings call, token ids in.

A vLLM server runs its generation runner or its pooling runner, never both,
so an adapter with `--serves embed` fronts a vLLM started with its pooling
runner, pooling as the native engine does (services/common/serves.py
VLLM_POOLING_ARGS: the causal LM converted to an embedding model, last-token
pooling, L2-normalized; services/engine/embedding.py). The answer follows the native
engine's contract: one GenerateResponse with the vector, usage with no
completion tokens, finish "stop". `dimensions` is applied here, not by vLLM,
which refuses it for a model that does not declare Matryoshka dimensions:
the leading dimensions, renormalized (embedding_vector). The request carries
its prefix-cache salt as a generation request does (cache_salt.py).

vLLM's 4xx (a prompt over its context, ids out of its vocabulary) is
INVALID_ARGUMENT, and so is a `dimensions` above the model's; vLLM
unreachable or failing is UNAVAILABLE. The request is one HTTP call: a gRPC
client that goes away cancels it, which closes the connection vLLM reads it
on; the Abort RPC does not find it (it has no stream to end).
"""

import grpc
import httpx
import torch

from maas.v1 import engine_pb2
from maas_services.common.block_hash import request_salt
from maas_services.common.engine_metadata import SCHEDULED
from maas_services.engine.embedding import embedding_vector
from maas_services.engine.request import SeqOutput
from maas_services.engine.servicer import response_of, sampling_from_proto
from maas_services.engine.vllm_backend.cache_salt import SaltBook
from maas_services.engine.vllm_backend.completion_stream import (
    VllmRequestError,
    VllmUnavailable,
    refusal,
)


async def embed(
    client: httpx.AsyncClient, served_model: str, prompt_ids: list[int], cache_salt: str
) -> tuple[list[float], dict]:
    """vLLM's vector for the prompt, and its usage; raises VllmRequestError or VllmUnavailable."""
    body = {
        "model": served_model,
        "input": prompt_ids,
        "encoding_format": "float",
        "cache_salt": cache_salt,
    }
    try:
        response = await client.post("/v1/embeddings", json=body)
    except httpx.TransportError as exc:
        raise VllmUnavailable(f"vLLM /v1/embeddings failed: {exc!r}") from exc
    if response.status_code != 200:
        raise refusal(response.status_code, response.content)
    reply = response.json()
    return reply["data"][0]["embedding"], reply.get("usage") or {}


async def embedding_response(
    request: engine_pb2.GenerateRequest, context, info, client: httpx.AsyncClient, salts: SaltBook
) -> engine_pb2.GenerateResponse:
    """The one answer to an embedding Generate (info: the adapter's VllmInfo)."""
    params = sampling_from_proto(request.sampling, 0)
    salt = request_salt(
        info.cache_salt, info.prefix_cache_sharing, request.tenant, request.share_prefix_cache
    )
    prompt = list(request.prompt_token_ids)
    try:
        if not prompt:
            raise ValueError("prompt_token_ids is empty")
        vector, usage = await embed(client, info.served_model, prompt, salts.vllm_salt(salt))
        # Once vLLM answered: the vector's length is the bound on dimensions.
        params.validate(0, len(vector))
    except (ValueError, VllmRequestError) as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except VllmUnavailable as exc:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    await context.send_initial_metadata(SCHEDULED)
    prompt_tokens = usage.get("prompt_tokens") or len(prompt)
    details = usage.get("prompt_tokens_details") or {}
    output = SeqOutput(
        request_id=request.request_id,
        index=0,
        token_ids=[],
        text="",
        finish_reason="stop",
        prompt_tokens=prompt_tokens,
        completion_tokens=0,
        cached_prompt_tokens=details.get("cached_tokens") or 0,
        computed_prompt_tokens=prompt_tokens,
        embedding=embedding_vector(torch.tensor(vector), params.embedding),
    )
    return response_of(output, tokenizer=None)
