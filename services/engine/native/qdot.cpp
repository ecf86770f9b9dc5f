// x @ W^T for a few activation rows against int8 or int4 weights in integer arithmetic,
// as llama.cpp's Q8 x Q4 dot products do: each activation row is rounded once per call
// to int8 per block of 32 (a symmetric scale per block), then every 32 weights cost one
// _mm256_maddubs_epi16 + _mm256_madd_epi16 per row instead of four float conversions
// and four FMAs. matmul.cpp's float row kernel is compute-bound on int4 (SmolLM2's 30
// int4-g32 layers read in ~9 ms of memory took 14.4); this one is not.
//
// The activations' rounding changes the numerics (a relative error of ~1/254 per element
// at most, averaging out over a dot product): EngineSettings' quantized_activations
// chooses it, the perplexity gate measured it (docs/quantization.md).
//
// Per block b of 32 inputs, with x ~ d_b * q (q in -127..127):
//   int8 weights (w in -127..127, one scale s per row):  s * sum_b d_b * <w, q>_b
//   int4 (level l in 0..15, scale s_g and minimum m_g per group g of 32-128):
//     sum_b s_g(b) * d_b * <l, q>_b + sum_g m_g * sum_{b in g} d_b * sum(q_b)
// Output rows are split over threads; each output is summed in one fixed order, so the
// thread count never changes a result.

#include <immintrin.h>
#include <stdint.h>

#include <vector>

#include "matmul.h"
#include "vec.h"

namespace {

constexpr int64_t BLOCK = 32;
constexpr int ROWS = 4;  // activation rows a weight row is unpacked for at once

// The activation rows rounded to int8: q [m, k], d [m, k/32], for int8 weights also the
// levels' magnitudes |q| [m, k], and for int4 each group's sum of the rounded activations
// times their scales, [m, k/group].
struct Quantized {
  const int8_t* q;
  const uint8_t* magnitude;
  const float* d;
  const float* group_sums;
  int64_t k, blocks, groups;
};

// 32 floats -> 32 int8 levels, their scale (amax / 127) and the levels' sum. Rounded half
// to even (the default MXCSR mode), as torch.round does.
inline void quantize_block(const float* in, bool even_odd, int8_t* out, uint8_t* magnitude,
                           float* scale, float* sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; i++) {
    v[i] = _mm256_loadu_ps(in + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  float top = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
  *scale = top / 127.0f;
  __m256 inverse = _mm256_set1_ps(*scale > 0.0f ? 1.0f / *scale : 0.0f);
  __m256i level[4];
  for (int i = 0; i < 4; i++) level[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse));
  __m256i total = _mm256_add_epi32(_mm256_add_epi32(level[0], level[1]),
                                   _mm256_add_epi32(level[2], level[3]));
  *sum = vec::sum8(_mm256_cvtepi32_ps(total));  // |sum| <= 32 * 127: exact in float
  // The packs work within 128-bit lanes: the permute puts the 32 bytes back in order.
  __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(level[0], level[1]),
                                     _mm256_packs_epi32(level[2], level[3]));
  bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  if (even_odd) {
    // Each lane's 16 elements as its 8 even then 8 odd ones, then the lanes' evens first.
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    bytes = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(bytes, split), 0xD8);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), bytes);
  if (magnitude)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(magnitude), _mm256_abs_epi8(bytes));
}

// int4 bytes hold element 2j in the low nibble and 2j + 1 in the high one: unpacked as
// [low nibbles | high nibbles] they are a block's even elements then its odd ones, so an
// int4 caller's activations are stored in that order (even_odd) and the weight needs no
// shuffle. int8 callers (no group) get the magnitudes.
Quantized quantize_rows(const float* x, int64_t m, int64_t x_stride, int64_t k, bool even_odd,
                        int64_t group) {
  static thread_local std::vector<int8_t> q;
  static thread_local std::vector<uint8_t> magnitudes;
  static thread_local std::vector<float> d, group_sums;
  int64_t blocks = k / BLOCK, groups = group ? k / group : 0;
  if (static_cast<int64_t>(q.size()) < m * k) q.resize(m * k);
  if (!group && static_cast<int64_t>(magnitudes.size()) < m * k) magnitudes.resize(m * k);
  if (static_cast<int64_t>(d.size()) < m * blocks) d.resize(m * blocks);
  if (static_cast<int64_t>(group_sums.size()) < m * groups) group_sums.resize(m * groups);
  for (int64_t r = 0; r < m; r++)
    for (int64_t b = 0; b < blocks; b++) {
      float scale, sum;
      int64_t at = r * k + b * BLOCK;
      quantize_block(x + r * x_stride + b * BLOCK, even_odd, q.data() + at,
                     group ? nullptr : magnitudes.data() + at, &scale, &sum);
      d[r * blocks + b] = scale;
      if (groups) {
        float& group_sum = group_sums[r * groups + b * BLOCK / group];
        group_sum = b * BLOCK % group ? group_sum + scale * sum : scale * sum;
      }
    }
  return {q.data(), magnitudes.data(), d.data(), group_sums.data(), k, blocks, groups};
}

