"""A small OpenAI-compatible server with switchable defects, to test the suite.

With no defect it keeps every contract the suite checks (and serves no
/responses, /embeddings or /batches, so those are "not offered"); each
Defects field breaks exactly one contract, as real servers have broken them.
"Generation" is a fixed sequence of words, one token each, so every count
the suite reads is known. Served by uvicorn on loopback in a thread.
"""

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from maas_tools.local.ports import free_port

MODEL = "fake-model"
CONTEXT = 2048
RUNNING_METRIC = "fake_requests_running"
LIMITED_KEY = "limited"  # this key gets 429 after LIMIT requests
LIMIT = 3
ARGS = ['{"city": ', '"Paris"}']
JSON_ANSWER = '{"city": "Paris", "country": "France"}'


@dataclass
class Defects:
    usage_unasked: bool = False  # the usage chunk sent without include_usage
    double_finish: bool = False  # two finish chunks for one choice
    n_indices_wrong: bool = False  # streamed n>1 choices all say index 0
    no_top_logprobs: bool = False  # top_logprobs empty
    tool_args_not_json: bool = False  # streamed argument fragments miss their "}"
    json_schema_ignored: bool = False  # json_schema answered with prose
    error_envelope: bool = False  # bad input answered FastAPI's way: 422 {"detail": ...}
    usage_off_by_one: bool = False  # completion_tokens one more than generated
    no_retry_after: bool = False  # 429 without Retry-After
    keeps_generating: bool = False  # a closed stream generates on
    no_model_retrieve: bool = False  # GET /v1/models/{id} missing
    crash_on_bad_json: bool = False  # a malformed body raises: 500, the connection dropped


def error(status: int, message: str, defects: Defects, param=None, code=None, headers=None):
    if defects.error_envelope:
        return JSONResponse({"detail": message}, 422)
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }
    return JSONResponse(body, status, headers=headers)


def words(count: int) -> list[str]:
    return [f"w{i} " for i in range(count)]


def logprob_entry(token: str, defects: Defects) -> dict:
    chosen = {"token": token, "logprob": -0.1, "bytes": list(token.encode())}
    other = {"token": "x", "logprob": -2.5, "bytes": [120]}
    return {**chosen, "top_logprobs": [] if defects.no_top_logprobs else [chosen, other]}


class Generation:
    """What one request produces, choice by choice."""

    def __init__(self, body: dict, defects: Defects) -> None:
        self.body, self.defects = body, defects
        self.max_tokens = body.get("max_tokens") or 16
        self.n = body.get("n") or 1
        self.tool = (body.get("tool_choice") or {}).get("function", {}).get("name")
        fmt = (body.get("response_format") or {}).get("type")
        json_format = fmt in ("json_object", "json_schema")
        if self.tool:
            self.tokens, self.finish = ARGS, "tool_calls"
        elif fmt == "json_schema" and defects.json_schema_ignored:
            self.tokens, self.finish = ["Paris is the capital of France."], "stop"
        elif json_format:
            self.tokens, self.finish = [JSON_ANSWER], "stop"
        else:
            self.tokens, self.finish = words(self.max_tokens), "length"
        text = " ".join(m.get("content") or "" for m in body.get("messages", []))
        prompt = len(text.split()) + 3
        self.usage = {
            "prompt_tokens": prompt,
            "completion_tokens": len(self.tokens),
            "total_tokens": prompt + len(self.tokens),
        }

    def message(self) -> dict:
        if self.tool:
            call = {
                "id": "call_0",
                "type": "function",
                "function": {"name": self.tool, "arguments": "".join(ARGS)},
            }
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        return {"role": "assistant", "content": "".join(self.tokens)}

    def choice(self, index: int) -> dict:
        out = {"index": index, "message": self.message(), "finish_reason": self.finish}
        if self.body.get("logprobs"):
            out["logprobs"] = {"content": [logprob_entry(t, self.defects) for t in self.tokens]}
        return out

    def delta(self, position: int, token: str) -> dict:
        if not self.tool:
            return {"content": token}
        if self.defects.tool_args_not_json:
            token = token.rstrip("}")
        fragment = {"index": 0, "function": {"arguments": token}}
        if position == 0:
            fragment.update(id="call_0", type="function")
            fragment["function"]["name"] = self.tool
        return {"tool_calls": [fragment]}


