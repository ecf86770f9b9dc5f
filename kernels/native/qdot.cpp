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
// Or the activations are rounded to int16 per block of 32 (d_b = amax / 32767: each moves
// by at most 1/65534 of its block's largest, finer than bf16's rounding of every element),
// and every 32 weights cost one _mm256_madd_epi16 pair per row (int4 levels or int8
// weights widened to int16): the float row kernel's conversions and FMAs go, the float
// activations' precision nearly stays (EngineSettings' kernel_activations, for a GGUF's
// own blocks).
//
// Per block b of 32 inputs, with x ~ d_b * q (q in -127..127):
//   int8 weights (w in -127..127, one scale s per row):  s * sum_b d_b * <w, q>_b
//     or a scale s_g per group g of 32-128 (a GGUF file's Q8_0): sum_b s_g(b) * d_b * <w, q>_b
//   int4 (level l in 0..15, scale s_g and minimum m_g per group g of 32-128):
//     sum_b s_g(b) * d_b * <l, q>_b + sum_g m_g * sum_{b in g} d_b * sum(q_b)
// Output rows are split over threads; each output is summed in one fixed order, so the
// thread count never changes a result.

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>
#include <vector>

#include "matmul.h"
#include "vec.h"

namespace {

constexpr int64_t BLOCK = 32;
constexpr int ROWS = 4;  // activation rows a weight row is unpacked for at once
// Rows from which the activations are rounded by the kernel's threads together (each row
// by one, so the thread count changes nothing): a wide step's rounding alone on one
// thread left the others waiting.
constexpr int64_t PARALLEL_ROUNDING_ROWS = 16;

// round_row(r) for every activation row: on the kernel's threads from
// PARALLEL_ROUNDING_ROWS rows, else on this one, without entering libgomp at all (a
// narrow step rounds each of its ~120 calls' rows in well under a microsecond a row).
template <class RoundRow>
void each_row(int64_t m, int threads, const RoundRow& round_row) {
  if (m < PARALLEL_ROUNDING_ROWS) {
    for (int64_t r = 0; r < m; r++) round_row(r);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t r = 0; r < m; r++) round_row(r);
}

// The activation rows rounded to int8: q [m, k], d [m, k/32], for int8 weights also the
// levels' magnitudes |q| [m, k], and for int4 each group's sum of the rounded activations
// times their scales, [m, k/group], and each pair of blocks' scales as Int4Pair's
// products need them, [m, k/64, 8].
// Rounded to int16 instead, q16 [m, k] holds the levels (magnitude and pair_d are unused).
struct Quantized {
  const int8_t* q;
  const int16_t* q16;
  const uint8_t* magnitude;
  const float* d;
  const float* group_sums;
  const float* pair_d;
  int64_t k, blocks, groups;

  // The same from activation row r on (the arrays this rounding has; the others stay null).
  Quantized from_row(int64_t r) const {
    return {q ? q + r * k : nullptr,
            q16 ? q16 + r * k : nullptr,
            magnitude ? magnitude + r * k : nullptr,
            d + r * blocks,
            group_sums + r * groups,
            pair_d ? pair_d + r * (blocks / 2) * 8 : nullptr,
            k,
            blocks,
            groups};
  }
};

// Block b's scale times its levels' sum into its group's sum (the first block of a group
// starts it): what the minimums of int4 weights multiply.
inline void add_to_group(float* group_sums, int64_t b, int64_t group, float scale, float sum) {
  float& group_sum = group_sums[b * BLOCK / group];
  group_sum = b * BLOCK % group ? group_sum + scale * sum : scale * sum;
}

// 32 floats -> 32 levels in -top..top as int32, in order, 8 a vector: the scale (amax /
// top) is returned, the levels' sum (|sum| <= 32 * 32767: exact in float) goes to *sum.
// Rounded half to even (the default MXCSR mode), as torch.round does.
inline float round_block(const float* in, float top, __m256i level[4], float* sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; i++) {
    v[i] = _mm256_loadu_ps(in + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
  }
  float scale = vec::max8(amax) / top;
  __m256 inverse = _mm256_set1_ps(scale > 0.0f ? 1.0f / scale : 0.0f);
  for (int i = 0; i < 4; i++) level[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse));
  __m256i total = _mm256_add_epi32(_mm256_add_epi32(level[0], level[1]),
                                   _mm256_add_epi32(level[2], level[3]));
  *sum = vec::sum8(_mm256_cvtepi32_ps(total));
  return scale;
}