// 8 int32 sums of 4 products each: maddubs multiplies unsigned bytes by signed ones and
// adds pairs into int16 (at most 2 * 127 * 127 or 2 * 15 * 127 < 32767 for the operands
// here: no saturation), madd by ones adds pairs of those into int32.
inline __m256i dot32(__m256i unsigned_bytes, __m256i signed_bytes) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned_bytes, signed_bytes),
                           _mm256_set1_epi16(1));
}

// Two accumulators a row, for the even and the odd blocks: with one, each FMA would wait
// for the previous block's (4-5 cycles), which at one row is longer than a block's work.
// Block is the weight format's: weights(b) unpacks block b, dot() gives its 8 integer sums
// with activation row r as floats, factor() what they are worth (the scales).
template <int M, class Block>
void dot_blocks(const Block& block, const Quantized& x, __m256 acc[M]) {
  __m256 odd[M];
  for (int r = 0; r < M; r++) acc[r] = odd[r] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= x.blocks; b += 2) {
    typename Block::Weights w0 = block.weights(b), w1 = block.weights(b + 1);
    for (int r = 0; r < M; r++) {
      acc[r] = _mm256_fmadd_ps(block.dot(w0, x, b, r), block.factor(w0, x, b, r), acc[r]);
      odd[r] = _mm256_fmadd_ps(block.dot(w1, x, b + 1, r), block.factor(w1, x, b + 1, r), odd[r]);
    }
  }
  if (b < x.blocks) {
    typename Block::Weights w = block.weights(b);
    for (int r = 0; r < M; r++)
      acc[r] = _mm256_fmadd_ps(block.dot(w, x, b, r), block.factor(w, x, b, r), acc[r]);
  }
  for (int r = 0; r < M; r++) acc[r] = _mm256_add_ps(acc[r], odd[r]);
}

inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// int8 weights: maddubs wants one operand unsigned, so the activations' |q| with q's sign
// moved onto the weights (sign_epi8 also zeroes them where q is 0). One sign_epi8 a block
// and row: |w| with w's sign on q would take two, and on first-generation Zen the int8
// body is bound by its instruction count (docs/quantization.md). -w of -128 is no int8:
// the format's levels stop at -127 (quantize_int8 clamps).
struct Int8Block {
  const int8_t* w;
  using Weights = __m256i;
  Weights weights(int64_t b) const { return load32(w + b * BLOCK); }
  __m256 dot(const Weights& v, const Quantized& x, int64_t b, int r) const {
    int64_t at = r * x.k + b * BLOCK;
    __m256i signed_w = _mm256_sign_epi8(v, load32(x.q + at));
    return _mm256_cvtepi32_ps(dot32(load32(x.magnitude + at), signed_w));
  }
  __m256 factor(const Weights&, const Quantized& x, int64_t b, int r) const {
    return _mm256_broadcast_ss(x.d + r * x.blocks + b);
  }
};

// int4 levels 0..15 are unsigned already; the group's scale joins the block's factor.
struct Int4Block {
  const uint8_t* packed;
  const float* scales;
  int group_shift;  // log2 of blocks per group
  struct Weights {
    __m256i levels;
    float scale;
  };
  Weights weights(int64_t b) const {
    __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + b * BLOCK / 2));
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes);
    return {_mm256_and_si256(both, _mm256_set1_epi8(0x0F)), scales[b >> group_shift]};
  }
  __m256 dot(const Weights& v, const Quantized& x, int64_t b, int r) const {
    return _mm256_cvtepi32_ps(dot32(v.levels, load32(x.q + r * x.k + b * BLOCK)));
  }
  __m256 factor(const Weights& v, const Quantized& x, int64_t b, int r) const {
    return _mm256_set1_ps(v.scale * x.d[r * x.blocks + b]);
  }
};

