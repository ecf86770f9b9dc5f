"""Output tokens per second over a run, in fixed buckets, from chunk arrival times.

An average hides what the run looked like: a stall while a long prompt is
prefilled, or a server that slows as its queue grows, shows up only over time.
"""

from collections import defaultdict

from maas_tools.bench.client import RequestResult

BUCKET_S = 1.0


def output_tokens_per_s(
    results: list[RequestResult], origin: float, bucket_s: float = BUCKET_S
) -> list[float]:
    """Tokens/s in each bucket from `origin` (a perf_counter time) to the last chunk.

    A chunk can carry more than one token, so each request's usage count is
    spread evenly over its chunks; a server that reports no usage counts one
    token a chunk.
    """
    tokens: dict[int, float] = defaultdict(float)
    for result in results:
        if not result.ok or not result.chunk_times:
            continue
        per_chunk = (result.completion_tokens or len(result.chunk_times)) / len(result.chunk_times)
        for at in result.chunk_times:
            tokens[max(0, int((at - origin) // bucket_s))] += per_chunk
    if not tokens:
        return []
    return [round(tokens.get(i, 0.0) / bucket_s, 2) for i in range(max(tokens) + 1)]
