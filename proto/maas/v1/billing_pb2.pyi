from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Granularity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRANULARITY_UNSPECIFIED: _ClassVar[Granularity]
    GRANULARITY_HOUR: _ClassVar[Granularity]
    GRANULARITY_DAY: _ClassVar[Granularity]
GRANULARITY_UNSPECIFIED: Granularity
GRANULARITY_HOUR: Granularity
GRANULARITY_DAY: Granularity

class GetUsageRequest(_message.Message):
    __slots__ = ("tenant", "start", "end", "granularity")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    GRANULARITY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    start: int
    end: int
    granularity: Granularity
    def __init__(self, tenant: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., granularity: _Optional[_Union[Granularity, str]] = ...) -> None: ...

class ModelUsage(_message.Message):
    __slots__ = ("model", "requests", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "cost_nano_usd")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_NANO_USD_FIELD_NUMBER: _ClassVar[int]
    model: str
    requests: int
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    cost_nano_usd: int
    def __init__(self, model: _Optional[str] = ..., requests: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cost_nano_usd: _Optional[int] = ...) -> None: ...

class UsageBucket(_message.Message):
    __slots__ = ("start", "requests", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "cost_nano_usd")
    START_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_NANO_USD_FIELD_NUMBER: _ClassVar[int]
    start: int
    requests: int
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    cost_nano_usd: int
    def __init__(self, start: _Optional[int] = ..., requests: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cost_nano_usd: _Optional[int] = ...) -> None: ...

class GetUsageResponse(_message.Message):
    __slots__ = ("tenant", "requests", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "total_tokens", "models", "cost_nano_usd", "buckets", "adapters")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    COST_NANO_USD_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    requests: int
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    models: _containers.RepeatedCompositeFieldContainer[ModelUsage]
    cost_nano_usd: int
    buckets: _containers.RepeatedCompositeFieldContainer[UsageBucket]
    adapters: _containers.RepeatedCompositeFieldContainer[ModelUsage]
    def __init__(self, tenant: _Optional[str] = ..., requests: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., models: _Optional[_Iterable[_Union[ModelUsage, _Mapping]]] = ..., cost_nano_usd: _Optional[int] = ..., buckets: _Optional[_Iterable[_Union[UsageBucket, _Mapping]]] = ..., adapters: _Optional[_Iterable[_Union[ModelUsage, _Mapping]]] = ...) -> None: ...

class ListLineItemsRequest(_message.Message):
    __slots__ = ("tenant", "start", "end", "limit", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    start: int
    end: int
    limit: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class LineItem(_message.Message):
    __slots__ = ("request_id", "model", "key_id", "time", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "cost_nano_usd", "deployment", "adapter")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_NANO_USD_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    key_id: str
    time: float
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    cost_nano_usd: int
    deployment: str
    adapter: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., key_id: _Optional[str] = ..., time: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cost_nano_usd: _Optional[int] = ..., deployment: _Optional[str] = ..., adapter: _Optional[str] = ...) -> None: ...

class ListLineItemsResponse(_message.Message):
    __slots__ = ("items", "next_page_token")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[LineItem]
    next_page_token: str
    def __init__(self, items: _Optional[_Iterable[_Union[LineItem, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
