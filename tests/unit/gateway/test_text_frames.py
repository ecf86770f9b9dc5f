"""A text-only chunk's frame is the bytes the whole chunk would encode to."""

import json

import pytest

from maas_services.common.openai_api.delta import Delta
from maas_services.common.openai_api.openai_format import ResponseShape
from maas_services.gateway.http_api.http_stream import TextFrames, sse

TEXTS = [" hello", 'quote " back \\ slash', "line\nbreak\ttab", "\x00 nul", "é ☃ 🙂", "\u2028"]


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("include_usage", [True, False])
def test_frames_are_the_chunks_bytes(chat, include_usage):
    # A model name holding the marker changes nothing: the text is found from the end.
    shape = ResponseShape("req-1", '"\x00"', chat=chat)
    frames = TextFrames(shape, include_usage)
    whole = ResponseShape("req-1", '"\x00"', chat=chat, created=shape.created)
    for index in (0, 1):
        for text in TEXTS:
            delta = Delta(text=text, index=index, completion_tokens=3)
            assert shape.text_only(delta)
            assert frames(delta) == sse(whole.chunk(delta, include_usage))
            assert json.loads(frames(delta)[6:])["choices"][0]["index"] == index


@pytest.mark.parametrize(
    "shape, delta",
    [
        (ResponseShape("r", "m", chat=True), Delta(text="", index=0)),
        (ResponseShape("r", "m", chat=True), Delta(text="x", finish_reason="stop")),
        (ResponseShape("r", "m", chat=True, with_logprobs=True), Delta(text="x")),
        (ResponseShape("r", "m", chat=True, tool_mode="auto"), Delta(text="x")),
        (ResponseShape("r", "m", chat=False, with_logprobs=True), Delta(text="x")),
    ],
)
def test_chunks_with_more_than_text_take_the_whole_path(shape, delta):
    assert not shape.text_only(delta)
