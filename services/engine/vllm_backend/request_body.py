"""One maas.v1 GenerateRequest as the body of vLLM's POST /v1/completions.

The prompt goes as token ids, so vLLM computes exactly the tokens the router
hashed and the gateway bills. Every proto field that is zero means "unset"
(services/engine/servicer.py's sampling_from_proto), so each one is mapped
onto vLLM's value for "off" explicitly: vLLM's own defaults differ (an unset
temperature is 1.0 there, an unset max_tokens 16).

A migrated request (resume_token_ids, docs/gateway.md "Migration") is sent as
a completion of the prompt followed by its delivered tokens, for what is left
of max_tokens and min_tokens. vLLM has no way to take tokens as already
generated, so the guarantee is weaker than the native engine's: the result is
a valid continuation, the same tokens only for a greedy request (a seeded one
draws a new sequence from its seed; penalties count only the new output). A
request vLLM cannot continue correctly at all is refused (ResumeRefused): one
with a grammar (vLLM would start the grammar over in the middle of its output)
or stop strings (the failed replica's text held back for a possible stop, and
a stop split by the cut, would be lost).
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


class ResumeRefused(ValueError):
    """This backend cannot continue the migrated request; the message says why."""


def completion_body(
    request: engine_pb2.GenerateRequest, served_model: str, max_model_len: int, cache_salt: str
) -> dict:
    """`cache_salt` is what vLLM is given for the request's salt (cache_salt.py).

    Raises GrammarError (a ValueError) for a grammar that cannot be used, and
    ResumeRefused for a migrated request vLLM cannot continue (module docstring)."""
    p = request.sampling
    prompt = list(request.prompt_token_ids)
    resumed = len(request.resume_token_ids)
    if resumed and (p.HasField("grammar") or p.stop):
        raise ResumeRefused("the vLLM backend does not resume a request with a grammar or stops")
    max_tokens = p.max_tokens or default_max_tokens(max_model_len, len(prompt))
    if resumed >= max_tokens:
        raise ResumeRefused(f"{resumed} resume tokens leave nothing of max_tokens {max_tokens}")
    body = {
        # vLLM runs a request with the adapter it names as its model.
        "model": request.adapter or served_model,
        "prompt": prompt + list(request.resume_token_ids),
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
        "max_tokens": max_tokens - resumed,
        "min_tokens": max(p.min_tokens - resumed, 0),
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