// 32 floats -> 32 int8 levels, their scale (amax / 127) and the levels' sum. The levels'
// first 16 (with even_odd: the 16 even elements) go to low, the other 16 to high.
inline void quantize_block(const float* in, bool even_odd, int8_t* low, int8_t* high,
                           uint8_t* magnitude, float* scale, float* sum) {
  __m256i level[4];
  *scale = round_block(in, 127.0f, level, sum);
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
  _mm_storeu_si128(reinterpret_cast<__m128i*>(low), _mm256_castsi256_si128(bytes));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(high), _mm256_extracti128_si256(bytes, 1));
  if (magnitude)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(magnitude), _mm256_abs_epi8(bytes));
}

// int4 bytes hold element 2j in the low nibble and 2j + 1 in the high one, so a 32-byte
// load of two blocks' weights masks into [b's evens | b+1's evens] and, shifted,
// [b's odds | b+1's odds]. An int4 caller's activations are stored in that order (pairs),
// each pair of blocks as its 32 even elements then its 32 odd ones, and the weight needs no
// shuffle; a last unpaired block is stored as its evens then its odds. int8 callers (no
// group) get the magnitudes.
Quantized quantize_rows(const float* x, int64_t m, int64_t x_stride, int64_t k, bool pairs,
                        int64_t group, int threads) {
  static thread_local std::vector<int8_t> q;
  static thread_local std::vector<uint8_t> magnitudes;
  static thread_local std::vector<float> d, group_sums, pair_d;
  int64_t blocks = k / BLOCK, groups = group ? k / group : 0, pair_count = blocks / 2;
  if (static_cast<int64_t>(q.size()) < m * k) q.resize(m * k);
  if (!group && static_cast<int64_t>(magnitudes.size()) < m * k) magnitudes.resize(m * k);
  if (static_cast<int64_t>(d.size()) < m * blocks) d.resize(m * blocks);
  if (static_cast<int64_t>(group_sums.size()) < m * groups) group_sums.resize(m * groups);
  if (pairs && static_cast<int64_t>(pair_d.size()) < m * pair_count * 8)
    pair_d.resize(m * pair_count * 8);
  // Plain pointers into this thread's buffers: in the loop's other threads the names
  // would be theirs.
  int8_t* levels = q.data();
  uint8_t* magnitude = group ? nullptr : magnitudes.data();
  float *scales = d.data(), *sums = group_sums.data(), *pair_scales = pair_d.data();
  each_row(m, threads, [&](int64_t r) {
    for (int64_t b = 0; b < blocks; b++) {
      float scale, sum;
      int8_t* at = levels + r * k + b * BLOCK;
      bool paired = pairs && b < 2 * pair_count;
      // A paired block's evens and odds go to its half of the pair's evens and odds.
      int8_t* low = paired ? at - (b & 1) * (BLOCK / 2) : at;
      int8_t* high = low + (paired ? BLOCK : BLOCK / 2);
      quantize_block(x + r * x_stride + b * BLOCK, pairs, low, high,
                     magnitude ? magnitude + r * k + b * BLOCK : nullptr, &scale, &sum);
      if (paired) {
        float* lanes = pair_scales + (r * pair_count + b / 2) * 8 + (b & 1) * 4;
        for (int i = 0; i < 4; i++) lanes[i] = scale;
      }
      scales[r * blocks + b] = scale;
      if (groups) add_to_group(sums + r * groups, b, group, scale, sum);
    }
  });
  return {levels, nullptr, magnitudes.data(), scales, sums, pair_scales, k, blocks, groups};
}

// 32 floats -> 32 int16 levels (their scale amax / 32767), stored as 16 and 16: with
// even_odd the block's even elements then its odd ones (an int4 weight's low and high
// nibbles, in byte order), else in order. Returns the scale; *sum is the levels' sum.
inline float quantize_block16(const float* in, bool even_odd, int16_t* out, float* sum) {
  __m256i level[4];
  float scale = round_block(in, 32767.0f, level, sum);
  __m256i first, second;
  if (even_odd) {
    // Each vector of 8 as its 4 evens then 4 odds; packs then interleaves the 128-bit
    // lanes as [evens of 0-15 | odds of 0-15], and the permutes gather the evens.
    const __m256i split = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for (int i = 0; i < 4; i++) level[i] = _mm256_permutevar8x32_epi32(level[i], split);
    __m256i low = _mm256_packs_epi32(level[0], level[1]);
    __m256i high = _mm256_packs_epi32(level[2], level[3]);
    first = _mm256_permute2x128_si256(low, high, 0x20);
    second = _mm256_permute2x128_si256(low, high, 0x31);
  } else {
    // packs works within 128-bit lanes: the permute puts the 64-bit quarters in order.
    first = _mm256_permute4x64_epi64(_mm256_packs_epi32(level[0], level[1]), 0xD8);
    second = _mm256_permute4x64_epi64(_mm256_packs_epi32(level[2], level[3]), 0xD8);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), first);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), second);
  return scale;
}

