"""The native compute path: each decoder layer's dense halves as native calls (native/layer.cpp).

DecoderLayer.attention_inputs and attention_outputs (model.py) are ~90 torch
calls a layer from Python, 1-10 us each: about half of a batch-1 decode step
on the CPU, more than reading the weights. Where the layer halves apply (a
CPU model in float32, the native library built, maas_kernels.ops not forcing
Triton, projections in float32, int8 or float32-scaled int4), Native gathers
every layer's weight pointers once into bindings.Layer structures and runs the
two halves as calls that do the same arithmetic in C++, through
quantization/cpu_kernel.py's row kernel and panel GEMM (the same crossover and
panel size). Paged attention between them is unchanged; a layer that does not
fit keeps the torch halves. With every layer native, a decode-only step runs
all the layers in one call (NativeDecode). model_runner.choose_path takes this
path where it applies; elsewhere (CUDA, bf16, --no-native-layers, the compiled
forward) the layers run their torch halves.

A step whose rows run LoRA adapters stays on this path: the step's stacked
adapters (lora/step_lora.py's AdapterStack) are described once per stack as
native/lora.h's structures (NativeLoraStack), and each projection adds its rows'
low-rank updates in C++ right after its GEMM (native/lora.cpp), the one-call
decode step included.

The projections run in float32, or with --wide-gemm bf16 in bf16 (native/bf16.h:
the activations and weights rounded to bf16, float32 sums) where the library has it
(a CPU with AVX512-BF16 or AMX): each float32 projection then keeps a bf16 copy of
its weight, made here once (half its float32 bytes again), and the LM head too
(NativeHead); every step's width runs the same sums (the panel GEMM for wide steps,
bf16_rows for narrow ones), so a row's result does not depend on its step. int8 and
int4 panels are dequantized into bf16 instead of float32; their narrow steps keep
their own row kernels. Native.extra_bytes counts the copies for the KV budget.

With --kernel-weights checkpoint a float32 projection or head loaded from a GGUF
file also keeps the file's own blocks (quantization/checkpoint_blocks.py), and steps
of up to BLOCKS_ROWS rows multiply by them (matmul.h's NativeWeight.blocks): the same
weights in an eighth or a quarter of the bytes, float32 activations; their row
kernel up to BLOCKS_ROW_KERNEL_ROWS rows, their panel GEMM above. With
--kernel-activations int16 that row kernel is qdot.cpp's instead, the activations
rounded to int16 per block of 32 (docs/engine.md has the measured speed and error).
"""

import ctypes

import torch
from torch import nn

from maas_kernels import ops
from maas_kernels.native import bindings
from maas_kernels.quant_int4_ref import unpack_int4
from maas_services.engine import native_attention
from maas_services.engine.attention_metadata import AttentionMetadata
from maas_services.engine.compute_path import ComputePath
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.lora.step_lora import AdapterStack, LayerLora, StepLora
from maas_services.engine.model import DecoderLayer, FusedLinear, LlamaForCausalLM
from maas_services.engine.quantization import cpu_kernel
from maas_services.engine.quantization.checkpoint_blocks import (
    BF16_BLOCKS_ROWS,
    BLOCKS_ROW_KERNEL_ROWS,
    BLOCKS_ROWS,
    EVERY_STEP,
    CheckpointBlock,
)
from maas_services.engine.quantization.int4 import Int4Linear, Int4Weight
from maas_services.engine.quantization.int8 import Int8Linear, Int8Weight

# The kernels read whole 8-wide vectors along K, and int4 and int8 groups 32 weights at a
# time.
_K_MULTIPLE = 8
_GROUP_MULTIPLE = 32
# settings.wide_gemm's values once resolved (machine_defaults.py fills in `auto`).
WIDE_GEMMS = ("float32", "bf16", "int8")


def wide_bf16_kernel() -> str:
    """The library's bf16 panel GEMM ("avx512_bf16", "amx"), or "" where it has none."""
    lib = bindings.library()
    return "" if lib is None else bindings.WIDE_BF16_KERNELS[lib.wide_bf16_kernel()]