template <int M>
void int8_dot_rows(const int8_t* w, float scale, const Quantized& x, float* out,
                   int64_t out_stride) {
  __m256 acc[M];
  dot_blocks<M>(Int8Block{w}, x, acc);
  for (int r = 0; r < M; r++) out[r * out_stride] = scale * vec::sum8(acc[r]);
}

template <int M>
void int4_dot_rows(const uint8_t* packed, const float* scales, const float* mins, int64_t group,
                   const Quantized& x, float* out, int64_t out_stride) {
  int shift = __builtin_ctzll(group / BLOCK);
  __m256 acc[M];
  dot_blocks<M>(Int4Block{packed, scales, shift}, x, acc);
  for (int r = 0; r < M; r++) {
    // The minimums' term, 8 groups a vector: a scalar loop here cost as much as the
    // levels' dot products at group 32.
    const float* sums = x.group_sums + r * x.groups;
    __m256 low = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= x.groups; g += 8)
      low = _mm256_fmadd_ps(_mm256_loadu_ps(mins + g), _mm256_loadu_ps(sums + g), low);
    float tail = 0.0f;
    for (; g < x.groups; g++) tail += mins[g] * sums[g];
    out[r * out_stride] = vec::sum8(_mm256_add_ps(acc[r], low)) + tail;
  }
}

struct Int8Dot {
  const int8_t* q;
  const float* scale;
  int64_t k;
  template <int M>
  void run(int64_t col, const Quantized& x, float* out, int64_t stride) const {
    int8_dot_rows<M>(q + col * k, scale[col], x, out, stride);
  }
};

struct Int4Dot {
  const uint8_t* packed;
  const float *scales, *mins;
  int64_t group, k;
  template <int M>
  void run(int64_t col, const Quantized& x, float* out, int64_t stride) const {
    int64_t groups = k / group;
    int4_dot_rows<M>(packed + col * (k / 2), scales + col * groups, mins + col * groups, group,
                     x, out, stride);
  }
};

// out [m, n]: each output row's weight against the activation rows, ROWS at a time.
template <class Dot>
void over_outputs(const Dot& dot, const Quantized& x, int64_t m, int64_t n, float* out,
                  int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t col = 0; col < n; col++)
    for (int64_t r = 0; r < m; r += ROWS) {
      Quantized rows{x.q + r * x.k,      x.magnitude + r * x.k, x.d + r * x.blocks,
                     x.group_sums + r * x.groups, x.k, x.blocks, x.groups};
      float* o = out + r * n + col;
      switch (m - r < ROWS ? m - r : ROWS) {
        case 4: dot.template run<4>(col, rows, o, n); break;
        case 3: dot.template run<3>(col, rows, o, n); break;
        case 2: dot.template run<2>(col, rows, o, n); break;
        default: dot.template run<1>(col, rows, o, n); break;
      }
    }
}

}  // namespace

void int8_qdot(const int8_t* q, const float* scale, int64_t n, int64_t k, const float* x,
               int64_t m, int64_t x_stride, float* out, int threads) {
  Quantized rows = quantize_rows(x, m, x_stride, k, false, 0);
  over_outputs(Int8Dot{q, scale, k}, rows, m, n, out, threads);
}

void int4_qdot(const uint8_t* packed, const float* scales, const float* mins, int64_t group,
               int64_t n, int64_t k, const float* x, int64_t m, int64_t x_stride, float* out,
               int threads) {
  Quantized rows = quantize_rows(x, m, x_stride, k, true, group);
  over_outputs(Int4Dot{packed, scales, mins, group, k}, rows, m, n, out, threads);
}

extern "C" {

// cpu_kernel.py's entries, int8_matmul_f32's and int4_matmul_f32's arguments (k a
// multiple of 32).
void int8_matmul_q8(const float* x, int64_t m, int64_t x_stride, const int8_t* q,
                    const float* scale, int64_t n, int64_t k, float* out, int threads) {
  int8_qdot(q, scale, n, k, x, m, x_stride, out, threads);
}

void int4_matmul_q8(const float* x, int64_t m, int64_t x_stride, const uint8_t* packed,
                    const float* scales, const float* mins, int64_t group, int64_t n,
                    int64_t k, float* out, int threads) {
  int4_qdot(packed, scales, mins, group, n, k, x, m, x_stride, out, threads);
}

}  // extern "C"
