"""Llama 3.1-style calls: the whole answer is the call, {"name", "parameters"}.

Llama 3.1's template asks for a JSON object `{"name": ..., "parameters": {...}}`
as the answer itself, which may begin with `<|python_tag|>` (a special token,
usually dropped by the detokenizer) and, as vLLM reads it, hold several calls
separated by ";". There is no closing tag, so an answer whose first character
is "{" (or the tag) is held to the end and read then: calls if it is wholly
calls, else content as written. Any other answer streams as content and is
never read for calls; "arguments" is accepted in place of "parameters".
"""

import json

from maas_services.common.openai_api.tool_parsers.base import ToolParser, call_of

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


class Llama3JsonParser(ToolParser):
    def __init__(self):
        super().__init__()
        # Leading text not yet decided (whitespace, or a part of the tag).
        self._lead = ""
        # Parts of an answer that may be calls, joined once at the end.
        self._parts: list[str] | None = None
        self._content = False

    def push(self, text: str) -> tuple[str, list[dict]]:
        if self._content:
            return text, []
        if self._parts is not None:
            self._parts.append(text)
            return "", []
        self._lead += text
        start = self._lead.lstrip()
        if start.startswith(("{", PYTHON_TAG)):
            self._parts, self._lead = [self._lead], ""
        elif start and not PYTHON_TAG.startswith(start):
            self._content, text, self._lead = True, self._lead, ""
            return text, []
        return "", []

    def finish(self) -> tuple[str, list[dict]]:
        held = self._lead + "".join(self._parts or ())
        self._lead, self._parts = "", None
        calls = _calls(held)
        if not calls:
            return held, []
        return "", [self._numbered(*call) for call in calls]


def _calls(text: str) -> list | None:
    body = text.strip().removeprefix(PYTHON_TAG)
    calls, at = [], 0
    while True:
        while at < len(body) and body[at].isspace():
            at += 1
        try:
            value, at = _DECODER.raw_decode(body, at)
        except json.JSONDecodeError:
            return None
        call = call_of(value, ("parameters", "arguments"))
        if call is None:
            return None
        calls.append(call)
        rest = body[at:].lstrip()
        if not rest:
            return calls
        if not rest.startswith(";"):
            return None
        at = len(body) - len(rest) + 1