// The rows rounded to int16: q16 (each block's evens then odds where even_odd, else in
// order), d, and for int4 (group > 0) the groups' sums as quantize_rows gives them.
Quantized quantize_rows16(const float* x, int64_t m, int64_t x_stride, int64_t k,
                          int64_t group, bool even_odd, int threads) {
  static thread_local std::vector<int16_t> q;
  static thread_local std::vector<float> d, group_sums;
  int64_t blocks = k / BLOCK, groups = group ? k / group : 0;
  if (static_cast<int64_t>(q.size()) < m * k) q.resize(m * k);
  if (static_cast<int64_t>(d.size()) < m * blocks) d.resize(m * blocks);
  if (static_cast<int64_t>(group_sums.size()) < m * groups) group_sums.resize(m * groups);
  // Plain pointers, as quantize_rows takes them.
  int16_t* levels = q.data();
  float *scales = d.data(), *sums = group_sums.data();
  each_row(m, threads, [&](int64_t r) {
    for (int64_t b = 0; b < blocks; b++) {
      float sum, scale = quantize_block16(x + r * x_stride + b * BLOCK, even_odd,
                                          levels + r * k + b * BLOCK, &sum);
      scales[r * blocks + b] = scale;
      if (groups) add_to_group(sums + r * groups, b, group, scale, sum);
    }
  });
  return {nullptr, levels, nullptr, scales, sums, nullptr, k, blocks, groups};
}

// 8 int32 sums of 4 products each: maddubs multiplies unsigned bytes by signed ones and
// adds pairs into int16 (at most 2 * 127 * 127 or 2 * 15 * 127 < 32767 for the operands
// here: no saturation), madd by ones adds pairs of those into int32.
inline __m256i dot32(__m256i unsigned_bytes, __m256i signed_bytes) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned_bytes, signed_bytes),
                           _mm256_set1_epi16(1));
}

// Two accumulators a row, for the even and the odd units: with one, each FMA would wait
// for the previous unit's (4-5 cycles), which at one row is longer than a unit's work.
// A unit is the weight format's (a block of 32 for int8, a pair of blocks for int4):
// weights(u) unpacks unit u, dot() gives its 8 integer sums with activation row r as
// floats, factor() what they are worth (the scales).
template <int M, class Unit>
inline void add_unit(const Unit& unit, const Quantized& x, int64_t u, __m256 acc[M]) {
  typename Unit::Weights w = unit.weights(u);
  for (int r = 0; r < M; r++)
    acc[r] = _mm256_fmadd_ps(unit.dot(w, x, u, r), unit.factor(w, x, u, r), acc[r]);
}