def wide_int8_kernel() -> bool:
    """Whether the library has qdot.cpp's wide int8 kernel (cols16_qdot: AVX512-VNNI)."""
    lib = bindings.library()
    return lib is not None and bool(lib.cols16_kernel())


def unavailable(model: LlamaForCausalLM) -> str | None:
    """Why the native halves cannot compute this model's activations, or None where they
    can (a float32 model on a CPU that has the library)."""
    weight = model.model.embed_tokens.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return f"a {weight.device.type} {str(weight.dtype).removeprefix('torch.')} model"
    if ops._force_triton:
        return "maas_kernels.ops forces Triton"
    if bindings.library() is None:
        return "no native library (not AVX2, or no C++ compiler)"
    return None


class Native(ComputePath):
    """The native halves for every layer that takes them, and the one-call decode step
    where every layer does (one_call False: three calls a layer, the benchmark's A/B;
    wide_gemm: WIDE_GEMMS' choice for wide steps, float32 where the library has no bf16;
    int8: where the library has its kernel, the blocks serve every step on activations
    rounded to int8 (the others as bf16); blocks: checkpoint_blocks' blocks for steps of
    up to BLOCKS_ROWS rows, by module; blocks_int16: their row kernel on activations
    rounded to int16)."""

    name = "native"

    def __init__(
        self,
        model: LlamaForCausalLM,
        reason: str,
        one_call: bool = True,
        wide_gemm: str = "float32",
        blocks: dict[nn.Module, CheckpointBlock] | None = None,
        blocks_int16: bool = False,
    ):
        super().__init__(reason)
        blocks = blocks or {}
        kernel = wide_bf16_kernel() if wide_gemm in ("bf16", "int8") else ""
        wide_int8 = wide_gemm == "int8" and wide_int8_kernel()
        # Keyed by the layer module: a layer of another model (a copy) finds none here
        # and runs its torch halves.
        self._halves: dict[DecoderLayer, NativeHalves] = {}
        if unavailable(model) is None:
            for layer in model.model.layers:
                halves = NativeHalves.of(layer, bool(kernel), blocks, blocks_int16, wide_int8)
                if halves is not None:
                    self._halves[layer] = halves
        self.native_layers = len(self._halves)
        every = self.native_layers == len(model.model.layers)
        self._decode = (
            NativeDecode(model, list(self._halves.values())) if every and one_call else None
        )
        # The last step's adapters in lora.h's terms, rebuilt when its stack changes.
        self._loras: NativeLoraStack | None = None
        # The LM head in bf16 too where the layers' matmuls are, and from its blocks
        # where it has them (NativeHead).
        bf16 = bool(kernel)
        self._head = (
            NativeHead.of(model, bf16, blocks, blocks_int16, wide_int8) if bf16 or blocks else None
        )
        self.extra_bytes = sum(h.copy_bytes for h in self._halves.values())
        self.extra_bytes += 0 if self._head is None else self._head.copy_bytes
        with_blocks = [w for w in self.weights() if w.blocks]
        self._kernel_weights = (
            f"checkpoint: {len(with_blocks)} weights' blocks {_reach(with_blocks[0])}"
            if with_blocks
            else "float32"
        )
        # What computes wide steps, as built: int8 only where some weight's blocks took its
        # kernel (a model without blocks, a folder, computes as `others` and says why).
        int8 = any(_int8_blocks(w) for w in with_blocks)
        self.wide_gemm = "int8" if int8 else "bf16" if kernel else "float32"
        others = kernel or "float32 panel"
        if int8:
            self._wide_gemm_kernel = (
                f"avx512_vnni int8 on the checkpoint's blocks, {others} without"
            )
        elif wide_gemm == "float32":
            self._wide_gemm_kernel = "float32 panel"
        elif wide_gemm == "int8" and not wide_int8:
            self._wide_gemm_kernel = f"{others}: this CPU's library has no int8 kernel"
        elif wide_gemm == "int8":
            self._wide_gemm_kernel = f"{others}: no checkpoint blocks the int8 kernel takes"
        else:
            self._wide_gemm_kernel = kernel or "none: this CPU's library has no bf16 panel"

    def weights(self) -> list[bindings.Weight]:
        """Every projection the native halves multiply by, then the head where it is native."""
        weights = [w for h in self._halves.values() for w in h.weights()]
        return weights + ([] if self._head is None else [self._head.weight])

    def halves(self, layer: DecoderLayer) -> "NativeHalves | None":
        """The layer's native halves, or None where it runs the torch ones."""
        return self._halves.get(layer)

    def attention_inputs(
        self,
        layer: DecoderLayer,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lora: LayerLora | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        halves = self._halves.get(layer)
        if halves is None:
            return layer.attention_inputs(x, residual, cos, sin, lora)
        return halves.inputs(x, residual, cos, sin, *self._lora(lora))

    def attention_outputs(
        self,
        layer: DecoderLayer,
        attended: torch.Tensor,
        residual: torch.Tensor,
        lora: LayerLora | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        halves = self._halves.get(layer)
        if halves is None:
            return layer.attention_outputs(attended, residual, lora)
        return halves.outputs(attended, residual, *self._lora(lora))

    def _lora(self, lora: LayerLora | None) -> tuple[int | None, int | None]:
        """The layer's NativeLora address and the rows' adapters' pointer (None, None: the
        step has no adapter rows)."""
        if lora is None:
            return None, None
        return self._stack(lora.step).layer(lora.index), lora.step.row_adapter.data_ptr()

    def _stack(self, step: StepLora) -> "NativeLoraStack":
        if self._loras is None or self._loras.stack is not step.stack:
            self._loras = NativeLoraStack(step.stack)
        return self._loras

    def decode_step(
        self,
        model: LlamaForCausalLM,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: PagedKVCache,
        meta: AttentionMetadata,
        lora: StepLora | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self._decode is None:
            return None
        if lora is None:
            return self._decode(model, x, cos, sin, kv_cache, meta, None, None)
        loras = self._stack(lora).address
        return self._decode(model, x, cos, sin, kv_cache, meta, loras, lora.row_adapter.data_ptr())

    def logits(self, model: LlamaForCausalLM, hidden: torch.Tensor) -> torch.Tensor:
        if self._head is None:
            return model.compute_logits(hidden)
        return self._head(hidden)

    def describe(self) -> dict[str, object]:
        return {
            **super().describe(),
            "native_layers": self.native_layers,
            "wide_gemm": self.wide_gemm,
            "wide_gemm_kernel": self._wide_gemm_kernel,
            "kernel_weights": self._kernel_weights,
        }


def _tensor(t: torch.Tensor | None, dtype: torch.dtype, kept: list) -> int | None:
    """t's data pointer if the kernels can read it as it is, else None; t joins kept."""
    if t is None or t.dtype != dtype or t.device.type != "cpu" or not t.is_contiguous():
        return None
    kept.append(t)
    return t.data_ptr()


def _quantized(weight: Int8Weight | Int4Weight, kept: list) -> tuple:
    """Weight's format, data, scales, mins and group fields for int8 or int4 values."""
    if isinstance(weight, Int8Weight):
        q, scale = _tensor(weight.q, torch.int8, kept), _tensor(weight.scale, torch.float32, kept)
        return bindings.INT8, q, scale, 0, weight.group_size
    return (
        bindings.INT4,
        _tensor(weight.packed, torch.uint8, kept),
        _tensor(weight.scales, torch.float32, kept),
        _tensor(weight.mins, torch.float32, kept),
        weight.group_size,
    )


def _by_row_group(t: torch.Tensor, rows: int) -> torch.Tensor:
    """A block's per-row values [n, k/32] as the interleaved formats keep them:
    [n/rows][k/32][rows], each row group's values for a block side by side."""
    n = t.shape[0]
    return t.view(n // rows, rows, -1).transpose(1, 2).contiguous()


def _cols8(block: CheckpointBlock, kept: list) -> tuple:
    """A checkpoint's block of 32 inputs (int4 or int8) as matmul.h's interleaved format,
    8 output rows a vector; its format, data, scales, mins and group. Made once at load."""
    if isinstance(block, Int4Weight):
        levels = unpack_int4(block.packed)
        n, k = levels.shape
        # [row group, row, block, quad, input] -> [row group, block, quad, row, input]
        quads = levels.view(n // 8, 8, k // 32, 8, 4).permute(0, 2, 3, 1, 4)
        data, scales, mins = quads[..., :2] | (quads[..., 2:] << 4), block.scales, block.mins
    else:
        n, k = block.q.shape
        # [row group, row, block, quad, pair, input] -> [.., block, quad, pair, row, input]
        pairs = block.q.view(n // 8, 8, k // 32, 8, 2, 2).permute(0, 2, 3, 4, 1, 5)
        data, scales, mins = pairs, block.scale, None
    fmt = bindings.INT4_COLS8 if mins is not None else bindings.INT8_COLS8
    return (
        fmt,
        _tensor(data.contiguous(), data.dtype, kept),
        _tensor(_by_row_group(scales, 8), torch.float32, kept),
        0 if mins is None else _tensor(_by_row_group(mins, 8), torch.float32, kept),
        32,
    )


def _cols16(block: CheckpointBlock, kept: list) -> tuple:
    """A checkpoint's block of 32 inputs (int4 or int8) as matmul.h's int8-kernel
    interleaved format, 16 output rows a vector; its format, data, scales, mins and group.
    Made once at load."""
    if isinstance(block, Int4Weight):
        levels = unpack_int4(block.packed)
        n, k = levels.shape
        # [row group, row, block, octet, half, input] -> [.., block, octet, row, half, input]
        octets = levels.view(n // 16, 16, k // 32, 4, 2, 4).permute(0, 2, 3, 1, 4, 5)
        data, scales, mins = octets[..., 0, :] | (octets[..., 1, :] << 4), block.scales, block.mins
        fmt = bindings.INT4_COLS16
    else:
        n, k = block.q.shape
        # Unsigned for vpdpbusd: level + 128, the offset taken back out as a minimum.
        shifted = (block.q.to(torch.int16) + 128).to(torch.uint8)
        # [row group, row, block, quad, input] -> [row group, block, quad, row, input]
        data = shifted.view(n // 16, 16, k // 32, 8, 4).permute(0, 2, 3, 1, 4)
        scales, mins, fmt = block.scale, -128.0 * block.scale, bindings.INT8_COLS16
    return (
        fmt,
        _tensor(data.contiguous(), torch.uint8, kept),
        _tensor(_by_row_group(scales, 16), torch.float32, kept),
        _tensor(_by_row_group(mins, 16), torch.float32, kept),
        32,
    )


def _int8_blocks(weight: bindings.Weight) -> bool:
    """Whether weight's checkpoint blocks serve every step through the int8 kernel."""
    blocks = bindings.Weight.from_address(weight.blocks)
    return blocks.format in (bindings.INT4_COLS16, bindings.INT8_COLS16)


def _reach(weight: bindings.Weight) -> str:
    """Which steps read weight's checkpoint blocks, and how, as _keep_blocks set it up."""
    if _int8_blocks(weight):
        return "at every step (their int8 kernel, interleaved, int8 activations)"
    blocks = bindings.Weight.from_address(weight.blocks)
    layout = ", interleaved" if blocks.format in (bindings.INT4_COLS8, bindings.INT8_COLS8) else ""
    activations = "int16" if blocks.integer16 else "float32"
    return (
        f"up to {weight.blocks_rows} rows (their row kernel up to {weight.blocks_row_rows}"
        f"{layout}, {activations} activations)"
    )


def _keep_blocks(
    weight: bindings.Weight,
    block: CheckpointBlock,
    kept: list,
    int16: bool = False,
    wide_int8: bool = False,
) -> int:
    """Points weight's steps at the checkpoint's block (a Weight of its own, kept; int16:
    its row kernel on activations rounded to int16; wide_int8: every step through the
    int8 kernel, where _int8_serves); returns the bytes kept for it, or 0 where no native
    format takes it."""
    first = len(kept)
    if _int8_serves(block, weight.n, wide_int8):
        # Every width through one kernel: a row's sums do not depend on its step's width.
        # It rounds its activations to int8 itself: int16 is the narrow kernels' choice.
        parts, rows, row_kernel_rows = _cols16(block, kept), EVERY_STEP, EVERY_STEP
        int16 = False
    else:
        # Where wide steps are bf16's (--wide-gemm bf16), the blocks serve only narrow
        # steps, through the interleaved layout's int16 kernel where it takes them (no
        # row-major panel).
        rows = BF16_BLOCKS_ROWS if weight.wide_bf16 else BLOCKS_ROWS
        interleaved = weight.wide_bf16 and int16 and block.group_size == 32 and weight.n % 8 == 0
        row_kernel_rows = rows if interleaved else min(rows, BLOCKS_ROW_KERNEL_ROWS)
        parts = _cols8(block, kept) if interleaved else _quantized(block, kept)
    if None in parts or parts[4] % _GROUP_MULTIPLE:
        return 0
    described = bindings.Weight(*parts, weight.bias, weight.n, weight.k)
    if int16:
        described.integer_rows, described.integer16 = row_kernel_rows, 1
    kept.append(described)
    weight.blocks = ctypes.addressof(described)
    weight.blocks_rows, weight.blocks_row_rows = rows, row_kernel_rows
    return sum(t.nbytes for t in kept[first:] if isinstance(t, torch.Tensor))


def _int8_serves(block: CheckpointBlock | None, n: int, wide_int8: bool) -> bool:
    """Whether, with wide_int8, the int8 kernel serves every step of a weight of n rows
    from this block (so the weight keeps no bf16 copy)."""
    return wide_int8 and block is not None and block.group_size == 32 and n % 16 == 0


def _weight(
    module: nn.Module, kept: list, wide_bf16: bool, with_copy: bool = True
) -> tuple[bindings.Weight | None, int]:
    """The projection in matmul.h's terms, or None if no native format holds it, and the
    bytes of the copy it keeps; wide_bf16: its wide steps in bf16 (a float32 weight's bf16
    copy joins kept, unless not with_copy: its blocks serve every step)."""
    n, k = module.out_features, module.in_features
    bias = getattr(module, "bias", None)
    bias_ptr = 0 if bias is None else _tensor(bias, torch.float32, kept)
    if k % _K_MULTIPLE or bias_ptr is None or getattr(module, "group_size", 0) % _GROUP_MULTIPLE:
        return None, 0
    if isinstance(module, Int8Linear):
        parts = _quantized(Int8Weight(module.qweight, module.scale, module.group_size), kept)
    elif isinstance(module, Int4Linear):
        values = (module.packed, module.scales, module.mins, module.group_size)
        parts = _quantized(Int4Weight(*values), kept)
    elif type(module) in (nn.Linear, FusedLinear):
        parts = (bindings.FLOAT32, _tensor(module.weight, torch.float32, kept), 0, 0, 0)
    else:
        return None, 0
    if None in parts:
        return None, 0
    # int8 activations: qdot.cpp's integer row kernels, up to their crossover.
    integer = getattr(module, "int8_activations", False)
    integer_rows = cpu_kernel.MAX_INTEGER_ROW_KERNEL_ROWS if integer else 0
    bf16_copy, copy_bytes = 0, 0
    if wide_bf16 and with_copy and parts[0] == bindings.FLOAT32:
        # torch rounds to nearest even, as the kernel's activations are rounded.
        copy = module.weight.detach().to(torch.bfloat16)
        bf16_copy, copy_bytes = _tensor(copy, torch.bfloat16, kept), copy.nbytes
    weight = bindings.Weight(*parts, bias_ptr, n, k, integer_rows, int(wide_bf16), bf16_copy)
    return weight, copy_bytes


def _describe(
    layer: DecoderLayer,
    wide_bf16: bool,
    blocks: dict[nn.Module, CheckpointBlock],
    blocks_int16: bool,
    wide_int8: bool,
) -> "NativeHalves | None":
    """The layer in layer.cpp's terms, or None where a projection or norm is in no native
    format; blocks: the checkpoint's blocks, by module (blocks_int16, wide_int8:
    _keep_blocks' int16 and wide_int8)."""
    attn, mlp, kept = layer.self_attn, layer.mlp, []
    projections = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    described = [
        _weight(m, kept, wide_bf16, not _int8_serves(blocks.get(m), m.out_features, wide_int8))
        for m in projections
    ]
    weights = [weight for weight, _ in described]
    norms = [
        _tensor(n.weight, torch.float32, kept)
        for n in (layer.input_layernorm, layer.post_attention_layernorm)
    ]
    hidden = layer.input_layernorm.weight.shape[0]
    if None in weights or None in norms or hidden % _K_MULTIPLE:
        return None
    if mlp.down_proj.in_features % _K_MULTIPLE or attn.head_dim % 2:
        return None
    copy_bytes = sum(copy for _, copy in described)
    for module, weight in zip(projections, weights, strict=True):
        block = blocks.get(module)
        if block is not None:
            copy_bytes += _keep_blocks(weight, block, kept, blocks_int16, wide_int8)
    structure = bindings.Layer(
        *weights,
        *norms,
        layer.input_layernorm.eps,
        hidden,
        attn.num_heads,
        attn.num_kv_heads,
        attn.head_dim,
        mlp.down_proj.in_features,
        cpu_kernel.MAX_ROW_KERNEL_ROWS,
        cpu_kernel.PANEL_BYTES,
    )
    return NativeHalves(structure, kept, copy_bytes)


class NativeHalves:
    """One layer's native halves: attention_inputs and attention_outputs' signatures."""

    __slots__ = (
        "described",
        "copy_bytes",
        "_kept",
        "_address",
        "_hidden",
        "_heads",
        "_kv_heads",
        "_dim",
    )

    def __init__(self, described: bindings.Layer, kept: list, copy_bytes: int):
        """kept: the tensors and structures it points into; copy_bytes: those of them that
        are copies (bf16 weights, checkpoint blocks)."""
        # Kept alive: the calls pass the structure's address, and it the tensors'.
        self.described, self._kept, self.copy_bytes = described, kept, copy_bytes
        self._hidden, self._dim = described.hidden, described.head_dim
        self._heads, self._kv_heads = described.heads, described.kv_heads
        self._address = ctypes.addressof(described)

    def weights(self) -> tuple[bindings.Weight, ...]:
        """The layer's four projections in matmul.h's terms."""
        d = self.described
        return d.qkv, d.o, d.gate_up, d.down

    @property
    def with_blocks(self) -> int:
        """Its projections that keep their checkpoint's blocks."""
        return sum(bool(w.blocks) for w in self.weights())

    @classmethod
    def of(
        cls,
        layer: DecoderLayer,
        wide_bf16: bool = False,
        blocks: dict[nn.Module, CheckpointBlock] | None = None,
        blocks_int16: bool = False,
        wide_int8: bool = False,
    ) -> "NativeHalves | None":
        """The layer's halves (wide steps in bf16 if asked: the library must have it; steps
        of up to BLOCKS_ROWS rows from the checkpoint's blocks where blocks has them, their
        row kernel on int16 activations where blocks_int16; every step from them on int8
        activations where wide_int8), or None where they do not apply to it."""
        return _describe(layer, wide_bf16, blocks or {}, blocks_int16, wide_int8)

    def inputs(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lora: int | None = None,
        row_adapter: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """lora: the layer's NativeLora address and row_adapter its rows' adapters (int64
        [tokens]), where the step has adapter rows."""
        tokens = x.shape[0]
        x = x.contiguous()
        cos, sin = cos.contiguous(), sin.contiguous()
        q = torch.empty(tokens, self._heads, self._dim)
        k = torch.empty(tokens, self._kv_heads, self._dim)
        v = torch.empty(tokens, self._kv_heads, self._dim)
        if residual is None:
            stream, residual_ptr = x, None
        else:
            residual = residual.contiguous()
            stream, residual_ptr = torch.empty(tokens, self._hidden), residual.data_ptr()
        bindings.library().layer_inputs_f32(
            self._address,
            x.data_ptr(),
            residual_ptr,
            tokens,
            cos.data_ptr(),
            sin.data_ptr(),
            q.data_ptr(),
            k.data_ptr(),
            v.data_ptr(),
            stream.data_ptr(),
            lora,
            row_adapter,
            torch.get_num_threads(),
        )
        return q, k, v, stream

    def outputs(
        self,
        attended: torch.Tensor,
        residual: torch.Tensor,
        lora: int | None = None,
        row_adapter: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = attended.shape[0]
        rows = attended.flatten(1)
        if rows.stride(1) != 1:
            rows = rows.contiguous()
        residual = residual.contiguous()
        out = torch.empty(tokens, self._hidden)
        stream = torch.empty(tokens, self._hidden)
        bindings.library().layer_outputs_f32(
            self._address,
            rows.data_ptr(),
            rows.stride(0),
            residual.data_ptr(),
            tokens,
            out.data_ptr(),
            stream.data_ptr(),
            lora,
            row_adapter,
            torch.get_num_threads(),
        )
        return out, stream


class NativeDecode:
    """Every layer of a decode-only step in one native call (layer.cpp's decode_layers_f32).

    At one stream the three calls a layer (the halves and attention) cost ~90 us of
    Python and ctypes each time, a few ms a step. Built by Native where every layer's
    halves are native, as an array of their Layer structures.
    """

    __slots__ = ("_model", "_layers", "_kept")

    def __init__(self, model: LlamaForCausalLM, halves: list[NativeHalves]):
        self._model = model
        # The array copies the structures; their tensors stay alive in each NativeHalves.
        self._kept = halves
        self._layers = (bindings.Layer * len(halves))(*(each.described for each in halves))

    def __call__(
        self,
        model: LlamaForCausalLM,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: PagedKVCache,
        meta: AttentionMetadata,
        loras: int | None,
        row_adapter: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(the last MLP's output, the stream before it) from the embeddings x, every new
        key and value written to the pool, as the layer loop returns them; None where the
        step is another model's, not all decodes, or attention would not take the native
        call. loras: the address of NativeLoraStack's array and row_adapter its rows'
        adapters, where the step has adapter rows."""
        tokens = x.shape[0]
        if model is not self._model or meta.num_decodes != tokens:
            return None
        if not native_attention.handles_pool(kv_cache.k, kv_cache.v):
            return None
        x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
        hidden = x.shape[1]
        out, stream = torch.empty(tokens, hidden), torch.empty(tokens, hidden)
        tables = meta.block_tables
        bindings.library().decode_layers_f32(
            ctypes.addressof(self._layers),
            len(self._layers),
            x.data_ptr(),
            tokens,
            cos.data_ptr(),
            sin.data_ptr(),
            kv_cache.k.data_ptr(),
            kv_cache.v.data_ptr(),
            kv_cache.k.stride(0),
            kv_cache.k.dtype == torch.bfloat16,
            meta.slot_mapping.data_ptr(),
            tables.data_ptr(),
            tables.stride(0),
            meta.decode_context_lens.data_ptr(),
            kv_cache.block_size,
            loras,
            row_adapter,
            out.data_ptr(),
            stream.data_ptr(),
            torch.get_num_threads(),
        )
        return out, stream


class NativeHead:
    """The LM head through native_linear where the layers' matmuls differ from torch's:
    in bf16 (--wide-gemm bf16), the activations and a bf16 copy of the head's float32
    weight (the embeddings, where tied), float32 sums, the same at every width (the
    panel GEMM, bf16_rows for a few rows); and from the checkpoint's Q8_0 blocks where
    it has them (--kernel-weights checkpoint)."""

    __slots__ = ("weight", "copy_bytes", "_kept", "_address", "_rows")

    def __init__(
        self,
        weight: torch.Tensor,
        bf16: bool,
        block: CheckpointBlock | None,
        int16: bool = False,
        wide_int8: bool = False,
    ):
        n, k = weight.shape
        self._kept: list = [weight]
        self.copy_bytes, copy = 0, 0
        if bf16 and not _int8_serves(block, n, wide_int8):
            rounded = weight.detach().to(torch.bfloat16)  # nearest even, as the activations
            copy, self.copy_bytes = _tensor(rounded, torch.bfloat16, self._kept), rounded.nbytes
        self.weight = bindings.Weight(
            bindings.FLOAT32, weight.data_ptr(), 0, 0, 0, 0, n, k, 0, int(bf16), copy
        )
        if block is not None:
            self.copy_bytes += _keep_blocks(self.weight, block, self._kept, int16, wide_int8)
        self._address = ctypes.addressof(self.weight)
        self._rows = n

    @property
    def with_blocks(self) -> int:
        """1 where the head keeps its checkpoint's blocks."""
        return int(bool(self.weight.blocks))

    @classmethod
    def of(
        cls,
        model: LlamaForCausalLM,
        bf16: bool,
        blocks: dict[nn.Module, CheckpointBlock],
        blocks_int16: bool = False,
        wide_int8: bool = False,
    ) -> "NativeHead | None":
        """The model's head in bf16 and/or with its blocks (blocks_int16, wide_int8:
        _keep_blocks'), or None where neither applies or it is not a float32 weight (a
        quantized head keeps its own kernels)."""
        tied = model.lm_head is None
        module = model.model.embed_tokens if tied else model.lm_head
        if not tied and type(module) is not nn.Linear:
            return None
        weight = module.weight
        if weight.dtype != torch.float32 or not weight.is_contiguous() or weight.shape[1] % 8:
            return None
        block = blocks.get(module)
        if not bf16 and block is None:
            return None
        return cls(weight, bf16, block, blocks_int16, wide_int8)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.contiguous()
        rows = hidden.shape[0]
        out = torch.empty(rows, self._rows)
        bindings.library().weight_linear(
            self._address,
            hidden.data_ptr(),
            rows,
            hidden.stride(0),
            out.data_ptr(),
            cpu_kernel.MAX_ROW_KERNEL_ROWS,
            cpu_kernel.PANEL_BYTES,
            torch.get_num_threads(),
        )
        return out


# step_lora's module names -> NativeLora's fields.
_LORA_FIELDS = {"qkv_proj": "qkv", "o_proj": "o", "gate_up_proj": "gate_up", "down_proj": "down"}


class NativeLoraStack:
    """A step's stacked adapters (AdapterStack) as an array of lora.h's NativeLora, one per
    layer, pointing into the stack's tensors (held: the stack is kept)."""

    __slots__ = ("stack", "_array", "address")

    def __init__(self, stack: AdapterStack):
        self.stack = stack
        self._array = (bindings.Lora * len(stack.layers))()
        for layer, modules in zip(self._array, stack.layers, strict=True):
            for module, stacked in modules.items():
                # The model is float32 (unavailable() above); the stack is made in its dtype.
                assert stacked.a_t.dtype == torch.float32
                assert stacked.a_t.is_contiguous() and stacked.b_t.is_contiguous()
                pair = getattr(layer, _LORA_FIELDS[module])
                pair.a_t, pair.b_t = stacked.a_t.data_ptr(), stacked.b_t.data_ptr()
                pair.width = stacked.a_t.shape[2]
        self.address = ctypes.addressof(self._array)

    def layer(self, index: int) -> int:
        """The address of layer `index`'s NativeLora."""
        return self.address + index * ctypes.sizeof(bindings.Lora)
