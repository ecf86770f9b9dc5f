"""The four attacks of issue 31, each run in its own process against a local stack.

An attack is what a caller with a valid key (or, for the gRPC slots, no key)
can do from outside; it records only what it sees: the status of each answer
and how long the server took to give it. Each runs in a separate process
(run_attack) so its client work does not stall the victim's event loop in
the benchmark's process, and every loop in it is bounded in count and by
Sizes.attack_seconds. Traffic goes only to the stack on 127.0.0.1.

- grammars: concurrent chat requests carrying the issue's 287-character EBNF,
  each left to run until the server answers (or the time cap);
- bodies: many connections each uploading a ~4 MiB chat request (an unknown
  padding field) one after another until stopped;
- grpc: tenant gRPC calls without a key that send no message, held open until
  stopped (the server may end them first);
- queue: a tenant allowed hundreds of requests in flight keeps that many
  outstanding until stopped, to fill the deployment's admission queue.
"""

import asyncio
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import httpx

# The issue's grammar: ten rules `rN ::= [^"\nab]{4,128}` and a root choosing one (287 characters).
GRAMMAR = "\n".join(
    [
        "root ::= " + " | ".join(f"r{i}" for i in range(10)),
        *(f'r{i} ::= [^"\\nab]{{4,128}}' for i in range(10)),
    ]
)
CHAT_PATH = "/v1/chat/completions"
GRPC_CHAT = "/maas.v1.Gateway/ChatCompletion"
# How long requests under way when the victim is done may take to be answered.
STOP_GRACE_SECONDS = 10.0


@dataclass
class Target:
    """Where the stack listens and the keys the attackers hold."""

    http_url: str
    grpc_address: str
    model: str
    attacker_key: str
    flooder_key: str


@dataclass
class Sizes:
    grammar_requests: int = 4
    body_connections: int = 150
    body_bytes: int = 4 * 1024 * 1024
    body_rounds: int = 10  # uploads per connection at most
    grpc_calls: int = 1100
    grpc_calls_per_channel: int = 100
    flood_requests: int = 400
    flood_rounds: int = 50  # requests per flooding worker at most
    flood_max_tokens: int = 16
    flood_warmup_seconds: float = 5.0
    attack_seconds: float = 120.0  # one attack's whole run, at most


@dataclass
class Outcome:
    """What the attacker saw: each answer's status and time, and the requests still
    waiting for one when the attack ended (unanswered)."""

    sent: int = 0
    statuses: Counter = field(default_factory=Counter)
    answer_seconds: list[float] = field(default_factory=list)
    unanswered: int = 0

    def answered(self, status: str, started: float) -> None:
        self.statuses[status] += 1
        self.answer_seconds.append(time.perf_counter() - started)

    def summary(self) -> dict:
        seconds = sorted(self.answer_seconds)
        return {
            "sent": self.sent,
            "statuses": dict(sorted(self.statuses.items())),
            "answered": len(seconds),
            "unanswered": self.unanswered,
            "answer_p50_s": round(statistics.median(seconds), 3) if seconds else None,
            "answer_max_s": round(seconds[-1], 3) if seconds else None,
        }


class Stop:
    """The benchmark's stop signal (a multiprocessing Event) or the attack's time cap."""

    def __init__(self, event, seconds: float):
        self._event = event
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.0)

    def is_set(self) -> bool:
        return self._event.is_set() or not self.left()

    async def wait(self, at_most: float | None = None) -> None:
        until = time.monotonic() + (self.left() if at_most is None else at_most)
        while not self.is_set() and time.monotonic() < until:
            await asyncio.sleep(0.1)


