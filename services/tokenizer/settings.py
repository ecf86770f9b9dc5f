from pydantic import Field

from services.common.model_files import DEFAULT_MODEL_ID
from services.common.settings import ServiceSettings


class TokenizerSettings(ServiceSettings):
    model_id: str = Field(DEFAULT_MODEL_ID, description="model name clients use")
    model_path: str = Field("", description="GGUF file or HF folder; empty = bundled SmolLM2")
    max_model_len: int = Field(0, ge=0, description="override the model's context length")
