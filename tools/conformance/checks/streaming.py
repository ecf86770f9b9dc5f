"""Streamed chat completions: chunk shapes, and the usage chunk only when asked.

The reference's chat.completion.chunk: the same id on every chunk, object
"chat.completion.chunk", choices[].index and .delta, the role in the first
delta, one finish_reason per choice on its last chunk, and the stream closed
by `data: [DONE]`. With stream_options.include_usage the server sends one
extra chunk before [DONE] whose choices is empty and whose usage counts the
whole request; every other chunk's usage is null. Without it, no such chunk.
"""

from maas_tools.conformance.registry import check
from maas_tools.conformance.result import CheckFailed, expect
from maas_tools.conformance.shapes import ask, chunk_envelope, finishes, streamed_text, usage_shape
from maas_tools.conformance.target import Target

REQUEST = {"messages": ask("Say hello in one short sentence."), "max_tokens": 16, "temperature": 0}


@check("streaming", "chunk_shape")
def chunk_shape(target: Target) -> str:
    chunks = target.stream(**REQUEST).chunks
    expect(chunks, "the stream carried no chunk")
    for chunk in chunks:
        chunk_envelope(chunk, chunks[0])
    choices = [c for chunk in chunks for c in chunk["choices"]]
    expect(choices, "no chunk carried a choice")
    expect({c["index"] for c in choices} == {0}, "n=1: every choice has index 0")
    expect(
        choices[0]["delta"].get("role") == "assistant",
        f"the first delta carries role 'assistant', got {choices[0]['delta']!r:.120}",
    )
    ends = finishes(chunks).get(0, [])
    expect(len(ends) == 1, f"exactly one chunk carries a finish_reason, got {ends}")
    expect(
        choices[-1].get("finish_reason") is not None,
        "the finish_reason is on the choice's last chunk (content came after it)",
    )
    text = streamed_text(chunks)
    expect(text, "the streamed deltas carried no content")
    return f"{len(chunks)} chunks, finish_reason {ends[0]}"


@check("streaming", "usage_chunk")
def usage_chunk(target: Target) -> str:
    plain = target.stream(**REQUEST).chunks
    unasked = [c for c in plain if c.get("usage") is not None or not c.get("choices")]
    if unasked:
        raise CheckFailed(
            "without stream_options.include_usage no chunk carries usage or empty choices, "
            f"got {unasked[0]!r:.160}"
        )
    chunks = target.stream(**REQUEST, stream_options={"include_usage": True}).chunks
    with_usage = [i for i, c in enumerate(chunks) if c.get("usage") is not None]
    expect(
        len(with_usage) == 1,
        f"include_usage: exactly one chunk carries usage, got {len(with_usage)}",
    )
    last = chunks[with_usage[0]]
    expect(with_usage[0] == len(chunks) - 1, "include_usage: the usage chunk is the last one")
    expect(
        last.get("choices") == [],
        f"the usage chunk's choices is [], got {last.get('choices')!r:.120}",
    )
    counts = usage_shape(last["usage"], "usage chunk")
    return f"usage {counts['prompt_tokens']}+{counts['completion_tokens']}"