template <int M, class Unit>
void dot_units(const Unit& unit, const Quantized& x, int64_t units, __m256 acc[M]) {
  __m256 odd[M];
  for (int r = 0; r < M; r++) acc[r] = odd[r] = _mm256_setzero_ps();
  int64_t u = 0;
  for (; u + 2 <= units; u += 2) {
    typename Unit::Weights w0 = unit.weights(u), w1 = unit.weights(u + 1);
    for (int r = 0; r < M; r++) {
      acc[r] = _mm256_fmadd_ps(unit.dot(w0, x, u, r), unit.factor(w0, x, u, r), acc[r]);
      odd[r] = _mm256_fmadd_ps(unit.dot(w1, x, u + 1, r), unit.factor(w1, x, u + 1, r), odd[r]);
    }
  }
  if (u < units) add_unit<M>(unit, x, u, acc);
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

// int8 weights with a scale per group: the block's factor is its group's scale times the
// activations' (Q8_0 x Q8 as llama.cpp computes it, in float32).
struct Int8GroupBlock : Int8Block {
  const float* scales;
  int group_shift;  // log2 of blocks per group
  __m256 factor(const Weights&, const Quantized& x, int64_t b, int r) const {
    return _mm256_set1_ps(x.d[r * x.blocks + b] * scales[b >> group_shift]);
  }
};

// int4 levels 0..15 are unsigned already, and two blocks go through one madd: their
// maddubs sums (at most 2 * 15 * 127 each) add in int16 without overflow, and leave the
// low four int32 lanes block b's, the high four block b+1's, so that one convert and one
// FMA with [factor of b x4 | factor of b+1 x4] serve both. Per block that is half the
// instructions of a block at a time, which bound this kernel on first-generation Zen.
struct Int4Pair {
  const uint8_t* packed;
  const float* scales;
  int group_shift;  // log2 of blocks per group
  struct Weights {
    __m256i evens, odds;
    __m256 scale;
  };
  Weights weights(int64_t p) const {
    __m256i bytes = load32(packed + p * BLOCK);
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    return {_mm256_and_si256(bytes, nibble),
            _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble), scale(2 * p)};
  }
  __m256 scale(int64_t b) const {
    if (group_shift) return _mm256_broadcast_ss(scales + (b >> group_shift));  // one group
    __m128 two = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(scales + b)));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two),
                                    _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
  }
  __m256 dot(const Weights& v, const Quantized& x, int64_t p, int r) const {
    const int8_t* q = x.q + r * x.k + p * 2 * BLOCK;
    __m256i sums = _mm256_add_epi16(_mm256_maddubs_epi16(v.evens, load32(q)),
                                    _mm256_maddubs_epi16(v.odds, load32(q + BLOCK)));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(sums, _mm256_set1_epi16(1)));
  }
  __m256 factor(const Weights& v, const Quantized& x, int64_t p, int r) const {
    return _mm256_mul_ps(v.scale, _mm256_loadu_ps(x.pair_d + (r * (x.blocks / 2) + p) * 8));
  }
};

// A last unpaired block: its 16 bytes unpacked as [low nibbles | high nibbles].
struct Int4Block {
  const uint8_t* packed;
  const float* scales;
  int group_shift;
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

// int16 activations (quantize_rows16). int8 weights: a block's 32 widened to int16.
struct Int8Block16 {
  const int8_t* w;
  struct Weights {
    __m256i low, high;
  };
  Weights weights(int64_t b) const {
    const __m128i* at = reinterpret_cast<const __m128i*>(w + b * BLOCK);
    return {_mm256_cvtepi8_epi16(_mm_loadu_si128(at)), _mm256_cvtepi8_epi16(_mm_loadu_si128(at + 1))};
  }
  // 8 int32 sums of 4 products each: at most 4 * 128 * 32767, no overflow.
  __m256 dot(const Weights& v, const Quantized& x, int64_t b, int r) const {
    const int16_t* q = x.q16 + r * x.k + b * BLOCK;
    return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(v.low, load32(q)),
                                               _mm256_madd_epi16(v.high, load32(q + 16))));
  }
  __m256 factor(const Weights&, const Quantized& x, int64_t b, int r) const {
    return _mm256_broadcast_ss(x.d + r * x.blocks + b);
  }
};

struct Int8GroupBlock16 : Int8Block16 {
  const float* scales;
  int group_shift;
  __m256 factor(const Weights&, const Quantized& x, int64_t b, int r) const {
    return _mm256_set1_ps(x.d[r * x.blocks + b] * scales[b >> group_shift]);
  }
};

// int4: a block's 16 bytes widened to int16, its low nibbles are the even elements and its
// high ones the odd, the order quantize_block16 stores the activations in.
struct Int4Block16 {
  const uint8_t* packed;
  const float* scales;
  int group_shift;
  struct Weights {
    __m256i evens, odds;
    float scale;
  };
  Weights weights(int64_t b) const {
    __m256i bytes = _mm256_cvtepu8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + b * BLOCK / 2)));
    return {_mm256_and_si256(bytes, _mm256_set1_epi16(0x0F)), _mm256_srli_epi16(bytes, 4),
            scales[b >> group_shift]};
  }
  __m256 dot(const Weights& v, const Quantized& x, int64_t b, int r) const {
    const int16_t* q = x.q16 + r * x.k + b * BLOCK;
    return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(v.evens, load32(q)),
                                               _mm256_madd_epi16(v.odds, load32(q + 16))));
  }
  __m256 factor(const Weights& v, const Quantized& x, int64_t b, int r) const {
    return _mm256_set1_ps(v.scale * x.d[r * x.blocks + b]);
  }
};

