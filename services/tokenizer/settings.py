import os

from pydantic import BaseModel, ConfigDict, Field

from maas_services.common.grammar.worker import WorkerLimits
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.common.settings import ServiceSettings


class TokenizerSource(BaseModel):
    """Where one deployment's tokenizer is: a GGUF file or a Hugging Face folder."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    max_model_len: int = Field(0, ge=0, description="override the model's context length")


class TokenizerSettings(ServiceSettings):
    model_id: str = Field(
        DEFAULT_MODEL_ID, description="the default deployment: requests that name none get it"
    )
    model_path: str = Field("", description="GGUF file or HF folder; empty = bundled SmolLM2")
    max_model_len: int = Field(0, ge=0, description="override the model's context length")
    tokenizer_models: dict[str, TokenizerSource] = Field(
        {},
        description='more deployments, JSON: {"qwen": {"path": "/models/qwen", "max_model_len": 0}}'
        " (docs/tokenizer.md)",
    )
    max_resident_tokenizers: int = Field(
        4, ge=1, description="--tokenizer-models loaded at once; the least recently used goes"
    )
    encode_threads: int = Field(
        default_factory=lambda: min(4, os.cpu_count() or 1),
        ge=1,
        description="threads that render and encode prompts (default: the cores, at most 4)",
    )
    encode_queue: int = Field(
        64, ge=0, description="requests that may wait for an encode thread; more are refused"
    )
    grammar_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a grammar compile still running after this is killed and refused",
    )
    grammar_memory_mb: int = Field(
        1024, ge=64, description="memory a grammar compile may add to its worker process"
    )
    grammar_budget_s_per_minute: float = Field(
        30.0, gt=0, description="CPU seconds of grammar compile each tenant may use a minute"
    )
    grammar_max_in_flight: int = Field(
        16, ge=1, description="grammar compiles running or waiting at once, all tenants"
    )
    grammar_cache_mb: int = Field(64, ge=0, description="compiled grammars kept, all tenants")
    grammar_tenant_cache_mb: int = Field(
        8, ge=0, description="compiled grammars kept for one tenant"
    )

    def grammar_limits(self) -> WorkerLimits:
        return WorkerLimits(
            deadline_s=self.grammar_timeout_s, memory_bytes=self.grammar_memory_mb << 20
        )
