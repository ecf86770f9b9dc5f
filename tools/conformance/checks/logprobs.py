"""Chat logprobs: one entry per completion token, each with its top_logprobs.

The reference's choices[].logprobs.content[]: {token, logprob, bytes,
top_logprobs: [{token, logprob, bytes}] x top_logprobs}, the alternatives most
likely first. Greedy (temperature 0), the chosen token is the most likely one;
the tokens (their bytes where given) spell the message's content.
"""

from maas_tools.conformance.registry import check
from maas_tools.conformance.result import expect
from maas_tools.conformance.shapes import LONG_ANSWER, usage_shape
from maas_tools.conformance.target import Target

TOP = 2
# Float rounding between the chosen token's logprob and the same token listed as top 1.
SLACK = 1e-3


def token_entry(entry: object, where: str) -> None:
    expect(isinstance(entry, dict), f"{where} is an object")
    expect(isinstance(entry.get("token"), str), f"{where}.token is a string")
    logprob = entry.get("logprob")
    expect(isinstance(logprob, int | float), f"{where}.logprob is a number, got {logprob!r}")
    expect(logprob <= SLACK, f"{where}.logprob is at most 0, got {logprob}")
    raw = entry.get("bytes")
    expect(
        raw is None or (isinstance(raw, list) and all(isinstance(b, int) for b in raw)),
        f"{where}.bytes is null or a list of integers",
    )


@check("logprobs", "chat_logprobs")
def chat_logprobs(target: Target) -> str:
    body = target.chat(
        messages=LONG_ANSWER, max_tokens=6, temperature=0, logprobs=True, top_logprobs=TOP
    )
    choice = body["choices"][0]
    logprobs = choice.get("logprobs")
    expect(isinstance(logprobs, dict), f"choices[0].logprobs is an object, got {logprobs!r:.80}")
    content = logprobs.get("content")
    expect(isinstance(content, list) and content, "logprobs.content is a non-empty list")
    counts = usage_shape(body.get("usage"), "chat completion")
    expect(
        len(content) == counts["completion_tokens"],
        f"one logprobs entry per completion token: {len(content)} entries, "
        f"usage.completion_tokens {counts['completion_tokens']}",
    )
    for i, entry in enumerate(content):
        token_entry(entry, f"content[{i}]")
        top = entry.get("top_logprobs")
        expect(
            isinstance(top, list) and len(top) == TOP,
            f"content[{i}].top_logprobs has {TOP} entries, got {top!r:.120}",
        )
        for j, alt in enumerate(top):
            token_entry(alt, f"content[{i}].top_logprobs[{j}]")
        values = [alt["logprob"] for alt in top]
        expect(
            values == sorted(values, reverse=True), f"content[{i}].top_logprobs: most likely first"
        )
        expect(
            entry["logprob"] >= values[0] - SLACK,
            f"content[{i}]: greedy picked {entry['token']!r} ({entry['logprob']:.4f}) over "
            f"{top[0]['token']!r} ({values[0]:.4f})",
        )
    if choice.get("finish_reason") == "length":
        text = choice["message"].get("content") or ""
        if all(entry.get("bytes") is not None for entry in content):
            spelled = b"".join(bytes(entry["bytes"]) for entry in content).decode(errors="replace")
        else:
            spelled = "".join(entry["token"] for entry in content)
        expect(spelled == text, f"the tokens spell {spelled!r}, the content is {text!r}")
    return f"{len(content)} tokens"
