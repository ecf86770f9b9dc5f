"""The one ctypes binding of the engine's native library: every exported function by name.

library.py builds and loads the shared object; this module declares, once, each
exported function's argument and result types (SIGNATURES, in the C++
declarations' order) and the structures the layer kernels read (Weight:
matmul.h's NativeWeight; Layer: layer.cpp's NativeLayer; LowRank and Lora:
lora.h's, a step's LoRA adapters). library() binds them
all and, before any caller can pass a structure, compares the ctypes layout
with the one the C++ compiler chose (layer.cpp's native_layout()): a field
added on one side only fails the load instead of corrupting a step. Every
caller (cpu_linear, native_argmax, native_attention, native_layers,
quantization/cpu_kernel) calls `library().<name>(...)` positionally: at batch
1 a whole attention call is ~20 us of kernel, so each wrapper microsecond shows.
"""

import ctypes
from functools import cache

from maas_kernels.native import library as native

PTR = ctypes.c_void_p
INT = ctypes.c_int64
THREADS = ctypes.c_int
FLOAT = ctypes.c_float

# matmul.h's WEIGHT_* formats.
FLOAT32, INT8, INT4, INT4_COLS8, INT8_COLS8, INT4_COLS16, INT8_COLS16 = 0, 1, 2, 3, 4, 5, 6
# wide_bf16_kernel()'s answers, by name.
WIDE_BF16_KERNELS = {0: "", 1: "avx512_bf16", 2: "amx"}


class Weight(ctypes.Structure):
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
        ("wide_bf16", ctypes.c_int64),
        ("bf16", ctypes.c_void_p),
        ("blocks", ctypes.c_void_p),  # the address of another Weight, or null
        ("blocks_rows", ctypes.c_int64),
        ("blocks_row_rows", ctypes.c_int64),
        ("integer16", ctypes.c_int64),
    ]


class Layer(ctypes.Structure):
    """layer.cpp's NativeLayer."""

    _fields_ = [
        ("qkv", Weight),
        ("o", Weight),
        ("gate_up", Weight),
        ("down", Weight),
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


class LowRank(ctypes.Structure):
    """lora.h's NativeLowRank."""

    _fields_ = [("a_t", ctypes.c_void_p), ("b_t", ctypes.c_void_p), ("width", ctypes.c_int64)]


class Lora(ctypes.Structure):
    """lora.h's NativeLora: one layer's adapters."""

    _fields_ = [("qkv", LowRank), ("o", LowRank), ("gate_up", LowRank), ("down", LowRank)]


# attention.cpp's paged decode attention, over float32 or bf16 pools.
ATTENTION = [
    *(PTR, INT, INT) * 3,  # q, k, v and their token and head strides
    PTR,  # slot_mapping
    INT,  # tokens
    PTR,  # k_cache
    PTR,  # v_cache
    INT,  # whether the pools are bf16
    PTR,  # block_tables
    INT,  # table width
    PTR,  # context_lens
    *(INT,) * 5,  # decodes, heads, kv_heads, head_dim, block_size
    FLOAT,  # scale
    PTR,  # out
    THREADS,
]

# name -> (argument types, result type), each function as its .cpp declares it.
SIGNATURES: dict[str, tuple[list, type | None]] = {
    # argmax.cpp: logits, rows, vocab, row stride, out.
    "argmax_rows_f32": ([PTR, INT, INT, INT, PTR, THREADS], None),
    "paged_attention_decode": (ATTENTION, None),
    # linear.cpp: x, m, x stride, w, bias, n, k, out, row kernel rows, panel bytes.
    "f32_linear": ([PTR, INT, INT, PTR, PTR, INT, INT, PTR, INT, INT, THREADS], None),
    # A Weight's address, x, m, x stride, out, row kernel rows, panel bytes.
    "weight_linear": ([PTR, PTR, INT, INT, PTR, INT, INT, THREADS], None),
    # matmul.cpp and qdot.cpp: x, m, x stride, the weight's arrays and group, n, k, out.
    "int8_matmul_f32": ([PTR, INT, INT, PTR, PTR, INT, INT, INT, PTR, THREADS], None),
    "int4_matmul_f32": ([PTR, INT, INT, PTR, PTR, PTR, INT, INT, INT, PTR, THREADS], None),
    "int8_matmul_q8": ([PTR, INT, INT, PTR, PTR, INT, INT, INT, PTR, THREADS], None),
    "int4_matmul_q8": ([PTR, INT, INT, PTR, PTR, PTR, INT, INT, INT, PTR, THREADS], None),
    "int8_gemm_f32": ([PTR, INT, INT, PTR, PTR, INT, INT, INT, PTR, INT, THREADS], None),
    "int4_gemm_f32": ([PTR, INT, INT, PTR, PTR, PTR, INT, INT, INT, PTR, INT, THREADS], None),
    "int8_dequantize_f32": ([PTR, PTR, INT, INT, INT, PTR, THREADS], None),
    "int4_dequantize_f32": ([PTR, PTR, PTR, INT, INT, INT, PTR, THREADS], None),
    # layer.cpp: a Layer's address first; the last two pointers before the threads are a
    # Lora's address (or the layers' array of them) and the rows' adapters, or null.
    "layer_inputs_f32": (
        [PTR, PTR, PTR, INT, PTR, PTR, PTR, PTR, PTR, PTR, PTR, PTR, THREADS],
        None,
    ),
    "layer_outputs_f32": ([PTR, PTR, INT, PTR, INT, PTR, PTR, PTR, PTR, THREADS], None),
    # layers, count, x, tokens, cos, sin, pools, their layer stride and whether bf16, the
    # metadata's slots, tables, table width, lengths and block size, loras, rows' adapters,
    # out, stream.
    "decode_layers_f32": (
        [PTR, INT, PTR, INT, PTR, PTR, PTR, PTR, INT, INT, PTR, PTR, INT, PTR, INT]
        + [PTR, PTR, PTR, PTR, THREADS],
        None,
    ),
    "native_layout": ([PTR, INT], ctypes.c_int64),
    # bf16_panel.cpp: 0 no bf16 panel GEMM in this build, 1 vdpbf16ps, 2 AMX tiles.
    "wide_bf16_kernel": ([], ctypes.c_int64),
    "cols16_kernel": ([], ctypes.c_int64),
}


def expected_layout() -> list[int]:
    """What native_layout() must report: each structure's size, then its fields' offsets."""
    values = []
    for structure in (Weight, Layer, LowRank, Lora):
        values.append(ctypes.sizeof(structure))
        values += [getattr(structure, name).offset for name, _ in structure._fields_]
    return values


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """lib with every signature set and its structures' layout checked (idempotent)."""
    for name, (argtypes, restype) in SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype
    expected = expected_layout()
    reported = (ctypes.c_int64 * len(expected))()
    count = lib.native_layout(ctypes.addressof(reported), len(expected))
    if count != len(expected) or list(reported) != expected:
        raise RuntimeError(
            f"{lib._name}: the native structures' layout {list(reported)[:count]} "
            f"(count {count}) is not bindings.py's {expected}"
        )
    return lib


@cache
def library() -> ctypes.CDLL | None:
    """The engine's native library, bound and checked, or None where it cannot run."""
    lib = native.library()
    return None if lib is None else bind(lib)
