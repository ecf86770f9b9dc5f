"""n > 1: one choice per index, each ending once, streamed or not.

The reference: `n` choices, indexed 0..n-1; streamed, every chunk's choices
say which index they continue, and each index gets exactly one finish_reason,
on its last chunk.
"""

from maas_tools.conformance.registry import check
from maas_tools.conformance.result import expect
from maas_tools.conformance.shapes import LONG_ANSWER, chunk_envelope, finishes, streamed_text
from maas_tools.conformance.target import Target

N = 2
REQUEST = {"messages": LONG_ANSWER, "max_tokens": 8, "n": N, "temperature": 1.0, "seed": 7}


@check("parallel", "choices")
def choices(target: Target) -> str:
    body = target.chat(**REQUEST)
    got = body.get("choices") or []
    expect(len(got) == N, f"n={N}: {N} choices, got {len(got)}")
    indices = sorted(c.get("index") for c in got)
    expect(indices == list(range(N)), f"n={N}: indices {list(range(N))}, got {indices}")
    for c in got:
        expect(c.get("finish_reason") is not None, f"choice {c['index']} has a finish_reason")
        expect(isinstance(c.get("message"), dict), f"choice {c['index']} has a message")
    return ""


@check("parallel", "streamed_indices")
def streamed_indices(target: Target) -> str:
    chunks = target.stream(**REQUEST).chunks
    for chunk in chunks:
        chunk_envelope(chunk, chunks[0])
    seen = {c["index"] for chunk in chunks for c in chunk["choices"]}
    expect(seen == set(range(N)), f"n={N}: streamed indices {set(range(N))}, got {sorted(seen)}")
    ends = finishes(chunks)
    for index in range(N):
        expect(
            len(ends.get(index, [])) == 1,
            f"index {index}: exactly one finish chunk, got {ends.get(index, [])}",
        )
        expect(streamed_text(chunks, index), f"index {index} streamed no content")
    ended: set[int] = set()
    for chunk in chunks:
        for c in chunk["choices"]:
            expect(
                c["index"] not in ended or not c["delta"].get("content"),
                f"index {c['index']} streamed content after its finish chunk",
            )
            if c.get("finish_reason") is not None:
                ended.add(c["index"])
    return ""
