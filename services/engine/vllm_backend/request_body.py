"""One maas.v1 GenerateRequest as the body of vLLM's POST /v1/completions.

The prompt goes as token ids, so vLLM computes exactly the tokens the router
hashed and the gateway bills. Every proto field that is zero means "unset"
(services/engine/servicer.py's sampling_from_proto), so each one is mapped
onto vLLM's value for "off" explicitly: vLLM's own defaults differ (an unset
temperature is 1.0 there, an unset max_tokens 16).
"""

import json

from maas.v1 import engine_pb2
from maas_services.common.defaults import default_max_tokens
from maas_services.common.grammar.proto import grammar_from_proto
from maas_services.common.grammar.spec import GrammarSpec


def structured_outputs(spec: GrammarSpec) -> dict:
    """vLLM's `structured_outputs` for our grammar kinds (vLLM also compiles with xgrammar)."""
    spec.check()
    if spec.kind == "json_schema":
        return {"json": json.loads(spec.text)}
    if spec.kind == "json_object":
        return {"json_object": True}
    if spec.kind == "regex":
        return {"regex": spec.text}
    if spec.kind == "choice":
        return {"choice": spec.choices()}
    return {"grammar": spec.text}


def completion_body(
    request: engine_pb2.GenerateRequest, served_model: str, max_model_len: int, cache_salt: str
) -> dict:
    """`cache_salt` is what vLLM is given for the request's salt (cache_salt.py).

    Raises GrammarError (a ValueError) for a grammar that cannot be used."""
    p = request.sampling
    prompt = list(request.prompt_token_ids)
    body = {
        "model": served_model,
        "prompt": prompt,
        "stream": True,
        "stream_options": {"include_usage": True},
        # Token ids of every delta, and logprob tokens as "token_id:N", so no
        # id is recovered by re-tokenizing text.
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "cache_salt": cache_salt,
        "temperature": p.temperature,
        "top_p": p.top_p or 1.0,
        "top_k": p.top_k,
        "min_p": p.min_p,
        "repetition_penalty": p.repetition_penalty or 1.0,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "stop": list(p.stop),
        "stop_token_ids": list(p.stop_token_ids),
        "max_tokens": p.max_tokens or default_max_tokens(max_model_len, len(prompt)),
        "min_tokens": p.min_tokens,
        "ignore_eos": p.ignore_eos,
        "n": p.n or 1,
    }
    if p.HasField("seed"):
        body["seed"] = p.seed
    if p.logprobs:
        body["logprobs"] = p.top_logprobs
    if p.HasField("grammar"):
        body["structured_outputs"] = structured_outputs(grammar_from_proto(p.grammar))
    return body
