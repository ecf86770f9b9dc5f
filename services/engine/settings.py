from typing import Literal

from pydantic import Field

from services.common.model_files import DEFAULT_MODEL_ID
from services.common.settings import ServiceSettings


class EngineSettings(ServiceSettings):
    model_id: str = Field(DEFAULT_MODEL_ID, description="model name clients use")
    model_path: str = Field("", description="GGUF file or HF folder; empty = bundled SmolLM2")
    engine_id: str = Field("", description="name in logs and KV events; empty = host:port")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto = bfloat16 on CUDA or a CPU with native bf16, else float32"
    )
    device: str = Field("auto", description="auto, cpu or cuda[:N]")
    max_model_len: int = Field(0, ge=0, description="override the model's context length")
    torch_threads: int = Field(0, ge=0, description="intra-op threads; 0 = torch's default")
