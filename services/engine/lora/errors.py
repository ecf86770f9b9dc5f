"""Why an adapter cannot be loaded or used: the servicer maps each to its gRPC status
(engine.proto's LoadAdapter and Generate), the HTTP fronts to an OpenAI error."""


class AdapterError(Exception):
    """Base of every adapter refusal; str() is the message the caller sees."""


class LoraDisabled(AdapterError):
    """The engine serves no adapters (max_loras 0): FAILED_PRECONDITION."""


class AdapterInvalid(AdapterError):
    """The folder is not an adapter this engine can serve (rank above --max-lora-rank,
    target modules the model lacks, shapes that do not fit, a missing or corrupt file):
    INVALID_ARGUMENT, and nothing of it is kept."""


class AdapterSlotsFull(AdapterError):
    """Every adapter slot holds an adapter a running request uses: RESOURCE_EXHAUSTED."""


class AdapterNotFound(AdapterError):
    """A request names an adapter this engine has not loaded (or is unloading): NOT_FOUND."""
