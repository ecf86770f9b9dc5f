from maas.v1 import common_pb2 as _common_pb2
from maas.v1 import tokenizer_pb2 as _tokenizer_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CompletionOptions(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop", "min_tokens", "ignore_eos", "user", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    GUIDED_JSON_FIELD_NUMBER: _ClassVar[int]
    GUIDED_REGEX_FIELD_NUMBER: _ClassVar[int]
    GUIDED_CHOICE_FIELD_NUMBER: _ClassVar[int]
    GUIDED_GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    min_tokens: int
    ignore_eos: bool
    user: str
    guided_json: str
    guided_regex: str
    guided_choice: _containers.RepeatedScalarFieldContainer[str]
    guided_grammar: str
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., min_tokens: _Optional[int] = ..., ignore_eos: _Optional[bool] = ..., user: _Optional[str] = ..., guided_json: _Optional[str] = ..., guided_regex: _Optional[str] = ..., guided_choice: _Optional[_Iterable[str]] = ..., guided_grammar: _Optional[str] = ...) -> None: ...

class ChatCompletionRequest(_message.Message):
    __slots__ = ("model", "messages", "options")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    model: str
    messages: _containers.RepeatedCompositeFieldContainer[_tokenizer_pb2.ChatMessage]
    options: CompletionOptions
    def __init__(self, model: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_tokenizer_pb2.ChatMessage, _Mapping]]] = ..., options: _Optional[_Union[CompletionOptions, _Mapping]] = ...) -> None: ...

class CompletionRequest(_message.Message):
    __slots__ = ("model", "prompt", "options")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: str
    options: CompletionOptions
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[str] = ..., options: _Optional[_Union[CompletionOptions, _Mapping]] = ...) -> None: ...

class CompletionChunk(_message.Message):
    __slots__ = ("id", "model", "text", "finish_reason", "usage")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    text: str
    finish_reason: _common_pb2.FinishReason
    usage: _common_pb2.Usage
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Model(_message.Message):
    __slots__ = ("id", "owned_by", "created", "max_model_len")
    ID_FIELD_NUMBER: _ClassVar[int]
    OWNED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    id: str
    owned_by: str
    created: int
    max_model_len: int
    def __init__(self, id: _Optional[str] = ..., owned_by: _Optional[str] = ..., created: _Optional[int] = ..., max_model_len: _Optional[int] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[Model]
    def __init__(self, models: _Optional[_Iterable[_Union[Model, _Mapping]]] = ...) -> None: ...
