from maas.v1 import common_pb2 as _common_pb2
from maas.v1 import tokenizer_pb2 as _tokenizer_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CompletionOptions(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop", "min_tokens", "ignore_eos", "user", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "response_format")
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
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
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
    response_format: ResponseFormat
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., min_tokens: _Optional[int] = ..., ignore_eos: _Optional[bool] = ..., user: _Optional[str] = ..., guided_json: _Optional[str] = ..., guided_regex: _Optional[str] = ..., guided_choice: _Optional[_Iterable[str]] = ..., guided_grammar: _Optional[str] = ..., response_format: _Optional[_Union[ResponseFormat, _Mapping]] = ...) -> None: ...

class ResponseFormat(_message.Message):
    __slots__ = ("type", "json_schema")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    type: str
    json_schema: JsonSchemaFormat
    def __init__(self, type: _Optional[str] = ..., json_schema: _Optional[_Union[JsonSchemaFormat, _Mapping]] = ...) -> None: ...

class JsonSchemaFormat(_message.Message):
    __slots__ = ("name", "description", "schema", "strict")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    schema: str
    strict: bool
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., schema: _Optional[str] = ..., strict: _Optional[bool] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("type", "function")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    type: str
    function: FunctionDefinition
    def __init__(self, type: _Optional[str] = ..., function: _Optional[_Union[FunctionDefinition, _Mapping]] = ...) -> None: ...

class FunctionDefinition(_message.Message):
    __slots__ = ("name", "description", "parameters")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters: _Optional[str] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("mode", "function")
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    mode: str
    function: str
    def __init__(self, mode: _Optional[str] = ..., function: _Optional[str] = ...) -> None: ...

class ChatCompletionRequest(_message.Message):
    __slots__ = ("model", "messages", "options", "tools", "tool_choice")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    model: str
    messages: _containers.RepeatedCompositeFieldContainer[_tokenizer_pb2.ChatMessage]
    options: CompletionOptions
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    tool_choice: ToolChoice
    def __init__(self, model: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_tokenizer_pb2.ChatMessage, _Mapping]]] = ..., options: _Optional[_Union[CompletionOptions, _Mapping]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ...) -> None: ...

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
    __slots__ = ("id", "model", "text", "finish_reason", "usage", "tool_calls")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    text: str
    finish_reason: _common_pb2.FinishReason
    usage: _common_pb2.Usage
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCallDelta]
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCallDelta, _Mapping]]] = ...) -> None: ...

class ToolCallDelta(_message.Message):
    __slots__ = ("index", "id", "type", "name", "arguments")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    type: str
    name: str
    arguments: str
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., type: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Model(_message.Message):
    __slots__ = ("id", "owned_by", "created", "max_model_len", "parent")
    ID_FIELD_NUMBER: _ClassVar[int]
    OWNED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    id: str
    owned_by: str
    created: int
    max_model_len: int
    parent: str
    def __init__(self, id: _Optional[str] = ..., owned_by: _Optional[str] = ..., created: _Optional[int] = ..., max_model_len: _Optional[int] = ..., parent: _Optional[str] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[Model]
    def __init__(self, models: _Optional[_Iterable[_Union[Model, _Mapping]]] = ...) -> None: ...
