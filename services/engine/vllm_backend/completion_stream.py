"""vLLM's streamed /v1/completions, read as the native engine's per-sample outputs.

vLLM sends one SSE chunk per step with a delta per sample (`index`), and the
usage of the whole request in a last chunk without choices. Our contract puts
a sample's usage on the message that carries its finish_reason, so a sample's
finishing chunk is held until that usage chunk arrives (right after it for
n = 1; when the last sample ends for n > 1). vLLM reports one completion count
for all samples; each sample's own is the number of token ids it streamed.
"""

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from maas_services.engine.logprobs import TokenLogprob
from maas_services.engine.request import SeqOutput

TOKEN_ID_PREFIX = "token_id:"


class VllmRequestError(Exception):
    """vLLM refused the request (its 4xx, or an error object in the stream)."""


class VllmModelNotFound(VllmRequestError):
    """vLLM serves no model of the name the request gave: an adapter it does not hold."""


class VllmUnavailable(Exception):
    """vLLM could not be reached or failed (5xx, connection lost)."""


@dataclass
class _Sample:
    completion_tokens: int = 0
    finished: bool = False
    held: SeqOutput | None = None  # its finishing output, until usage comes


@dataclass
class CompletionStream:
    request_id: str
    prompt_tokens: int
    top_logprobs: int
    samples: dict[int, _Sample] = field(default_factory=dict)

    def outputs(self, chunk: dict) -> list[SeqOutput]:
        """The outputs one parsed chunk gives, finishing ones held until usage comes."""
        ready = []
        for choice in chunk.get("choices") or ():
            sample = self.samples.setdefault(choice["index"], _Sample())
            token_ids = list(choice.get("token_ids") or ())
            sample.completion_tokens += len(token_ids)
            output = SeqOutput(
                request_id=self.request_id,
                index=choice["index"],
                token_ids=token_ids,
                text=choice.get("text") or "",
                finish_reason=None,
                prompt_tokens=self.prompt_tokens,
                completion_tokens=sample.completion_tokens,
                cached_prompt_tokens=0,
                logprobs=_logprobs(choice.get("logprobs"), token_ids, self.top_logprobs),
            )
            if choice.get("finish_reason"):
                output.finish_reason = _finish(choice["finish_reason"])
                sample.finished = True
                sample.held = output
            else:
                ready.append(output)
        usage = chunk.get("usage")
        if usage:
            details = usage.get("prompt_tokens_details") or {}
            ready.extend(self.release(details.get("cached_tokens") or 0))
        return ready

    def release(self, cached_prompt_tokens: int) -> list[SeqOutput]:
        released = []
        for sample in self.samples.values():
            if sample.held is None:
                continue
            output, sample.held = sample.held, None
            output.cached_prompt_tokens = cached_prompt_tokens
            # Once a sample has a token, vLLM computed the whole prompt.
            output.computed_prompt_tokens = self.prompt_tokens
            released.append(output)
        return released

    def aborted(self, num_samples: int) -> list[SeqOutput]:
        """An "abort" finish for every sample still running (the Abort RPC)."""
        outputs = []
        for index in range(num_samples):
            sample = self.samples.setdefault(index, _Sample())
            if sample.finished:
                continue
            outputs.append(
                SeqOutput(
                    request_id=self.request_id,
                    index=index,
                    token_ids=[],
                    text="",
                    finish_reason="abort",
                    prompt_tokens=self.prompt_tokens,
                    completion_tokens=sample.completion_tokens,
                    cached_prompt_tokens=0,
                    # vLLM does not say how far a prefill got: it reports nothing
                    # before a sample's first token. So the prompt's length, the
                    # billing rule for a request cut short (docs/billing.md).
                    computed_prompt_tokens=self.prompt_tokens,
                )
            )
        return outputs + self.release(0)


async def stream_chunks(client: httpx.AsyncClient, body: dict) -> AsyncIterator[dict]:
    """The parsed `data:` chunks of one streamed completion; closing it closes the
    HTTP stream, which is what makes vLLM abort the request."""
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                raise refusal(response.status_code, await response.aread())
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    # A failure after the stream began: vLLM's ErrorInfo has an HTTP code.
                    error = chunk["error"]
                    code = error.get("code", 500) if isinstance(error, dict) else 500
                    raise (VllmUnavailable if code >= 500 else VllmRequestError)(
                        error_message(error)
                    )
                yield chunk
    except httpx.TransportError as exc:
        raise VllmUnavailable(f"vLLM stream failed: {exc!r}") from exc


def refusal(status_code: int, content: bytes) -> VllmRequestError | VllmUnavailable:
    """What a vLLM answer other than 200 means: its 5xx is vLLM failing, its 4xx
    the request refused (with vLLM's message)."""
    if status_code >= 500:
        return VllmUnavailable(f"vLLM answered {status_code}")
    refused = VllmModelNotFound if status_code == 404 else VllmRequestError
    return refused(error_message(json_or_text(content)))


def _finish(reason: str) -> str:
    # vLLM's reasons are ours ("stop", "length", "abort"); anything newer ended the sample.
    return reason if reason in ("stop", "length", "abort") else "stop"


def _token_id(token: str) -> int:
    return int(token.removeprefix(TOKEN_ID_PREFIX))


def _logprobs(logprobs: dict | None, token_ids: list[int], top_n: int) -> list[TokenLogprob]:
    if not logprobs:
        return []
    tops = logprobs.get("top_logprobs") or [None] * len(token_ids)
    result = []
    for token_id, logprob, top in zip(token_ids, logprobs["token_logprobs"], tops, strict=True):
        # vLLM's dict holds the top n plus the sampled token when it is not among them.
        ranked = sorted((top or {}).items(), key=lambda item: item[1], reverse=True)[:top_n]
        result.append(
            TokenLogprob(token_id, float(logprob), [(_token_id(t), float(v)) for t, v in ranked])
        )
    return result


def json_or_text(content: bytes):
    try:
        return json.loads(content)
    except ValueError:
        return content.decode(errors="replace")


def error_message(error) -> str:
    # vLLM's bodies are OpenAI error objects, bare or under "error".
    if isinstance(error, dict):
        error = error.get("error", error)
        if isinstance(error, dict):
            return str(error.get("message", error))
    return str(error)
