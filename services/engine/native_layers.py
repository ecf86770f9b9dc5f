"""Each decoder layer's dense halves as two native calls (native/layer.cpp).

DecoderLayer.attention_inputs and attention_outputs (model.py) are ~90 torch
calls a layer from Python, 1-10 us each: about half of a batch-1 decode step
on the CPU, more than reading the weights. Where the layer halves apply (a
CPU model in float32, the native library built, maas_kernels.ops not forcing
Triton, projections in float32, int8 or float32-scaled int4), install()
gathers every layer's weight pointers once into a ctypes structure and
replaces the two methods on the layer with calls that do the same arithmetic
in C++, through quantization/cpu_kernel.py's row kernel and panel GEMM (the
same crossover and panel size). Paged attention between them is unchanged;
everything else (the compiled forward, CUDA, bf16) keeps the torch path.
"""

import copy
import ctypes
from functools import cache

import torch
from torch import nn

from maas_kernels import ops
from services.engine import native_attention
from services.engine.attention_metadata import AttentionMetadata
from services.engine.kv_cache import PagedKVCache
from services.engine.model import DecoderLayer, FusedLinear, LlamaForCausalLM
from services.engine.native import library as native
from services.engine.quantization import cpu_kernel
from services.engine.quantization.int4 import Int4Linear
from services.engine.quantization.int8 import Int8Linear

_P = native.POINTER
_I = native.INT
_SIGNATURES = {
    "layer_inputs_f32": [_P, _P, _P, _I, _P, _P, _P, _P, _P, _P, native.THREADS],
    "layer_outputs_f32": [_P, _P, _I, _P, _I, _P, _P, native.THREADS],
    # layers, count, x, tokens, cos, sin, pools and their layer stride, the metadata's
    # slots, tables, table width, lengths and block size, out, stream, threads.
    "decode_layers_f32": [_P, _I, _P, _I, _P, _P, _P, _P, _I, _P, _P, _I, _P, _I, _P, _P]
    + [native.THREADS],
}
# matmul.h's WEIGHT_* formats.
_FLOAT32, _INT8, _INT4 = 0, 1, 2
# The kernels read whole 8-wide vectors along K, and int4 groups 32 weights at a time.
_K_MULTIPLE = 8
_INT4_GROUP_MULTIPLE = 32