def make_app(defects: Defects) -> FastAPI:
    app = FastAPI()
    state = {"running": 0, "limited": 0}

    def chunk(choices: list[dict], **extra) -> str:
        body = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": MODEL,
            "choices": choices,
            **extra,
        }
        return f"data: {json.dumps(body)}\n\n"

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(
            f"# TYPE {RUNNING_METRIC} gauge\n{RUNNING_METRIC} {state['running']}\n"
        )

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": MODEL, "object": "model", "created": 1, "owned_by": "fake"}],
        }

    if not defects.no_model_retrieve:

        @app.get("/v1/models/{model_id:path}")
        async def model(model_id: str):
            if model_id != MODEL:
                return error(404, f"no model {model_id}", defects, "model", "model_not_found")
            return {"id": MODEL, "object": "model", "created": 1, "owned_by": "fake"}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        if request.headers.get("authorization") == f"Bearer {LIMITED_KEY}":
            state["limited"] += 1
            if state["limited"] > LIMIT:
                headers = {} if defects.no_retry_after else {"Retry-After": "7"}
                body = {
                    "error": {
                        "message": "slow down",
                        "type": "requests",
                        "param": None,
                        "code": "rate_limit_exceeded",
                    }
                }
                return JSONResponse(body, 429, headers=headers)
        try:
            body = json.loads(await request.body())
        except json.JSONDecodeError:
            if defects.crash_on_bad_json:
                raise
            return error(400, "the body is not JSON", defects)
        if "model" not in body:
            return error(400, "you must provide a model", defects, "model")
        if body["model"] != MODEL:
            return error(404, "no such model", defects, "model", "model_not_found")
        temperature = body.get("temperature", 1)
        if not isinstance(temperature, int | float):
            return error(400, "temperature is a number", defects, "temperature")
        if not 0 <= temperature <= 2:
            return error(400, "temperature is between 0 and 2", defects, "temperature")
        if (body.get("max_tokens") or 0) > CONTEXT:
            return error(400, "max_tokens is over the context", defects, "max_tokens")
        gen = Generation(body, defects)
        if not body.get("stream"):
            usage = dict(gen.usage)
            if defects.usage_off_by_one:
                usage["completion_tokens"] += 1
                usage["total_tokens"] += 1
            choices = [gen.choice(i) for i in range(gen.n)]
            return {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 1,
                "model": MODEL,
                "choices": choices,
                "usage": usage,
            }
        return StreamingResponse(stream(gen, body), media_type="text/event-stream")

    async def stream(gen: Generation, body: dict):
        # Long replies pace themselves, so a client can leave midway.
        pause = 0.01 if gen.max_tokens > 100 else 0
        state["running"] += 1
        try:
            for i in range(gen.n):
                yield chunk(
                    [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "finish_reason": None,
                        }
                    ]
                )
            for position, token in enumerate(gen.tokens):
                for i in range(gen.n):
                    index = 0 if defects.n_indices_wrong else i
                    yield chunk(
                        [
                            {
                                "index": index,
                                "delta": gen.delta(position, token),
                                "finish_reason": None,
                            }
                        ]
                    )
                await asyncio.sleep(pause)
            ends = 2 if defects.double_finish else 1
            for i in range(gen.n):
                for _ in range(ends):
                    yield chunk([{"index": i, "delta": {}, "finish_reason": gen.finish}])
            if (body.get("stream_options") or {}).get("include_usage") or defects.usage_unasked:
                yield chunk([], usage=gen.usage)
            yield "data: [DONE]\n\n"
        finally:
            if defects.keeps_generating:
                # The "engine" runs to the end of max_tokens whoever listens.
                asyncio.get_running_loop().call_later(pause * len(gen.tokens), release)
            else:
                release()

    def release():
        state["running"] -= 1

    return app


@contextmanager
def serve(defects: Defects) -> Iterator[str]:
    """The fake on a free loopback port; yields its base URL (ending in /v1)."""
    port = free_port("127.0.0.1")
    server = uvicorn.Server(
        uvicorn.Config(make_app(defects), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the fake server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
