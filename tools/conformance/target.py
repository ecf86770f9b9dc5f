"""The server under test, as a client sees it: a base URL, a key, a model.

Requests go out as raw HTTP (httpx) so checks read exactly what the server
sent. `chat()` and `stream()` are the two ways a check asks for a chat
completion; a 4xx answer to a feature (a field the server refuses) raises
NotOffered, a 5xx or a network error fails the check.
"""

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

from maas_tools.conformance.result import CheckFailed, NotOffered, expect

# Statuses that say "this server does not serve that route or field".
REFUSED = (400, 404, 405, 422, 501)


@dataclass
class Options:
    base_url: str
    key: str = ""
    model: str = ""  # "" : the first id GET /models lists
    timeout: float = 120.0
    # Prometheus text with a count of running requests (the disconnect check).
    metrics_url: str = ""
    running_metric: str = ""  # "" : the first known name found there
    # Requests in the rate-limit burst; 0: not probed.
    rate_limit_probe: int = 0
    rate_limit_key: str = ""  # "" : key


@dataclass
class StreamReply:
    # Every `data:` payload before [DONE], parsed.
    chunks: list[dict] = field(default_factory=list)
    done: bool = False  # the stream ended with `data: [DONE]`


class Target:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.base_url = options.base_url.rstrip("/")
        self.http = self._client()
        try:
            self.model = options.model or self._first_model()
        except BaseException:
            self.http.close()
            raise

    def _client(self) -> httpx.Client:
        key = self.options.key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=self.options.timeout)

    def fresh_connections(self) -> None:
        """New connections for the next check: a server that dropped one (a crash
        answered 500 and closed) fails the check that caused it, not the next."""
        self.http.close()
        self.http = self._client()

    def close(self) -> None:
        self.http.close()

    def _first_model(self) -> str:
        reply = self.http.get("/models")
        reply.raise_for_status()
        models = reply.json().get("data") or []
        if not models:
            raise RuntimeError(f"{self.base_url}/models lists no model: pass --model")
        return models[0]["id"]

    def body(self, **fields) -> dict:
        return {"model": self.model, **fields}

    def post(self, path: str, payload: dict) -> httpx.Response:
        return self.http.post(path, json=payload)

    def chat(self, **fields) -> dict:
        """A non-streamed chat completion's body; a refusal of the fields is NotOffered."""
        reply = self.post("/chat/completions", self.body(**fields))
        refused(reply, "chat completion")
        return json_body(reply)

    def stream(self, **fields) -> StreamReply:
        """A streamed chat completion, read to its end."""
        payload = self.body(stream=True, **fields)
        with self.http.stream("POST", "/chat/completions", json=payload) as reply:
            if reply.status_code != 200:
                reply.read()
                refused(reply, "streamed chat completion")
            kind = reply.headers.get("content-type", "")
            expect(
                kind.startswith("text/event-stream"),
                f"a stream's Content-Type is text/event-stream, got {kind!r}",
            )
            out = StreamReply()
            for data in sse_data(reply.iter_lines()):
                expect(not out.done, "data arrived after [DONE]")
                if data == "[DONE]":
                    out.done = True
                    continue
                try:
                    out.chunks.append(json.loads(data))
                except json.JSONDecodeError as exc:
                    raise CheckFailed(f"a data line is not JSON: {data[:120]!r}") from exc
        expect(out.done, "the stream did not end with `data: [DONE]`")
        return out


def sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The `data:` payloads of a server-sent event stream (one event per blank line)."""
    parts: list[str] = []
    for line in lines:
        if not line:
            if parts:
                yield "\n".join(parts)
                parts = []
        elif line.startswith("data:"):
            parts.append(line[5:].removeprefix(" "))
    if parts:
        yield "\n".join(parts)


def json_body(reply: httpx.Response) -> dict:
    try:
        body = reply.json()
    except ValueError as exc:
        raise CheckFailed(
            f"HTTP {reply.status_code} body is not JSON: {reply.text[:120]!r}"
        ) from exc
    expect(isinstance(body, dict), f"HTTP {reply.status_code} body is not a JSON object")
    return body


def refused(reply: httpx.Response, what: str) -> None:
    """NotOffered for a 4xx refusal, CheckFailed for any other non-200."""
    if reply.status_code == 200:
        return
    text = reply.text[:200]
    if reply.status_code in REFUSED:
        raise NotOffered(f"{what} refused: HTTP {reply.status_code} {text}")
    raise CheckFailed(f"{what}: HTTP {reply.status_code} {text}")