class _Weight(ctypes.Structure):
    """matmul.h's NativeWeight."""

    _fields_ = [
        ("format", ctypes.c_int64),
        ("data", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("mins", ctypes.c_void_p),
        ("group", ctypes.c_int64),
        ("bias", ctypes.c_void_p),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("integer_rows", ctypes.c_int64),
    ]


class _Layer(ctypes.Structure):
    """layer.cpp's NativeLayer."""

    _fields_ = [
        ("qkv", _Weight),
        ("o", _Weight),
        ("gate_up", _Weight),
        ("down", _Weight),
        ("input_norm", ctypes.c_void_p),
        ("post_norm", ctypes.c_void_p),
        ("eps", ctypes.c_double),
        ("hidden", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("intermediate", ctypes.c_int64),
        ("row_kernel_rows", ctypes.c_int64),
        ("panel_bytes", ctypes.c_int64),
    ]


@cache
def library() -> ctypes.CDLL | None:
    """The engine's native library with the layer halves' signatures bound, or None."""
    return native.bind(_SIGNATURES)


def install(model: LlamaForCausalLM, one_call: bool = True) -> int:
    """Give every layer that can take them the native halves; the number of layers that did.

    A layer whose halves are replaced already (native, or the compiled forward's)
    keeps them. With every layer native and one_call, a decode-only step runs them
    all in one call (NativeDecode); without one_call, three calls a layer (the
    benchmark's A/B).
    """
    if not applies(model):
        return 0
    installed = 0
    for layer in model.model.layers:
        if "attention_inputs" in vars(layer):
            installed += _is_native(layer)
            continue
        halves = NativeHalves.of(layer)
        if halves is not None:
            layer.attention_inputs = halves.inputs
            layer.attention_outputs = halves.outputs
            installed += 1
    if one_call and installed == len(model.model.layers):
        model.native_decode = NativeDecode(model)
    else:
        vars(model).pop("native_decode", None)
    return installed


def remove(model: LlamaForCausalLM) -> None:
    """Back to the torch halves (the class's methods): the A/B benchmark's other side."""
    vars(model).pop("native_decode", None)
    for layer in model.model.layers:
        if _is_native(layer):
            del layer.attention_inputs, layer.attention_outputs


def _is_native(layer: DecoderLayer) -> bool:
    return isinstance(getattr(layer.attention_inputs, "__self__", None), NativeHalves)


def applies(model: LlamaForCausalLM) -> bool:
    """Whether this model's activations are ones the native halves compute: CPU float32."""
    weight = model.model.embed_tokens.weight
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and not ops._force_triton
        and library() is not None
    )


def _tensor(t: torch.Tensor | None, dtype: torch.dtype, kept: list) -> int | None:
    """t's data pointer if the kernels can read it as it is, else None; t joins kept."""
    if t is None or t.dtype != dtype or t.device.type != "cpu" or not t.is_contiguous():
        return None
    kept.append(t)
    return t.data_ptr()


def _weight(module: nn.Module, kept: list) -> _Weight | None:
    """The projection in matmul.h's terms, or None if no native format holds it."""
    n, k = module.out_features, module.in_features
    bias = getattr(module, "bias", None)
    bias_ptr = 0 if bias is None else _tensor(bias, torch.float32, kept)
    if k % _K_MULTIPLE or bias_ptr is None:
        return None
    if isinstance(module, Int8Linear):
        parts = (_INT8, _tensor(module.qweight, torch.int8, kept))
        parts += (_tensor(module.scale, torch.float32, kept), 0, 0)
    elif isinstance(module, Int4Linear):
        if module.group_size % _INT4_GROUP_MULTIPLE:
            return None
        parts = (_INT4, _tensor(module.packed, torch.uint8, kept))
        parts += (_tensor(module.scales, torch.float32, kept),)
        parts += (_tensor(module.mins, torch.float32, kept), module.group_size)
    elif type(module) in (nn.Linear, FusedLinear):
        parts = (_FLOAT32, _tensor(module.weight, torch.float32, kept), 0, 0, 0)
    else:
        return None
    if None in parts:
        return None
    # int8 activations: qdot.cpp's integer row kernels, up to their crossover.
    integer = getattr(module, "int8_activations", False)
    integer_rows = cpu_kernel.MAX_INTEGER_ROW_KERNEL_ROWS if integer else 0
    return _Weight(*parts, bias_ptr, n, k, integer_rows)


def _describe(layer: DecoderLayer) -> tuple[_Layer, list[torch.Tensor]] | None:
    """The layer in layer.cpp's terms and the tensors it points into, or None where a
    projection or norm is in no native format."""
    attn, mlp, kept = layer.self_attn, layer.mlp, []
    projections = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    weights = [_weight(m, kept) for m in projections]
    norms = [
        _tensor(n.weight, torch.float32, kept)
        for n in (layer.input_layernorm, layer.post_attention_layernorm)
    ]
    hidden = layer.input_layernorm.weight.shape[0]
    if None in weights or None in norms or hidden % _K_MULTIPLE:
        return None
    if mlp.down_proj.in_features % _K_MULTIPLE or attn.head_dim % 2:
        return None
    described = _Layer(
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
    return described, kept


class NativeHalves:
    """One layer's native halves: attention_inputs and attention_outputs' signatures.

    A deep copy of the model (quant_bench quantizes copies of one float model)
    copies the halves without their pointers: the copy describes its own layer at
    its first call, and runs the torch halves if that layer no longer fits.
    """

    __slots__ = ("_owner", "_described", "_address", "_hidden", "_heads", "_kv_heads", "_dim")

    def __init__(self, owner: DecoderLayer):
        self._owner = owner
        self._address = None  # not described yet; 0: described, and the torch halves run

    @classmethod
    def of(cls, layer: DecoderLayer) -> "NativeHalves | None":
        """The layer's halves, or None where they do not apply to it."""
        halves = cls(layer)
        return halves if halves._describe() else None

    def __deepcopy__(self, memo: dict) -> "NativeHalves":
        return NativeHalves(copy.deepcopy(self._owner, memo))

    def _describe(self) -> bool:
        described = _describe(self._owner)
        if described is None:
            self._address = 0  # the torch halves from now on
            return False
        # Kept alive: the calls pass the structure's address, and it the tensors'.
        self._described = described
        layer = described[0]
        self._hidden, self._dim = layer.hidden, layer.head_dim
        self._heads, self._kv_heads = layer.heads, layer.kv_heads
        self._address = ctypes.addressof(layer)
        return True

    def inputs(
        self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._address is None:
            self._describe()
        if not self._address:
            return DecoderLayer.attention_inputs(self._owner, x, residual, cos, sin)
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
        library().layer_inputs_f32(
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
            torch.get_num_threads(),
        )
        return q, k, v, stream

    def outputs(
        self, attended: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._address is None:
            self._describe()
        if not self._address:
            return DecoderLayer.attention_outputs(self._owner, attended, residual)
        tokens = attended.shape[0]
        rows = attended.flatten(1)
        if rows.stride(1) != 1:
            rows = rows.contiguous()
        residual = residual.contiguous()
        out = torch.empty(tokens, self._hidden)
        stream = torch.empty(tokens, self._hidden)
        library().layer_outputs_f32(
            self._address,
            rows.data_ptr(),
            rows.stride(0),
            residual.data_ptr(),
            tokens,
            out.data_ptr(),
            stream.data_ptr(),
            torch.get_num_threads(),
        )
        return out, stream


class NativeDecode:
    """Every layer of a decode-only step in one native call (layer.cpp's decode_layers_f32).

    At one stream the three calls a layer (the halves and attention) cost ~90 us of
    Python and ctypes each time, a few ms a step. Built by install() where every
    layer's halves are native; the layers are described once, as an array of their
    NativeLayer structures, at the first call. A deep copy describes its own layers,
    as NativeHalves does, and where one no longer fits the step keeps the layer loop.
    """

    __slots__ = ("_model", "_layers", "_kept")

    def __init__(self, model: LlamaForCausalLM):
        self._model = model
        self._layers = None  # not described yet; 0: some layer is not native

    def __deepcopy__(self, memo: dict) -> "NativeDecode":
        return NativeDecode(copy.deepcopy(self._model, memo))

    def _describe(self) -> None:
        halves = []
        for layer in self._model.model.layers:
            if not _is_native(layer):
                self._layers = 0
                return
            each = layer.attention_inputs.__self__
            if each._address is None:
                each._describe()
            if not each._address:
                self._layers = 0
                return
            halves.append(each)
        # The array copies the structures; their tensors stay alive in each NativeHalves.
        self._kept = halves
        self._layers = (_Layer * len(halves))(*(each._described[0] for each in halves))

    def __call__(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: PagedKVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(the last MLP's output, the stream before it) from the embeddings x, every new
        key and value written to the pool, as the layer loop returns them; None where the
        step is not all decodes or attention would not take the native call."""
        tokens = x.shape[0]
        if meta.num_decodes != tokens or not native_attention.handles_pool(kv_cache.k, kv_cache.v):
            return None
        if self._layers is None:
            self._describe()
        if not self._layers:
            return None
        x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
        hidden = x.shape[1]
        out, stream = torch.empty(tokens, hidden), torch.empty(tokens, hidden)
        tables = meta.block_tables
        library().decode_layers_f32(
            ctypes.addressof(self._layers),
            len(self._layers),
            x.data_ptr(),
            tokens,
            cos.data_ptr(),
            sin.data_ptr(),
            kv_cache.k.data_ptr(),
            kv_cache.v.data_ptr(),
            kv_cache.k.stride(0),
            meta.slot_mapping.data_ptr(),
            tables.data_ptr(),
            tables.stride(0),
            meta.decode_context_lens.data_ptr(),
            kv_cache.block_size,
            out.data_ptr(),
            stream.data_ptr(),
            torch.get_num_threads(),
        )
        return out, stream
