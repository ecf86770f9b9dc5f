"""Reading tool calls out of answers, one format per parser, on fixed strings."""

import json

import pytest

from maas_services.common.chat_tools import FALLBACK_FORMAT, TEMPLATE_FORMATS
from maas_services.common.openai_api.delta import Delta
from maas_services.common.openai_api.openai_format import Choices, ResponseShape
from maas_services.common.openai_api.tool_parsers import PARSERS, parser_for
from maas_services.common.openai_api.tool_parsers.llama3_json import PYTHON_TAG

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
# Qwen2.5's template asks for the call on lines of its own inside the tags.
QWEN_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'


def whole(tool_format: str, text: str, mode: str = "auto"):
    return parser_for(mode, tool_format).whole(text)


@pytest.mark.parametrize(
    ("tool_format", "text", "content", "names"),
    [
        ("hermes", "It is sunny.", "It is sunny.", []),
        ("hermes", CALL, None, ["get_weather"]),
        ("hermes", QWEN_CALL, None, ["get_weather"]),
        (
            "hermes",
            "Let me check.\n" + QWEN_CALL + "\n" + CALL,
            "Let me check.\n\n",
            ["get_weather"] * 2,
        ),
        ("hermes", "<tool_call>{broken</tool_call>", "<tool_call>{broken</tool_call>", []),
        ("hermes", '<tool_call>{"name": "x"', '<tool_call>{"name": "x"', []),
        ("hermes", "a < b <tool", "a < b <tool", []),
        ("llama3_json", LLAMA_CALL, None, ["get_weather"]),
        ("llama3_json", f"  {PYTHON_TAG}{LLAMA_CALL}", None, ["get_weather"]),
        ("llama3_json", f"{LLAMA_CALL}; {LLAMA_CALL}", None, ["get_weather"] * 2),
        ("llama3_json", LLAMA_CALL.replace("parameters", "arguments"), None, ["get_weather"]),
        ("llama3_json", "It is sunny. " + LLAMA_CALL, "It is sunny. " + LLAMA_CALL, []),
        ("llama3_json", '{"city": "Paris"}', '{"city": "Paris"}', []),
        ("llama3_json", LLAMA_CALL + " and more", LLAMA_CALL + " and more", []),
        ("llama3_json", "<b>bold</b>", "<b>bold</b>", []),
    ],
)
def test_auto_parsing_of_fixed_strings(tool_format, text, content, names):
    got_content, calls = whole(tool_format, text)
    assert got_content == content
    assert [c["function"]["name"] for c in calls] == names
    for call in calls:
        assert call["id"].startswith("call_") and call["type"] == "function"
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


@pytest.mark.parametrize("tool_format", sorted(PARSERS))
def test_a_forced_output_is_one_call_whatever_the_format(tool_format):
    content, calls = whole(tool_format, '{"name": "get_time", "arguments": {}}', "forced")
    assert content is None
    assert [c["function"] for c in calls] == [{"name": "get_time", "arguments": "{}"}]


@pytest.mark.parametrize(
    ("tool_format", "text", "content"),
    [
        ("hermes", "Sure. " + CALL + " and " + QWEN_CALL, "Sure.  and "),
        ("llama3_json", f"{PYTHON_TAG}{LLAMA_CALL};{LLAMA_CALL}", ""),
        ("llama3_json", "No call: " + LLAMA_CALL, "No call: " + LLAMA_CALL),
    ],
)
def test_streamed_calls_come_whole_with_stable_indexes_whatever_the_cut(tool_format, text, content):
    expected = 0 if content.startswith("No") else 2
    for cut in range(1, len(text)):
        parser = parser_for("auto", tool_format)
        first = parser.feed(text[:cut], None)
        last = parser.feed(text[cut:], "stop")
        assert first[0] + last[0] == content, cut
        assert [c["index"] for c in first[1] + last[1]] == list(range(expected))
        assert last[2] == ("tool_calls" if expected else "stop")


def test_content_before_anything_else_streams_at_once():
    # A Llama answer that does not open with a call is passed on token by token.
    parser = parser_for("auto", "llama3_json")
    assert parser.feed("  ", None)[0] == ""
    assert parser.feed("Hello", None)[0] == "  Hello"
    assert parser.feed(" {", None)[0] == " {"


@pytest.mark.parametrize("forced", [False, True])
def test_a_call_200k_tokens_long_is_held_whole_and_parsed_once(forced):
    # The worst case for the per-token path: one call held until it closes
    # (auto) or the output ends (forced). Its speed is not asserted here (no
    # timed tests); held text kept in parts made it 0.35 s, a copy per token 22 s.
    parser = parser_for("forced" if forced else "auto", "hermes")
    opening = '{"name": "f", "arguments": {"a": "'
    assert parser.push(opening if forced else "<tool_call>" + opening) == ("", [])
    for _ in range(200_000):
        assert parser.push("xy") == ("", [])
    content, calls = parser.push('"}}' + ("" if forced else "</tool_call>"))
    tail, more = parser.finish()
    assert content == tail == ""
    ((call,),) = [calls + more]
    assert json.loads(call["function"]["arguments"]) == {"a": "xy" * 200_000}


def test_every_format_the_tokenizer_names_has_a_parser():
    named = {name for _, name in TEMPLATE_FORMATS if name} | {FALLBACK_FORMAT}
    assert named <= set(PARSERS)


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_answer_is_read_in_the_format_the_prompt_asked_for(stream):
    shape = ResponseShape("chatcmpl-1", "m", chat=True, tool_mode="auto", tool_format="llama3_json")
    deltas = [Delta(LLAMA_CALL[:9]), Delta(LLAMA_CALL[9:], finish_reason="stop")]
    if stream:
        bodies = [shape.chunk(d, include_usage=False)["choices"][0] for d in deltas]
        calls = [c for body in bodies for c in body["delta"].get("tool_calls", [])]
        finish = bodies[-1]["finish_reason"]
    else:
        choices = Choices()
        for delta in deltas:
            choices.add(delta)
        (choice,) = shape.full(choices, deltas[-1])["choices"]
        calls, finish = choice["message"]["tool_calls"], choice["finish_reason"]
        assert choice["message"]["content"] is None
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert finish == "tool_calls"