template <int M, class Unit>
void int8_dot_rows(const Unit& unit, float scale, const Quantized& x, float* out,
                   int64_t out_stride) {
  __m256 acc[M];
  dot_units<M>(unit, x, x.blocks, acc);
  for (int r = 0; r < M; r++) out[r * out_stride] = scale * vec::sum8(acc[r]);
}

template <int M>
void int4_dot_rows(const uint8_t* packed, const float* scales, const float* mins, int64_t group,
                   const Quantized& x, float* out, int64_t out_stride) {
  int shift = __builtin_ctzll(group / BLOCK);
  __m256 acc[M];
  if (x.q16) {
    dot_units<M>(Int4Block16{packed, scales, shift}, x, x.blocks, acc);
  } else {
    dot_units<M>(Int4Pair{packed, scales, shift}, x, x.blocks / 2, acc);
    if (x.blocks & 1) add_unit<M>(Int4Block{packed, scales, shift}, x, x.blocks - 1, acc);
  }
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
    if (x.q16)
      int8_dot_rows<M>(Int8Block16{q + col * k}, scale[col], x, out, stride);
    else
      int8_dot_rows<M>(Int8Block{q + col * k}, scale[col], x, out, stride);
  }
};

struct Int8GroupDot {
  const int8_t* q;
  const float* scales;
  int64_t group, k;
  template <int M>
  void run(int64_t col, const Quantized& x, float* out, int64_t stride) const {
    const float* row_scales = scales + col * (k / group);
    int shift = __builtin_ctzll(group / BLOCK);
    if (x.q16)
      int8_dot_rows<M>(Int8GroupBlock16{{q + col * k}, row_scales, shift}, 1.0f, x, out, stride);
    else
      int8_dot_rows<M>(Int8GroupBlock{{q + col * k}, row_scales, shift}, 1.0f, x, out, stride);
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
// x's view from every `rows`-th activation row on (each pass's rows), made once per call
// rather than once per output row, in a buffer each calling thread keeps: a decode step
// allocates nothing here once its widest call has run.
const std::vector<Quantized>& row_views(const Quantized& x, int64_t m, int64_t rows) {
  static thread_local std::vector<Quantized> views;
  views.clear();
  for (int64_t r = 0; r < m; r += rows) views.push_back(x.from_row(r));
  return views;
}

// pass(std::integral_constant<int, M>) for M = min(m, MAX): a pass's row count as a
// constant, so that each count has its own unrolled kernel.
template <int MAX, class Pass>
void with_rows(int64_t m, const Pass& pass) {
  if constexpr (MAX > 1)
    if (m < MAX) return with_rows<MAX - 1>(m, pass);
  pass(std::integral_constant<int, MAX>{});
}

template <class Dot>
void over_outputs(const Dot& dot, const Quantized& x, int64_t m, int64_t n, float* out,
                  int threads) {
  const std::vector<Quantized>& views = row_views(x, m, ROWS);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t col = 0; col < n; col++)
    for (int64_t r = 0; r < m; r += ROWS)
      with_rows<ROWS>(m - r, [&](auto rows) {
        dot.template run<decltype(rows)::value>(col, views[r / ROWS], out + r * n + col, n);
      });
}

// The interleaved formats (WEIGHT_INT4_COLS8, WEIGHT_INT8_COLS8; matmul.h): 8 output rows
// a vector, one int32 lane each, so an input pair costs one dot instruction per activation
// row for 8 outputs (vpdpwssd, or madd and add without AVX512-VNNI), where the row-major
// kernels above spend two madds, an add, a convert and an FMA per 32 inputs per output.
// The activations are rounded as for Int4Block16 but kept in input order: an input pair
// is a 32-bit word to broadcast.
inline __m256i add_pair_dots(__m256i acc, __m256i levels, __m256i pairs) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, levels, pairs);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(levels, pairs));
#endif
}

inline __m256i broadcast_pair(const int16_t* q) {
  int32_t pair;
  memcpy(&pair, q, sizeof pair);
  return _mm256_set1_epi32(pair);
}

// A block's 8 quads of inputs for 8 output rows, as two vectors of int16 pairs each: the
// quad's first pair of inputs, then its second (a lane per output row).
struct Int4Cols8 {
  static constexpr int64_t BLOCK_BYTES = 128;
  static constexpr bool MINS = true;
  static void quad(const uint8_t* block, int quad, __m256i* first, __m256i* second) {
    __m256i wide = _mm256_cvtepu8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 * quad)));
    *first = _mm256_and_si256(wide, _mm256_set1_epi16(0x0F));
    *second = _mm256_srli_epi16(wide, 4);
  }
};

