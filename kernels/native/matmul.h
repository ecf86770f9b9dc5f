// One projection's weight as a layer holds it, for the layer halves (layer.cpp) to
// multiply by through matmul.cpp's kernels; services/engine/native_layers.py fills it
// (bindings.py's Weight mirrors this layout and checks it against layer.cpp's
// native_layout() at load).
#pragma once

#include <stdint.h>

enum : int64_t {
  WEIGHT_FLOAT32 = 0,
  WEIGHT_INT8 = 1,
  WEIGHT_INT4 = 2,
  WEIGHT_INT4_COLS8 = 3,
  WEIGHT_INT8_COLS8 = 4,
  WEIGHT_INT4_COLS16 = 5,
  WEIGHT_INT8_COLS16 = 6,
};

// The interleaved formats: a checkpoint's int4 or int8 blocks of 32 inputs, 8 output rows
// a vector for qdot.cpp's int16 row kernel (cols8_qdot; every step, whatever integer_rows
// says), n a multiple of 8. For output rows 8g..8g+7, block b and quad p (inputs i = 32b +
// 4p .. 32b + 4p + 3), c < 8, e < 2, data [n/8][k/32][8]:
// - WEIGHT_INT4_COLS8: 16 bytes, byte 2c + e holding row 8g + c's level of input i + e in
//   its low nibble and of input i + 2 + e in its high one;
// - WEIGHT_INT8_COLS8: 32 bytes, byte 2c + e row 8g + c's input i + e, byte 16 + 2c + e
//   its input i + 2 + e.
// scales (and int4's mins) [n/8][k/32][8].
//
// The int8 interleaved formats: the same blocks, 16 output rows a vector for qdot.cpp's
// int8 kernel (cols16_qdot; every step of a weight with --wide-gemm int8, activations
// rounded to int8 per block of 32), n a multiple of 16. For output rows 16g..16g+15 and block b, c < 16, e < 4, data
// [n/16][k/32][...][64]:
// - WEIGHT_INT4_COLS16: 4 octets of 64 bytes, octet o's byte 4c + e holding row 16g + c's
//   level of input 32b + 8o + e in its low nibble and of input 32b + 8o + 4 + e in its
//   high one;
// - WEIGHT_INT8_COLS16: 8 quads of 64 bytes, quad p's byte 4c + e row 16g + c's level of
//   input 32b + 4p + e plus 128 (unsigned, as vpdpbusd takes its first operand).
// scales and mins [n/16][k/32][16]; int8's mins are -128 * scale (the offset's share).

struct NativeWeight {
  int64_t format;      // WEIGHT_*
  const void* data;    // float32 [n, k], int8 [n, k] or packed uint8 [n, k/2]
  const float* scales; // int8: [n] (group 0) or [n, k/group]; int4: [n, k/group]
  const float* mins;   // int4: [n, k/group]
  int64_t group;       // int4: its group size; int8: 0 (a scale per row) or the scales'
                       // group (a GGUF file's Q8_0: 32); a multiple of 32
  const float* bias;   // [n] or null
  int64_t n, k;
  // int8 and int4: up to this many rows the activations are rounded to int8 (int16 where
  // integer16 is 1) per block of 32 for qdot.cpp's integer row kernels (0: never, they
  // stay float32).
  int64_t integer_rows;
  // The panel GEMM in bf16 (bf16.h) instead of float32: 1 asks for it where the library
  // has it (wide_bf16_kernel()), 0 keeps float32's. bf16: a float32 weight's copy rounded
  // to bf16 [n, k], made once at load (null: each panel is rounded per call, as int8 and
  // int4 panels are dequantized into bf16); with it, narrow steps run bf16_rows too, the
  // panel's sums, so every width computes alike.
  int64_t wide_bf16;
  const uint16_t* bf16;
  // A float32 weight dequantized from a checkpoint's quantized blocks (a GGUF file's
  // Q4_0/Q4_1 projections, its Q8_0 head) may keep those blocks as they are here, and then
  // steps of up to blocks_rows rows multiply by them, float32 activations and all: up to
  // blocks_row_rows rows through their row kernel, reading an eighth (int4) or a quarter
  // (int8) of float32's bytes; wider ones through the panel GEMM, each panel dequantized
  // into float32 in L2 where the float32 weight's would come from memory. Both hold the
  // same weights (the blocks' scales are float16 values: level * scale + min is exact in
  // float32), so a panel step's sums are the float32 weight's bit for bit; a row-kernel
  // step's differ only in their order, as between float32's own row kernel and panel
  // (unless the blocks' integer_rows round the activations to int16 for that kernel).
  // Wider steps than blocks_rows read this weight. null: every step reads this weight.
  const NativeWeight* blocks;
  int64_t blocks_rows;
  int64_t blocks_row_rows;
  int64_t integer16;
};

// out [m, n] (contiguous) = x [m, k] (row stride x_stride) @ W^T + bias: through w.blocks
// up to w.blocks_rows rows where it has them, else the row kernel up to row_kernel_rows
// rows (bf16_rows for a float32 weight computed in bf16), the panel GEMM above (panels of
// panel_bytes of float32 rows, or of bf16 rows where w.wide_bf16 asks and the build has
// them).
void native_linear(const NativeWeight& w, const float* x, int64_t m, int64_t x_stride,
                   float* out, int64_t row_kernel_rows, int64_t panel_bytes, int threads);

// qdot.cpp's row kernels: out [m, n] = x [m, k] (k a multiple of 32) @ W^T, no bias; the
// activations rounded to int8, or to int16 where int16.
void int8_qdot(const int8_t* q, const float* scales, int64_t group, int64_t n, int64_t k,
               const float* x, int64_t m, int64_t x_stride, bool int16, float* out,
               int threads);
// The same for an interleaved weight (WEIGHT_*_COLS8), on activations rounded to int16.
void cols8_qdot(const NativeWeight& w, const float* x, int64_t m, int64_t x_stride,
                float* out, int threads);
// The same for an int8 interleaved weight (WEIGHT_*_COLS16), on activations rounded to
// int8: built only where the compiler targets AVX512-VNNI and AVX512BW (vpdpbusd on
// 512-bit vectors); elsewhere it does not exist and cols16_kernel() says 0.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define COLS16_KERNEL 1
void cols16_qdot(const NativeWeight& w, const float* x, int64_t m, int64_t x_stride,
                 float* out, int threads);
#endif
void int4_qdot(const uint8_t* packed, const float* scales, const float* mins, int64_t group,
               int64_t n, int64_t k, const float* x, int64_t m, int64_t x_stride, bool int16,
               float* out, int threads);
