// The bf16 panel GEMM's pieces (bf16_panel.cpp; amx_panel.cpp on a CPU with AMX), for
// matmul.cpp's wide path when a weight asks for it (NativeWeight::wide_bf16). Built only
// where the compiler targets avx512_bf16 (library.py's build for such a CPU); elsewhere
// none of this exists and wide_bf16_kernel() says so.
//
// Layouts, both read by vdpbf16ps (two bf16 products summed into each float32 lane) and
// by AMX's tile dot product alike:
// - a weight panel: bf16 [rows, k], row-major, so each output row's k-pairs are 32-bit
//   words in input order (a float32 weight's copy is made once at load, int8 and int4
//   panels are dequantized into it per call);
// - activations: blocks of BF16_BLOCK_ROWS rows (the last of 8 when the padded rows leave
//   that), each [k/2][its rows][2]: the pair j of every row of the block side by side.
// Every output is the float32 sum of its bf16 products, in input order with vdpbf16ps
// (bf16_panel.cpp; bf16_rows, for a few rows, gives the same sums), in the hardware's
// order within a tile with AMX (amx_panel.cpp).
#pragma once

#include <stdint.h>

constexpr int64_t BF16_BLOCK_ROWS = 16;

// 0: no bf16 panel in this build; 1: vdpbf16ps (AVX512-BF16); 2: AMX tiles (the build has
// them and Linux granted this process the tile state).
extern "C" int64_t wide_bf16_kernel();

#ifdef __AVX512BF16__

// Output rows a panel is a multiple of.
constexpr int64_t BF16_PANEL_MULTIPLE = 16;

// out[i] = x[i] rounded to bf16, to nearest even; n a multiple of 8.
void to_bf16(const float* x, int64_t n, uint16_t* out);

// Activation rows the packed blocks hold for `rows` rows (zero rows pad them).
int64_t bf16_padded_rows(int64_t rows, int64_t k);

// x [rows, k] (row stride x_stride) -> the packed blocks of `padded` rows in xt. Called by
// every thread of a team, each packing its share of the blocks (an orphaned omp for).
void bf16_pack_rows(const float* x, int64_t rows, int64_t x_stride, int64_t k, int64_t padded,
                    uint16_t* xt);

// sums[i * padded + r] = dot(weight row i, activation row r) for the panel's `count` rows
// (w [count, k] bf16) and every packed row.
void bf16_panel(const uint16_t* w, int64_t count, int64_t k, const uint16_t* xt,
                int64_t padded, float* sums);

// The narrow steps' kernel: out [m, n] (contiguous) = x [m, k] (row stride x_stride)
// rounded to bf16, dotted with w [n, k] bf16, each output the very sum bf16_panel's
// vdpbf16ps tile gives it (from +0, its input pairs in order), so a row's result does
// not depend on how many rows share its step. k a multiple of 32 (bf16_rows_take).
void bf16_rows(const uint16_t* w, int64_t n, int64_t k, const float* x, int64_t m,
               int64_t x_stride, float* out, int threads);

inline bool bf16_rows_take(int64_t k) { return k % 32 == 0; }

#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)

// Whether Linux granted this process AMX's tile state (asked once, at the first call).
bool amx_available();

// bf16_panel with AMX tiles (amx_panel.cpp), for k a multiple of 32 and padded a
// multiple of 16 (bf16_padded_rows' choice where amx_available()).
void amx_panel(const uint16_t* w, int64_t count, int64_t k, const uint16_t* xt,
               int64_t padded, float* sums);

inline bool use_amx(int64_t k) { return k % 32 == 0 && amx_available(); }

#endif
