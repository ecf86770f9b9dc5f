from typing import Literal

from pydantic import Field, field_validator, model_validator

from maas_services.common.block_hash import BLOCK_SIZE
from maas_services.common.defaults import (
    MAX_CPU_LORAS,
    MAX_LORA_RANK,
    MAX_LORAS,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
)
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.common.quantization_methods import QuantizationMethod
from maas_services.common.serves import DEFAULT_SERVES, KINDS
from maas_services.common.settings import ServiceSettings
from maas_services.engine.quantization.config import GROUP_SIZES


class EngineSettings(ServiceSettings):
    backend: Literal["native", "vllm"] = Field(
        "native",
        description="native = our engine; vllm = serve maas.v1.Engine in front of the vLLM "
        "server at --vllm-url (services/engine/vllm_backend)",
    )
    vllm_url: str = Field("", description="--backend vllm: the vLLM OpenAI server's base URL")
    vllm_kv_events_endpoint: str = Field(
        "",
        description="--backend vllm: vLLM's ZeroMQ KV-event publisher to subscribe to "
        "(tcp://host:port); empty = no KV events",
    )
    vllm_startup_timeout: float = Field(
        600.0, gt=0, description="--backend vllm: seconds to wait for vLLM's /health"
    )
    serves: list[str] = Field(
        default_factory=list,
        description="what this engine serves: generate, embed or both (comma list); empty = "
        "the backend's default: both for native (embeddings batch beside generation), "
        "generate for vllm (a vLLM server runs one runner; embed fronts one started with "
        "its pooling runner: services/engine/vllm_backend/embeddings.py)",
    )
    model_id: str = Field(DEFAULT_MODEL_ID, description="model name clients use")
    model_path: str = Field("", description="GGUF file or HF folder; empty = bundled SmolLM2")
    engine_id: str = Field("", description="name in logs and KV events; empty = host:port")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="auto = per machine (services/engine/machine_defaults.py): bfloat16 on "
        "CUDA or a CPU with native bf16, else float32",
    )
    device: str = Field("auto", description="auto, cpu or cuda[:N]")
    enforce_eager: bool = Field(
        True,
        description="run the model eagerly; --no-enforce-eager compiles each layer's dense "
        "parts with torch.compile (services/engine/compiled_forward.py; no faster on an "
        "AVX2-only CPU, so off by default)",
    )
    native_layers: bool = Field(
        True,
        description="each decoder layer's dense halves as two native calls on a float32 CPU "
        "model (services/engine/native_layers.py); --no-native-layers keeps torch's ~90 calls "
        "a layer; the compiled forward (--no-enforce-eager) keeps its own",
    )
    wide_gemm: Literal["auto", "float32", "bf16", "int8"] = Field(
        "auto",
        description="the native layers' and LM head's matmuls at every step width: float32, "
        "or bf16 (activations and weights rounded to bf16, float32 sums, the same sums "
        "whatever the width; a CPU with AVX512-BF16 or AMX, float32 elsewhere; a float32 "
        "weight keeps a bf16 copy, half its bytes again, counted in the KV budget), or int8 "
        "(opt-in): a weight with its checkpoint's blocks (--kernel-weights checkpoint) "
        "multiplies every step by them on activations rounded to int8 per block of 32 "
        "(kernels/native/qdot.cpp's int8 kernel, a CPU with AVX512-VNNI; no bf16 copy; ~6x "
        "bf16's rounding of the activations, the same at every width), the others as bf16 "
        "(float32 without AVX512-BF16); auto = per CPU "
        "class, from a measured table (services/engine/machine_defaults.py)",
    )
    kernel_weights: Literal["auto", "float32", "checkpoint"] = Field(
        "auto",
        description="the weights the native layers and LM head multiply by: float32, or "
        "checkpoint: a float32 model loaded from a GGUF file also keeps the file's own "
        "Q4_0/Q4_1 and Q8_0 blocks, the same weights in an eighth or a quarter of the bytes, "
        "and multiplies decode steps of up to 32 rows by them (up to 8 rows through their "
        "row kernel, its activations as --kernel-activations says, wider through the panel "
        "GEMM dequantizing them, float32 activations; wider steps read the float32 weights; "
        "the blocks' bytes count in the KV budget); auto = per CPU class, from a measured table "
        "(services/engine/machine_defaults.py)",
    )
    kernel_activations: Literal["auto", "float32", "int16"] = Field(
        "auto",
        description="the activations the checkpoint's blocks (--kernel-weights checkpoint) "
        "multiply in their row kernel, up to 8 rows: float32, or int16: rounded per block "
        "of 32 (each moves by at most 1/65534 of its block's largest, finer than bf16) for "
        "integer dot products (kernels/native/qdot.cpp; --wide-gemm int8 rounds every step's "
        "to int8 instead); auto = per CPU class, from a measured table "
        "(services/engine/machine_defaults.py)",
    )
    kv_cache_dtype: Literal["auto", "model", "bf16"] = Field(
        "auto",
        description="the KV cache's entries: the model's dtype, or bf16 (each key and value "
        "rounded to bf16 as it is stored, read back as the model's dtype: half a float32 "
        "pool's bytes, so twice the tokens in the same memory and half the bytes a decode "
        "reads); auto = per CPU class, from a measured table (machine_defaults.py), the "
        "model's on CUDA",
    )
    max_model_len: int = Field(0, ge=0, description="cap the model's context length (0 = model's)")
    torch_threads: int = Field(
        0,
        ge=0,
        description="engine-core intra-op threads of a wide step (--compute-wide-rows), one "
        "fewer for a narrower one; 0 = auto: every physical core the process may run on "
        "(its CPU affinity, within a cgroup CPU limit)",
    )
    compute_wide_rows: int = Field(
        0,
        ge=0,
        description="rows a step computes (decode rows + prefill tokens) from which the core "
        "computes on all --torch-threads; narrower steps leave one core to the serving side; "
        "0 = auto: 1 (every step; measured in services/engine/machine_defaults.py); 32 suits "
        "a machine whose other work holds a core",
    )
    block_size: int = Field(BLOCK_SIZE, gt=0, description="tokens per KV-cache block")
    kv_cache_memory: int = Field(
        0, ge=0, description="bytes for the KV cache; 0 = derive from memory utilization"
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="fraction of device memory (CPU: of the budget) to use"
    )
    cpu_memory_budget: int = Field(
        2 * 1024**3, gt=0, description="bytes the engine may use on CPU, weights included"
    )
    max_num_seqs: int = Field(MAX_NUM_SEQS, gt=0, description="sequences in one batch at most")
    max_num_batched_tokens: int = Field(
        MAX_NUM_BATCHED_TOKENS, gt=0, description="tokens computed per step"
    )
    enable_chunked_prefill: bool = Field(True, description="split long prompts across steps")
    cache_salt: str = Field("", description="prefix-cache hash salt; empty = model id")
    prefix_cache_sharing: Literal["tenant", "global"] = Field(
        "tenant",
        description="tenant = every tenant's prefix cache is its own; global = requests "
        "that ask for it (share_prefix_cache) share cached blocks across tenants",
    )
    quantization: QuantizationMethod = Field(
        "none", description="weight-only quantization of the decoder's linear layers"
    )
    quantization_group_size: int = Field(
        64,
        description="int4 weights per scale and minimum: 32, 64 or 128 "
        "(32 on a Q4_0/Q4_1 GGUF keeps the file's blocks)",
    )
    quantization_activations: Literal["float32", "int8"] = Field(
        "int8",
        description="int8/int4 on the CPU at a few rows (decode): int8 rounds the "
        "activations per block of 32 for integer dot products, as llama.cpp's Q8 x Q4 "
        "(1.4-1.5x a batch-1 step, perplexity within 0.3%: docs/quantization.md)",
    )
    known_answer: str = Field(
        "cache",
        description="start-up known-answer check (services/engine/known_answer.py): the "
        "perplexity of fixed texts against cache = the float32 reference kept beside the "
        "model (computed once), a number = that reference (a ModelDeployment's), bound = "
        "only a sanity bound; off = no check",
    )
    known_answer_tolerance: float = Field(
        0.05,
        gt=0,
        description="how far (relative) the known-answer perplexity may be from the "
        "reference; bf16, int8 and vLLM measured within 1% (docs/engine.md); a quantized "
        "engine is allowed at least 150% (it serves other weights)",
    )
    speculative_method: Literal["", "ngram", "draft"] = Field(
        "", description="speculative decoding proposer for requests that opt in; empty = off"
    )
    speculative_draft_model: str = Field(
        "", description="draft model for --speculative-method draft (see maas distill-draft)"
    )
    speculative_draft_context: int = Field(
        1024, ge=64, description="tokens of context the draft model keeps per sequence"
    )
    num_speculative_tokens: int = Field(4, gt=0, le=16, description="draft tokens per step")
    speculative_max_batch: int = Field(
        0,
        ge=0,
        description="no speculation when more sequences than this are running; 0 = auto: "
        "per machine, where verifying the drafts stops being bound by reading the weights",
    )

    max_loras: int = Field(
        MAX_LORAS,
        ge=0,
        description="LoRA adapters one step may compute with (their requests batch together); "
        "0 = this engine serves no adapters (docs/lora.md)",
    )
    max_lora_rank: int = Field(
        MAX_LORA_RANK, gt=0, description="adapters of a higher rank are refused at load"
    )
    max_cpu_loras: int = Field(
        MAX_CPU_LORAS,
        gt=0,
        description="adapters kept loaded; beyond it an idle adapter loaded on demand is "
        "unloaded, least recently used first (those of --lora-modules never are); at least "
        "--max-loras, as vLLM asks",
    )
    lora_modules: list[str] = Field(
        default_factory=list,
        description="adapters loaded at start, before the engine is ready, and never "
        "unloaded for room: NAME=PATH (a PEFT folder), as vLLM spells it: --lora-modules "
        "sql=/adapters/sql chat=/adapters/chat; a bad one fails the start",
    )

    http_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="OpenAI HTTP front (/v1/completions, /v1/chat/completions, /v1/models, "
        "/metrics) on this port, for a Gateway API Inference Extension gateway "
        "(docs/gie.md); 0 = off. The operator sets 8000 in every native engine pod",
    )
    http_max_body_bytes: int = Field(
        4 * 1024 * 1024, gt=0, description="HTTP front: larger request bodies get 413"
    )
    http_body_timeout_seconds: float = Field(
        30.0, gt=0, description="HTTP front: to send a body once its headers are in; slower get 408"
    )

    @field_validator("serves")
    @classmethod
    def _known_serves(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(KINDS))
        if unknown:
            raise ValueError(f"unknown {unknown}: each must be one of {list(KINDS)}")
        return list(dict.fromkeys(value))

    @property
    def served(self) -> list[str]:
        """--serves, or the backend's default when it is empty."""
        return self.serves or list(DEFAULT_SERVES[self.backend])

    @field_validator("known_answer")
    @classmethod
    def _known_answer_source(cls, value: str) -> str:
        if value in ("cache", "bound", "off"):
            return value
        try:
            reference = float(value)
        except ValueError:
            reference = 0.0
        if not 1.0 <= reference < float("inf"):
            raise ValueError("must be cache, bound, off or a perplexity (a number >= 1)")
        return value

    @field_validator("quantization_group_size")
    @classmethod
    def _known_group_size(cls, value: int) -> int:
        # An int field, not Literal[32, 64, 128]: flags arrive as strings, and a
        # Literal of ints does not coerce them.
        if value not in GROUP_SIZES:
            raise ValueError(f"must be one of {GROUP_SIZES}")
        return value

    @field_validator("lora_modules")
    @classmethod
    def _named_paths(cls, value: list[str]) -> list[str]:
        return check_lora_modules(value)

    @model_validator(mode="after")
    def _lora_limits(self) -> "EngineSettings":
        if self.lora_modules and not self.max_loras:
            raise ValueError("--lora-modules needs --max-loras above 0 (0 serves no adapters)")
        if self.max_cpu_loras < self.max_loras:
            raise ValueError("--max-cpu-loras must be at least --max-loras")
        return self

    @property
    def lora_module_sources(self) -> dict[str, str]:
        """--lora-modules as name -> folder."""
        return dict(module.split("=", 1) for module in self.lora_modules)


def check_lora_modules(modules: list[str]) -> list[str]:
    """--lora-modules as given, or ValueError: each NAME=PATH, no name twice."""
    names = set()
    for module in modules:
        name, equals, path = module.partition("=")
        if not (equals and name.strip() and path.strip()):
            raise ValueError(f"{module!r} is not NAME=PATH")
        if name in names:
            raise ValueError(f"the adapter name {name!r} is given twice")
        names.add(name)
    return modules