struct Int8Cols8 {
  static constexpr int64_t BLOCK_BYTES = 256;
  static constexpr bool MINS = false;
  static void quad(const uint8_t* block, int quad, __m256i* first, __m256i* second) {
    const __m128i* at = reinterpret_cast<const __m128i*>(block + 32 * quad);
    *first = _mm256_cvtepi8_epi16(_mm_loadu_si128(at));
    *second = _mm256_cvtepi8_epi16(_mm_loadu_si128(at + 1));
  }
};

// Activation rows a pass over the weights takes: two accumulators each, 16 of AVX-512's 32
// vector registers at 8; AVX2's 16 hold 4.
#ifdef __AVX512VL__
constexpr int COLS8_ROWS = 8;
#else
constexpr int COLS8_ROWS = 4;
#endif

// out[r * out_stride + c] for the 8 output rows of `bytes`, M activation rows from x.
// Each block's 32 products a lane are summed in int32 (at most 32 * 128 * 32767: no
// overflow), then scaled once: the dots by scale * d_b, plus (int4) min * d_b * sum(q_b).
template <int M, class Levels>
void cols8_rows(const uint8_t* bytes, const float* scales, const float* mins,
                const Quantized& x, float* out, int64_t out_stride) {
  __m256 acc[M];
  for (int r = 0; r < M; r++) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < x.blocks; b++) {
    // Up to 4 rows, each quad's two pairs in two chains: one chain of 16 dot instructions
    // a block waits on each one's latency at a row or two; 8 rows' two would spill.
    __m256i dot[M], second_dot[M];
    for (int r = 0; r < M; r++) dot[r] = second_dot[r] = _mm256_setzero_si256();
    for (int quad = 0; quad < 8; quad++) {
      __m256i first, second;
      Levels::quad(bytes + b * Levels::BLOCK_BYTES, quad, &first, &second);
      for (int r = 0; r < M; r++) {
        const int16_t* q = x.q16 + r * x.k + b * BLOCK + 4 * quad;
        dot[r] = add_pair_dots(dot[r], first, broadcast_pair(q));
        if constexpr (M <= 4)
          second_dot[r] = add_pair_dots(second_dot[r], second, broadcast_pair(q + 2));
        else
          dot[r] = add_pair_dots(dot[r], second, broadcast_pair(q + 2));
      }
    }
    if constexpr (M <= 4)
      for (int r = 0; r < M; r++) dot[r] = _mm256_add_epi32(dot[r], second_dot[r]);
    __m256 scale = _mm256_loadu_ps(scales + b * 8);
    for (int r = 0; r < M; r++) {
      __m256 factor = _mm256_mul_ps(scale, _mm256_set1_ps(x.d[r * x.blocks + b]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), factor, acc[r]);
      if constexpr (Levels::MINS)
        acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(mins + b * 8),
                                 _mm256_set1_ps(x.group_sums[r * x.groups + b]), acc[r]);
    }
  }
  for (int r = 0; r < M; r++) _mm256_storeu_ps(out + r * out_stride, acc[r]);
}

// out [m, n] from an interleaved weight's arrays (mins null for int8).
template <class Levels>
void cols8_qdot(const uint8_t* bytes, const float* scales, const float* mins, int64_t n,
                int64_t k, const float* x, int64_t m, int64_t x_stride, float* out,
                int threads) {
  Quantized rows = quantize_rows16(x, m, x_stride, k, Levels::MINS ? BLOCK : 0, false, threads);
  const std::vector<Quantized>& views = row_views(rows, m, COLS8_ROWS);
  const int64_t blocks = k / BLOCK;
  // Each output is one thread's, summed in one order: the thread count changes nothing.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t g = 0; g < n / 8; g++)
    for (int64_t r = 0; r < m; r += COLS8_ROWS)
      with_rows<COLS8_ROWS>(m - r, [&](auto rows) {
        cols8_rows<decltype(rows)::value, Levels>(bytes + g * blocks * Levels::BLOCK_BYTES,
                                       scales + g * blocks * 8,
                                       Levels::MINS ? mins + g * blocks * 8 : nullptr,
                                       views[r / COLS8_ROWS], out + r * n + 8 * g, n);
      });
}