async def _settle(tasks: list[asyncio.Task], seconds: float) -> None:
    """Wait up to `seconds` for the tasks, then cancel the rest (their requests count
    themselves unanswered)."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=seconds)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def _post(client: httpx.AsyncClient, body: dict, outcome: Outcome) -> int | None:
    outcome.sent += 1
    started = time.perf_counter()
    try:
        response = await client.post(CHAT_PATH, json=body)
    except httpx.TimeoutException:
        outcome.unanswered += 1
        return None
    except asyncio.CancelledError:
        outcome.unanswered += 1
        raise
    except httpx.HTTPError as error:
        outcome.answered(type(error).__name__, started)
        return None
    outcome.answered(str(response.status_code), started)
    return response.status_code


def _client(target: Target, key: str, sizes: Sizes, connections: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=target.http_url,
        headers={"Authorization": f"Bearer {key}"},
        timeout=httpx.Timeout(sizes.attack_seconds, connect=10.0),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


async def grammars(target: Target, sizes: Sizes, ready: Callable, stop: Stop) -> Outcome:
    """The grammar requests at once; each runs to its answer, whatever the victim does."""
    outcome = Outcome()
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": "Write anything."}],
        "max_tokens": 16,
        "guided_grammar": GRAMMAR,
    }
    async with _client(target, target.attacker_key, sizes, sizes.grammar_requests) as client:
        tasks = [
            asyncio.create_task(_post(client, body, outcome)) for _ in range(sizes.grammar_requests)
        ]
        await asyncio.sleep(0.5)  # let them reach the gateway before the victim starts
        ready()
        await _settle(tasks, stop.left())
    return outcome


def _body_request(target: Target, sizes: Sizes) -> bytes:
    host = target.http_url.split("//", 1)[1]
    chat = {
        "model": target.model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 1,
        "padding": "",
    }
    padding = sizes.body_bytes - len(json.dumps(chat))
    body = json.dumps({**chat, "padding": "x" * max(padding, 0)}).encode()
    head = (
        f"POST {CHAT_PATH} HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {target.attacker_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


async def _upload(host: str, port: int, request: bytes, outcome: Outcome, stop: Stop) -> None:
    """One connection's uploads, one after another, in 64 KiB writes (so all progress at once)."""
    outcome.sent += 1
    started = time.perf_counter()
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        view = memoryview(request)
        try:
            for offset in range(0, len(view), 65536):
                writer.write(view[offset : offset + 65536])
                await writer.drain()
        except ConnectionError:
            pass  # answered (and closed) before the whole body: the answer is read below
        line = await asyncio.wait_for(reader.readline(), stop.left() or 0.01)
        if line:
            outcome.answered(line.split()[1].decode(), started)
        else:
            outcome.answered("closed", started)
    except TimeoutError:
        outcome.unanswered += 1
    except asyncio.CancelledError:
        outcome.unanswered += 1
        raise
    except ConnectionError as error:
        outcome.answered(type(error).__name__, started)
    finally:
        if writer is not None:
            writer.close()


async def bodies(target: Target, sizes: Sizes, ready: Callable, stop: Stop) -> Outcome:
    outcome = Outcome()
    request = _body_request(target, sizes)
    host, port = target.http_url.split("//", 1)[1].split(":")

    async def connection() -> None:
        for _ in range(sizes.body_rounds):
            if stop.is_set():
                return
            await _upload(host, int(port), request, outcome, stop)

    tasks = [asyncio.create_task(connection()) for _ in range(sizes.body_connections)]
    ready()
    await stop.wait()
    # Uploads under way get a moment to be answered; one the server holds is unanswered.
    await _settle(tasks, min(stop.left(), STOP_GRACE_SECONDS))
    return outcome


async def _never_sends():
    """A request iterator that never yields: the call's headers go out, no message ever does."""
    await asyncio.Event().wait()
    yield b""


async def grpc_slots(target: Target, sizes: Sizes, ready: Callable, stop: Stop) -> Outcome:
    """Keyless calls that send nothing, grpc_calls_per_channel to a connection (below any
    cap the server puts on one connection's streams)."""
    outcome = Outcome()
    channel_count = -(-sizes.grpc_calls // sizes.grpc_calls_per_channel)
    channels = [
        # A subchannel of its own each: grpc would otherwise share one connection among them.
        grpc.aio.insecure_channel(
            target.grpc_address, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(channel_count)
    ]

    async def hold(channel: grpc.aio.Channel) -> None:
        outcome.sent += 1
        started = time.perf_counter()
        call = channel.stream_stream(GRPC_CHAT)(_never_sends())
        try:
            code = await call.code()
        except asyncio.CancelledError:
            outcome.unanswered += 1
            raise
        outcome.answered(code.name, started)

    try:
        tasks = [
            asyncio.create_task(hold(channels[index % channel_count]))
            for index in range(sizes.grpc_calls)
        ]
        await asyncio.sleep(1.0)  # the calls' headers reach the server
        ready()
        await stop.wait()
        await _settle(tasks, 0)
    finally:
        for channel in channels:
            await channel.close()
    return outcome


async def queue(target: Target, sizes: Sizes, ready: Callable, stop: Stop) -> Outcome:
    """Every worker keeps one request outstanding; after a refusal it waits 0.2 s, so the
    flood fills the queue rather than the machine's two cores with refusals."""
    outcome = Outcome()

    async def worker(client: httpx.AsyncClient, index: int) -> None:
        body = {
            "model": target.model,
            "messages": [{"role": "user", "content": f"Count from {index} to {index + 20}."}],
            "max_tokens": sizes.flood_max_tokens,
        }
        for _ in range(sizes.flood_rounds):
            if stop.is_set():
                return
            if await _post(client, body, outcome) != 200:
                await stop.wait(0.2)

    async with _client(target, target.flooder_key, sizes, sizes.flood_requests) as client:
        tasks = [asyncio.create_task(worker(client, i)) for i in range(sizes.flood_requests)]
        await stop.wait(sizes.flood_warmup_seconds)
        ready()
        await stop.wait()
        await _settle(tasks, 0)
    return outcome


ATTACKS = {"grammars": grammars, "bodies": bodies, "grpc": grpc_slots, "queue": queue}


def run_attack(name: str, target: Target, sizes: Sizes, ready_event, stop_event, results) -> None:
    """A process's entry: run one attack, set ready_event once it is under way, put its summary."""
    stop = Stop(stop_event, sizes.attack_seconds)
    outcome = asyncio.run(ATTACKS[name](target, sizes, ready_event.set, stop))
    results.put(outcome.summary())
