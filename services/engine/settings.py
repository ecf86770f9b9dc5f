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
    max_model_len: int = Field(0, ge=0, description="cap the model's context length (0 = model's)")
    torch_threads: int = Field(0, ge=0, description="intra-op threads; 0 = torch's default")
    block_size: int = Field(16, gt=0, description="tokens per KV-cache block")
    kv_cache_memory: int = Field(
        0, ge=0, description="bytes for the KV cache; 0 = derive from memory utilization"
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="fraction of device memory (CPU: of the budget) to use"
    )
    cpu_memory_budget: int = Field(
        2 * 1024**3, gt=0, description="bytes the engine may use on CPU, weights included"
    )
    max_num_seqs: int = Field(64, gt=0, description="sequences in one batch at most")
    max_num_batched_tokens: int = Field(2048, gt=0, description="tokens computed per step")
    enable_chunked_prefill: bool = Field(True, description="split long prompts across steps")
    cache_salt: str = Field("", description="prefix-cache hash salt; empty = model id")
    speculative_method: Literal["", "ngram"] = Field(
        "", description="speculative decoding proposer for requests that opt in; empty = off"
    )
    num_speculative_tokens: int = Field(4, gt=0, le=16, description="draft tokens per step")
    speculative_max_batch: int = Field(
        8, gt=0, description="no speculation when more sequences than this are running"
    )