#ifdef COLS16_KERNEL
// The int8 interleaved formats (WEIGHT_INT4_COLS16, WEIGHT_INT8_COLS16; matmul.h): 16
// output rows a zmm, each 32-bit lane an output row's 4 levels of 4 inputs as unsigned
// bytes, so vpdpbusd adds 4 products of an activation row's int8 levels a lane: 64 an
// instruction, twice vdpbf16ps's 32 (wide steps, where the bf16 panel is bound by its
// products), from the blocks' own bytes (narrow ones, bound by reading them). Each
// block's dots are summed in int32 (at most 32 * 255 * 127: exact in float too), then
// scaled once as cols8_rows scales (int8 weights hold level + 128, their "mins" -128 *
// scale take the offset back out). One kernel at every width, each output's operations
// the same whatever the rows beside it: --wide-gemm int8 is batch-invariant.
struct Int4Cols16 {
  static constexpr int64_t BLOCK_BYTES = 256;
  // Octet o's 64 bytes: the low nibbles hold inputs 8o..8o+3, the high ones 8o+4..8o+7.
  static void quads(const uint8_t* block, int o, __m512i* first, __m512i* second) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    __m512i bytes = _mm512_loadu_si512(block + 64 * o);
    *first = _mm512_and_si512(bytes, nibble);
    *second = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
  }
};

struct Int8Cols16 {
  static constexpr int64_t BLOCK_BYTES = 512;
  static void quads(const uint8_t* block, int o, __m512i* first, __m512i* second) {
    *first = _mm512_loadu_si512(block + 128 * o);
    *second = _mm512_loadu_si512(block + 128 * o + 64);
  }
};

// Activation rows a pass over 16 output rows' weights takes: an int32 and a float32
// accumulator each, 24 of AVX-512's 32 registers. On SmolLM2's shapes, 64 rows, one
// thread, ~1.4x the bf16 panel's wide tile (AMD EPYC family 25 model 17, Zen 4; an ad-hoc
// loop of both tiles, session 31; 6 rows by 2 blocks of 16 in the panel's orientation
// measured the same).
constexpr int COLS16_ROWS = 12;
constexpr int64_t COLS16_STRETCH = 8 * COLS16_ROWS;

inline __m512i broadcast_quad(const int8_t* q) {
  int32_t quad;
  memcpy(&quad, q, sizeof quad);
  return _mm512_set1_epi32(quad);
}

template <int M, class Levels>
void cols16_rows(const uint8_t* bytes, const float* scales, const float* mins,
                 const Quantized& x, float* out, int64_t out_stride) {
  __m512 acc[M];
  for (int r = 0; r < M; r++) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < x.blocks; b++) {
    __m512i dot[M];
    for (int r = 0; r < M; r++) dot[r] = _mm512_setzero_si512();
    for (int o = 0; o < 4; o++) {
      __m512i first, second;
      Levels::quads(bytes + b * Levels::BLOCK_BYTES, o, &first, &second);
      for (int r = 0; r < M; r++) {
        const int8_t* q = x.q + r * x.k + b * BLOCK + 8 * o;
        dot[r] = _mm512_dpbusd_epi32(dot[r], first, broadcast_quad(q));
        dot[r] = _mm512_dpbusd_epi32(dot[r], second, broadcast_quad(q + 4));
      }
    }
    __m512 scale = _mm512_loadu_ps(scales + b * 16), min = _mm512_loadu_ps(mins + b * 16);
    for (int r = 0; r < M; r++) {
      __m512 factor = _mm512_mul_ps(scale, _mm512_set1_ps(x.d[r * x.blocks + b]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), factor, acc[r]);
      acc[r] = _mm512_fmadd_ps(min, _mm512_set1_ps(x.group_sums[r * x.groups + b]), acc[r]);
    }
  }
  for (int r = 0; r < M; r++) _mm512_storeu_ps(out + r * out_stride, acc[r]);
}

