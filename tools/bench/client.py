"""One streamed completion (chat or text) over the OpenAI HTTP API, timed as a client sees it."""

import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class RequestResult:
    # Empty when the request succeeded, else its kind: http_429, timeout, stream_error...
    error: str = ""
    ttft: float | None = None
    e2e: float = 0.0
    # Gaps between consecutive content chunks.
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    text: str = ""
    # The scenario's name for the request's class ("chat", "long"), so a
    # mixed workload can be summarized per class; empty when there is one.
    kind: str = ""
    # perf_counter() when the request was sent and when each content chunk
    # arrived: throughput over time is bucketed from these.
    sent_at: float = 0.0
    chunk_times: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if self.ttft is None or self.completion_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)


class ChatClient:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        timeout: float,
        transport: httpx.AsyncBaseTransport | None = None,  # tests: a canned server
        # Fields for one server's dialect, in every request (llama.cpp's min_tokens).
        extra_body: dict | None = None,
    ):
        self._base = base_url.rstrip("/")
        self._extra = extra_body or {}
        self._model = model
        self._http = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
            transport=transport,
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def chat(self, messages: list[dict], max_tokens: int, session: str = "") -> RequestResult:
        body = {"messages": messages, **self._generation(max_tokens)}
        headers = {}
        if session:
            body["user"] = session
            headers["x-session-id"] = session
        return await self._stream("/chat/completions", body, headers)

    async def complete(self, prompt: str | list[int], max_tokens: int) -> RequestResult:
        """A streamed text completion (/v1/completions): the raw prompt (text or token
        ids), no chat template."""
        return await self._stream(
            "/completions", {"prompt": prompt, **self._generation(max_tokens)}
        )

    def _generation(self, max_tokens: int) -> dict:
        return {
            "model": self._model,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            # vLLM's extra, so every request generates exactly max_tokens.
            "ignore_eos": True,
            **self._extra,
        }

    async def _stream(self, path: str, body: dict, headers: dict | None = None) -> RequestResult:
        started = time.perf_counter()
        result = RequestResult(sent_at=started)
        try:
            async with self._http.stream(
                "POST", self._base + path, json=body, headers=headers
            ) as reply:
                if reply.status_code != 200:
                    await reply.aread()
                    result.error = f"http_{reply.status_code}"
                else:
                    await self._read_stream(reply, started, result)
        except httpx.TimeoutException:
            result.error = "timeout"
        except httpx.TransportError:
            result.error = "connection"
        result.e2e = time.perf_counter() - started
        return result

    async def _read_stream(self, reply: httpx.Response, started: float, result) -> None:
        last = None
        finished = False
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line.removeprefix("data: ")
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            if "error" in chunk:
                result.error = "stream_error"
                return
            for choice in chunk.get("choices") or []:
                # A chat chunk's delta, or a text completion's text.
                content = (choice.get("delta") or {}).get("content") or choice.get("text")
                if content:
                    now = time.perf_counter()
                    if last is None:
                        result.ttft = now - started
                    else:
                        result.itl.append(now - last)
                    last = now
                    result.chunk_times.append(now)
                    result.text += content
                if choice.get("finish_reason") == "error":
                    result.error = "stream_error"
                finished = finished or bool(choice.get("finish_reason"))
            usage = chunk.get("usage")
            if usage:
                result.prompt_tokens = usage.get("prompt_tokens", 0)
                result.completion_tokens = usage.get("completion_tokens", 0)
                details = usage.get("prompt_tokens_details") or {}
                result.cached_tokens = details.get("cached_tokens") or 0
        if not finished and not result.error:
            result.error = "stream_incomplete"
