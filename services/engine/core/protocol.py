"""The messages between the serving process and the engine core, and their codec.

msgpack via msgspec. SamplingParams and SeqOutput are the engine's own
dataclasses, encoded generically (by their fields, whatever fields they
gain), so the wire format never lags the engine's types. Inputs are one
message each; the core answers with one StepBatch per engine step.

Adapter loads and unloads (LoadAdapter, UnloadAdapter) are answered one each,
by token, with an AdapterAnswer sent after the batch that shows the new set of
adapters: a caller told "loaded" finds the adapter in the load report. The set
itself is not asked for: it rides in Ready and in each StepBatch it changed
before, so GetLoad reads it with no round trip to the core.
"""

import msgspec

from maas_services.engine.lora.loaded import LoadedAdapter
from maas_services.engine.request import SeqOutput
from maas_services.engine.sampling_params import SamplingParams

# StepBatch.kv_events' kinds (engine.proto's KvEvent kinds): the block manager's, each
# with block hashes (blocks cached, blocks dropped, the whole cache emptied), and an
# adapter that new requests may now name, or may no longer, with its name.
STORED = "stored"
EVICTED = "evicted"
CLEARED = "cleared"
ADAPTER_LOADED = "adapter_loaded"
ADAPTER_UNLOADED = "adapter_unloaded"
# (kind, block hashes) or (adapter kind, adapter name).
KvEvent = tuple[str, list[int] | str]


class Add(msgspec.Struct, tag=True):
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    priority: int = 0
    tenant: str = ""
    share_prefix_cache: bool = False
    adapter: str = ""  # empty: the base model


class Abort(msgspec.Struct, tag=True):
    request_id: str


class KvSnapshot(msgspec.Struct, tag=True):
    """Asks for every cached block hash, for the subscriber named by token."""

    token: int


class LoadAdapter(msgspec.Struct, tag=True):
    token: int
    name: str
    source: str  # the PEFT folder, on the core's file system


class UnloadAdapter(msgspec.Struct, tag=True):
    token: int
    name: str


class Shutdown(msgspec.Struct, tag=True):
    pass


Input = Add | Abort | KvSnapshot | LoadAdapter | UnloadAdapter | Shutdown


class Ready(msgspec.Struct, tag=True):
    """The model is loaded and the core takes requests: what the server reports of it."""

    max_model_len: int
    max_num_seqs: int
    block_size: int
    cache_salt: str
    prefix_cache_sharing: str
    num_blocks: int
    # Why the start-up known-answer check failed (services/engine/known_answer.py):
    # the server then stays NOT_SERVING. Empty: it passed, or was off.
    known_answer_failure: str = ""
    # Distinct adapters one step may hold (0: no adapters served), and those
    # loaded at start (--lora-modules).
    max_loras: int = 0
    adapters: list[str] = []


class Load(msgspec.Struct):
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    # The adapters of running and of waiting requests (vllm:lora_requests_info).
    running_adapters: list[str] = []
    waiting_adapters: list[str] = []


class Failure(msgspec.Struct):
    request_id: str
    message: str
    # False: this request alone could not be added (INVALID_ARGUMENT). True: a
    # step failed that could not be pinned on one request (INTERNAL).
    engine: bool = False
    # The AdapterError subclass' name (services/engine/lora/errors.py) when
    # that is why, e.g. AdapterNotFound: the request named an adapter not loaded.
    adapter_error: str = ""


class StepBatch(msgspec.Struct, tag=True):
    """Everything one step (and the inputs before it) produced, in delivery order:
    metrics, requests that entered the step, outputs, failures, then KV-cache changes
    (with the adapters loaded or unloaded: engine_core.py)."""

    load: Load
    scheduled: list[str] = []
    outputs: list[SeqOutput] = []
    failures: list[Failure] = []
    kv_events: list[KvEvent] = []
    # The core's maas_engine_* metrics in the Prometheus text format, now and
    # then; applied before the outputs, so a client that got its last token
    # finds that token counted.
    metrics: bytes = b""
    # The adapters loaded, when that changed since the batch before; None: unchanged.
    adapters: list[str] | None = None


class KvHashes(msgspec.Struct, tag=True):
    """KvSnapshot's answer: every cached block, and the adapters loaded, after the
    batches sent before it."""

    token: int
    hashes: list[int]
    adapters: list[str] = []


class AdapterAnswer(msgspec.Struct, tag=True):
    """LoadAdapter's or UnloadAdapter's answer, by the request's token."""

    token: int
    loaded: LoadedAdapter | None = None  # a load that succeeded
    found: bool = False  # an unload: whether the adapter was loaded
    # A refusal: the AdapterError subclass' name and its message.
    error: str = ""
    message: str = ""


Output = Ready | StepBatch | KvHashes | AdapterAnswer

encode = msgspec.msgpack.Encoder().encode
decode_input = msgspec.msgpack.Decoder(Input).decode
decode_output = msgspec.msgpack.Decoder(Output).decode
