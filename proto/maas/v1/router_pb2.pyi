from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HeldReport(_message.Message):
    __slots__ = ("gateway_id", "held", "ttl_seconds")
    class HeldEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    gateway_id: str
    held: _containers.ScalarMap[str, int]
    ttl_seconds: float
    def __init__(self, gateway_id: _Optional[str] = ..., held: _Optional[_Mapping[str, int]] = ..., ttl_seconds: _Optional[float] = ...) -> None: ...

class HeldReportResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PickRequest(_message.Message):
    __slots__ = ("request_id", "model", "token_ids", "tenant", "session_id", "exclude_endpoint_ids", "share_prefix_cache", "serve", "adapter")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_ENDPOINT_IDS_FIELD_NUMBER: _ClassVar[int]
    SHARE_PREFIX_CACHE_FIELD_NUMBER: _ClassVar[int]
    SERVE_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    tenant: str
    session_id: str
    exclude_endpoint_ids: _containers.RepeatedScalarFieldContainer[str]
    share_prefix_cache: bool
    serve: str
    adapter: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., tenant: _Optional[str] = ..., session_id: _Optional[str] = ..., exclude_endpoint_ids: _Optional[_Iterable[str]] = ..., share_prefix_cache: _Optional[bool] = ..., serve: _Optional[str] = ..., adapter: _Optional[str] = ...) -> None: ...

class PickResponse(_message.Message):
    __slots__ = ("endpoint_id", "address")
    ENDPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    endpoint_id: str
    address: str
    def __init__(self, endpoint_id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("request_id", "endpoint_id", "success")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    endpoint_id: str
    success: bool
    def __init__(self, request_id: _Optional[str] = ..., endpoint_id: _Optional[str] = ..., success: _Optional[bool] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolStatsRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class ReplicaStats(_message.Message):
    __slots__ = ("endpoint_id", "address", "ready", "draining", "running", "waiting", "in_flight", "kv_cache_usage", "max_num_seqs", "kv_cache_blocks", "block_size", "kv_events_live", "indexed_blocks", "adapters", "max_loras")
    ENDPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_EVENTS_LIVE_FIELD_NUMBER: _ClassVar[int]
    INDEXED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    MAX_LORAS_FIELD_NUMBER: _ClassVar[int]
    endpoint_id: str
    address: str
    ready: bool
    draining: bool
    running: int
    waiting: int
    in_flight: int
    kv_cache_usage: float
    max_num_seqs: int
    kv_cache_blocks: int
    block_size: int
    kv_events_live: bool
    indexed_blocks: int
    adapters: _containers.RepeatedScalarFieldContainer[str]
    max_loras: int
    def __init__(self, endpoint_id: _Optional[str] = ..., address: _Optional[str] = ..., ready: _Optional[bool] = ..., draining: _Optional[bool] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., in_flight: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., max_num_seqs: _Optional[int] = ..., kv_cache_blocks: _Optional[int] = ..., block_size: _Optional[int] = ..., kv_events_live: _Optional[bool] = ..., indexed_blocks: _Optional[int] = ..., adapters: _Optional[_Iterable[str]] = ..., max_loras: _Optional[int] = ...) -> None: ...

class DeploymentStats(_message.Message):
    __slots__ = ("model", "replicas", "queue_depth", "ready_replicas", "running", "in_flight", "capacity", "kv_cache_usage", "routing_policy", "held", "serves", "adapters")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    READY_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_POLICY_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    SERVES_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    model: str
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStats]
    queue_depth: int
    ready_replicas: int
    running: int
    in_flight: int
    capacity: int
    kv_cache_usage: float
    routing_policy: str
    held: int
    serves: _containers.RepeatedScalarFieldContainer[str]
    adapters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStats, _Mapping]]] = ..., queue_depth: _Optional[int] = ..., ready_replicas: _Optional[int] = ..., running: _Optional[int] = ..., in_flight: _Optional[int] = ..., capacity: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., routing_policy: _Optional[str] = ..., held: _Optional[int] = ..., serves: _Optional[_Iterable[str]] = ..., adapters: _Optional[_Iterable[str]] = ...) -> None: ...

class PoolStats(_message.Message):
    __slots__ = ("deployments",)
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    deployments: _containers.RepeatedCompositeFieldContainer[DeploymentStats]
    def __init__(self, deployments: _Optional[_Iterable[_Union[DeploymentStats, _Mapping]]] = ...) -> None: ...
