"""The vLLM adapter sends the tokens vLLM has streamed meanwhile in one message.

The servicer runs in the test's loop over the real vLLM server, so the test
can be the slow writer: it takes the first message and reads no more until
the adapter has read vLLM's whole answer (or part of it), which the adapter's
HTTP transport, watched, tells. What piled up comes in fewer messages than
tokens, and says what the stream read as it comes says.
"""

import httpx
import pytest

from maas.v1 import common_pb2
from maas_services.common.engine_metadata import SCHEDULED
from maas_services.common.model_files import ModelNotFoundError, default_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.engine.vllm_backend.cache_salt import SaltBook
from maas_services.engine.vllm_backend.servicer import (
    READY_LIMIT,
    VllmEngineServicer,
    VllmInfo,
)
from tests.integration.router.conftest import eventually
from tests.integration.vllm.conftest import (
    BLOCK_SIZE,
    MAX_NUM_SEQS,
    MODEL_ID,
    SERVED_MODEL,
    generate_request,
)

pytestmark = pytest.mark.slow

TOKENS = 48


class Watched(httpx.AsyncBaseTransport):
    """vLLM's HTTP transport, counting the SSE events the adapter has read and
    the answers it has closed (read to their end, or left)."""

    def __init__(self):
        self._inner = httpx.AsyncHTTPTransport()
        self.events = 0
        self.closed = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        response.stream = _Counted(response.stream, self)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Counted(httpx.AsyncByteStream):
    def __init__(self, inner, watch: Watched):
        self._inner = inner
        self._watch = watch

    async def __aiter__(self):
        async for part in self._inner:
            self._watch.events += part.count(b"data:")
            yield part

    async def aclose(self) -> None:
        self._watch.closed += 1
        await self._inner.aclose()


class Context:
    """The part of a gRPC servicer context Generate uses."""

    def __init__(self):
        self.metadata = []

    async def send_initial_metadata(self, metadata):
        self.metadata.append(metadata)

    async def abort(self, code, details):
        raise AssertionError(f"aborted: {code} {details}")


@pytest.fixture
async def watched(vllm_server):
    watch = Watched()
    headers = {"Authorization": f"Bearer {vllm_server.config.api_key}"}
    async with httpx.AsyncClient(
        base_url=vllm_server.url, headers=headers, transport=watch, timeout=120
    ) as client:
        yield client, watch


@pytest.fixture
def servicer(watched):
    try:
        tokenizer = load_tokenizer(default_model_path())
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    info = VllmInfo(
        model_id=MODEL_ID,
        served_model=SERVED_MODEL,
        max_model_len=2048,
        max_num_seqs=MAX_NUM_SEQS,
        block_size=BLOCK_SIZE,
        num_blocks=0,
        cache_salt=MODEL_ID,
        prefix_cache_sharing="tenant",
    )
    client, _ = watched
    return VllmEngineServicer(info, "test", client, tokenizer, None, SaltBook())


async def read(servicer, request, watch: Watched | None = None):
    """The messages of one Generate; given the watch, after the first message
    it reads no more until the adapter has read vLLM's whole answer."""
    context = Context()
    messages = []
    closed = watch.closed if watch is not None else 0
    async for message in servicer.Generate(request, context):
        messages.append(message)
        if watch is not None and len(messages) == 1:
            await eventually(lambda: watch.closed > closed, timeout=120, what="vLLM's answer")
    assert context.metadata == [SCHEDULED]
    return messages


async def more_events(watch: Watched, count: int) -> None:
    """Until the adapter has read `count` more of vLLM's SSE events."""
    wanted = watch.events + count
    await eventually(lambda: watch.events >= wanted, timeout=120, what=f"{count} more events")


def sampling(**extra):
    return {"max_tokens": TOKENS, "ignore_eos": True, "temperature": 0.0, **extra}


def token_ids(messages) -> list[int]:
    return [t for m in messages for t in m.token_ids]


async def test_tokens_that_piled_up_come_in_one_message_as_alone(servicer, watched):
    _, watch = watched
    alone = await read(servicer, generate_request("alone", logprobs=True, **sampling()))
    piled = await read(servicer, generate_request("piled", logprobs=True, **sampling()), watch)
    # The first message, then everything else: usage and finish come in the same.
    assert len(piled) == 2
    assert token_ids(piled) == token_ids(alone)
    assert len(token_ids(piled)) == TOKENS
    assert "".join(m.text for m in piled) == "".join(m.text for m in alone)
    assert [lp.token_id for m in piled for lp in m.logprobs] == token_ids(alone)
    last = piled[-1]
    assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert (last.usage.completion_tokens, last.computed_prompt_tokens) == (
        TOKENS,
        alone[-1].computed_prompt_tokens,
    )
    assert not piled[0].HasField("usage")


async def test_a_pile_past_the_bound_comes_in_bounded_messages(servicer, watched):
    """The worst case, a reader that took nothing until vLLM was done: the pile
    goes out in messages of READY_LIMIT chunks at most (tests/unit/engine/
    test_vllm_ready_items.py), and no token is lost."""
    _, watch = watched
    many = 3 * READY_LIMIT + 10
    alone = await read(servicer, generate_request("pile-alone", **sampling(max_tokens=many)))
    messages = await read(servicer, generate_request("pile", **sampling(max_tokens=many)), watch)
    assert 2 < len(messages) < len(alone)
    assert token_ids(messages) == token_ids(alone)
    assert messages[-1].usage.completion_tokens == many
    assert messages[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH


async def test_each_sample_gets_its_own_merged_message(servicer, watched):
    _, watch = watched
    # Both samples' chunks (one a token each) and the usage chunk fit in one message's bound.
    tokens = READY_LIMIT // 2 - 1
    request = generate_request("n2", n=2, seed=3, temperature=1.0, max_tokens=tokens)
    request.sampling.ignore_eos = True
    messages = await read(servicer, request, watch)
    # The first chunks' (one sample's first token, or both's), then one for each sample.
    assert len(messages) <= 4
    for index in (0, 1):
        own = [m for m in messages if m.index == index]
        assert sum(len(m.token_ids) for m in own) == tokens
        assert own[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert own[-1].usage.completion_tokens == tokens


async def test_an_abort_after_tokens_piled_up_sends_them_and_the_abort(servicer, watched):
    _, watch = watched
    context = Context()
    long = 1500  # far from done when the abort comes
    request = generate_request("aborted", max_tokens=long, ignore_eos=True, temperature=0.0)
    messages = []
    async for message in servicer.Generate(request, context):
        messages.append(message)
        if len(messages) == 1:
            await more_events(watch, 4)
            await servicer.Abort(request, context)
    assert len(messages) == 2  # the first token, then what piled up with the abort
    last = messages[-1]
    assert last.finish_reason == common_pb2.FINISH_REASON_ABORT
    delivered = len(token_ids(messages))
    assert 1 + 4 <= delivered < long
    assert last.usage.completion_tokens == delivered
