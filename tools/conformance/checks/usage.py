"""usage counts the tokens of the text, the same streamed or not.

A client cannot tokenize for the server, but it can hold usage to what it
can see: a reply cut at max_tokens (finish_reason "length") has exactly
max_tokens completion tokens; total_tokens is their sum with prompt_tokens; and
the same greedy request, streamed with include_usage, reports the same counts
for the same text.
"""

from maas_tools.conformance.registry import check
from maas_tools.conformance.result import expect
from maas_tools.conformance.shapes import LONG_ANSWER, streamed_text, usage_shape
from maas_tools.conformance.target import Target

MAX_TOKENS = 12
REQUEST = {"messages": LONG_ANSWER, "max_tokens": MAX_TOKENS, "temperature": 0, "seed": 1}


@check("usage", "completion_tokens")
def completion_tokens(target: Target) -> str:
    body = target.chat(**REQUEST)
    counts = usage_shape(body.get("usage"), "chat completion")
    reason = body["choices"][0].get("finish_reason")
    expect(
        reason == "length",
        f"a {MAX_TOKENS}-token reply to a long count ends 'length', got {reason!r}",
    )
    expect(
        counts["completion_tokens"] == MAX_TOKENS,
        f"cut at max_tokens={MAX_TOKENS}, usage.completion_tokens is {counts['completion_tokens']}",
    )
    expect(counts["prompt_tokens"] > 0, "usage.prompt_tokens counts the prompt (> 0)")
    return f"{counts['prompt_tokens']}+{counts['completion_tokens']}"


@check("usage", "stream_agrees")
def stream_agrees(target: Target) -> str:
    whole = target.chat(**REQUEST)
    streamed = target.stream(**REQUEST, stream_options={"include_usage": True}).chunks
    expect(streamed and streamed[-1].get("usage"), "the streamed reply's last chunk carries usage")
    a = usage_shape(whole.get("usage"), "chat completion")
    b = usage_shape(streamed[-1]["usage"], "usage chunk")
    text, streamed_reply = (
        whole["choices"][0]["message"].get("content") or "",
        streamed_text(streamed),
    )
    expect(
        text == streamed_reply,
        f"greedy: the same text streamed or not, got {text!r:.60} and {streamed_reply!r:.60}",
    )
    expect(a == b, f"the same request's usage streamed {b} and not {a}")
    return ""
