import os

from pydantic import Field

from services.common.model_files import DEFAULT_MODEL_ID
from services.common.settings import ServiceSettings


class TokenizerSettings(ServiceSettings):
    model_id: str = Field(DEFAULT_MODEL_ID, description="model name clients use")
    model_path: str = Field("", description="GGUF file or HF folder; empty = bundled SmolLM2")
    max_model_len: int = Field(0, ge=0, description="override the model's context length")
    encode_threads: int = Field(
        default_factory=lambda: min(4, os.cpu_count() or 1),
        ge=1,
        description="threads that render and encode prompts (default: the cores, at most 4)",
    )
    encode_queue: int = Field(
        64, ge=0, description="requests that may wait for an encode thread; more are refused"
    )
    grammar_timeout_s: float = Field(
        10.0, gt=0, description="a grammar that takes longer to compile is refused"
    )
