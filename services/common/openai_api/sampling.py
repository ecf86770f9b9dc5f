"""OpenAI request fields -> the engine's SamplingParams.

Unset fields take OpenAI's defaults (temperature 1, top_p 1), not greedy.
"""

from maas.v1 import engine_pb2
from maas_services.common.openai_api.schemas import SamplingFields


def to_engine_sampling(req: SamplingFields) -> engine_pb2.SamplingParams:
    params = engine_pb2.SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=max(req.top_k or 0, 0),
        min_p=req.min_p or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        stop=req.stop_list,
        max_tokens=req.max_tokens or 0,
        min_tokens=req.min_tokens or 0,
        ignore_eos=req.ignore_eos,
        speculative=req.speculative,
        n=req.n,
        logprobs=req.top_logprobs_count is not None,
        top_logprobs=req.top_logprobs_count or 0,
    )
    if req.seed is not None:
        params.seed = req.seed
    return params