template <class Levels>
void cols16_qdot(const uint8_t* bytes, const float* scales, const float* mins, int64_t n,
                 int64_t k, const float* x, int64_t m, int64_t x_stride, float* out,
                 int threads) {
  // In input order, each block's scale times its levels' sum as its "group" sum.
  Quantized rows = quantize_rows(x, m, x_stride, k, false, BLOCK, threads);
  const std::vector<Quantized>& views = row_views(rows, m, COLS16_ROWS);
  const int64_t blocks = k / BLOCK;
  // Each output is one thread's, summed in one order: the thread count changes nothing.
  // A thread's 16 output rows stay in L1 while a stretch of activation rows passes over
  // them, the stretch (COLS16_STRETCH rows: 144 KB at k = 1536) in L2: a prefill's rows
  // all at once would be read from memory for every 16 outputs.
  for (int64_t first = 0; first < m; first += COLS16_STRETCH) {
    const int64_t last = first + COLS16_STRETCH < m ? first + COLS16_STRETCH : m;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t g = 0; g < n / 16; g++)
      for (int64_t r = first; r < last; r += COLS16_ROWS)
        with_rows<COLS16_ROWS>(last - r, [&](auto rows) {
          cols16_rows<decltype(rows)::value, Levels>(bytes + g * blocks * Levels::BLOCK_BYTES,
                                          scales + g * blocks * 16, mins + g * blocks * 16,
                                          views[r / COLS16_ROWS], out + r * n + 16 * g, n);
        });
  }
}
#endif

}  // namespace

#ifdef COLS16_KERNEL
void cols16_qdot(const NativeWeight& w, const float* x, int64_t m, int64_t x_stride,
                 float* out, int threads) {
  const uint8_t* bytes = static_cast<const uint8_t*>(w.data);
  if (w.format == WEIGHT_INT4_COLS16)
    cols16_qdot<Int4Cols16>(bytes, w.scales, w.mins, w.n, w.k, x, m, x_stride, out, threads);
  else
    cols16_qdot<Int8Cols16>(bytes, w.scales, w.mins, w.n, w.k, x, m, x_stride, out, threads);
}
#endif

void cols8_qdot(const NativeWeight& w, const float* x, int64_t m, int64_t x_stride,
                float* out, int threads) {
  const uint8_t* bytes = static_cast<const uint8_t*>(w.data);
  if (w.format == WEIGHT_INT4_COLS8)
    cols8_qdot<Int4Cols8>(bytes, w.scales, w.mins, w.n, w.k, x, m, x_stride, out, threads);
  else
    cols8_qdot<Int8Cols8>(bytes, w.scales, nullptr, w.n, w.k, x, m, x_stride, out, threads);
}

void int8_qdot(const int8_t* q, const float* scales, int64_t group, int64_t n, int64_t k,
               const float* x, int64_t m, int64_t x_stride, bool int16, float* out,
               int threads) {
  Quantized rows =
      int16 ? quantize_rows16(x, m, x_stride, k, 0, false, threads)
            : quantize_rows(x, m, x_stride, k, false, 0, threads);
  if (group)
    over_outputs(Int8GroupDot{q, scales, group, k}, rows, m, n, out, threads);
  else
    over_outputs(Int8Dot{q, scales, k}, rows, m, n, out, threads);
}

void int4_qdot(const uint8_t* packed, const float* scales, const float* mins, int64_t group,
               int64_t n, int64_t k, const float* x, int64_t m, int64_t x_stride, bool int16,
               float* out, int threads) {
  Quantized rows = int16 ? quantize_rows16(x, m, x_stride, k, group, true, threads)
                         : quantize_rows(x, m, x_stride, k, true, group, threads);
  over_outputs(Int4Dot{packed, scales, mins, group, k}, rows, m, n, out, threads);
}

extern "C" {

// cpu_kernel.py's entries, int8_matmul_f32's and int4_matmul_f32's arguments (k a
// multiple of 32). The int16 rounding is reached through a NativeWeight's integer16.
void int8_matmul_q8(const float* x, int64_t m, int64_t x_stride, const int8_t* q,
                    const float* scales, int64_t group, int64_t n, int64_t k, float* out,
                    int threads) {
  int8_qdot(q, scales, group, n, k, x, m, x_stride, false, out, threads);
}

void int4_matmul_q8(const float* x, int64_t m, int64_t x_stride, const uint8_t* packed,
                    const float* scales, const float* mins, int64_t group, int64_t n,
                    int64_t k, float* out, int threads) {
  int4_qdot(packed, scales, mins, group, n, k, x, m, x_stride, false, out, threads);
}


// 1 where this build has the int8 interleaved kernel (cols16_qdot), else 0:
// native_layers.py makes the COLS16 formats only where it says 1.
int64_t cols16_kernel() {
#ifdef COLS16_KERNEL
  return 1;
#else
  return 0;
#endif
}

}  // extern "C"
