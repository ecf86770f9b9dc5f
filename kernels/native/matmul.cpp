// x @ W^T in float32 with W stored as int8 per channel or per group (a GGUF file's Q8_0
// blocks) or int4 per group (our formats),
// for x86 CPUs with AVX2 + FMA. Built with the other .cpp files here by library.py;
// quantization/cpu_kernel.py calls it, and layer.cpp through native_linear (matmul.h),
// which also takes the layers' float32 weights.
//
// A few activation rows (int8_matmul_f32, int4_matmul_f32): each weight row is
// widened in registers (int4: its levels, the scale and minimum applied to the sums) and
// dotted with ROWS activation rows at a time; the rows of a tile of outputs stay in L2
// for all the activation rows, so the weight is read from memory once, as 1 byte (int8)
// or half a byte (int4) a weight, which is what a narrow decode step is bound by. More
// rows: the panel GEMM (int8_gemm_f32, int4_gemm_f32). Every product and sum is float32,
// as in dequantize + matmul; only the order of the sums differs.

#include <immintrin.h>
#include <stdint.h>

#include <vector>

#include "bf16.h"
#include "matmul.h"
#include "vec.h"

namespace {

constexpr int ROWS = 4;  // 4 accumulators + the weight vectors: no spill with 16 ymm registers

// The layers' float32 weights go through the same kernels: a panel is the rows themselves.
struct Float32Row {
  const float* w;
  static constexpr int64_t STEP = 8;
  static constexpr float scale = 1.0f;
  static constexpr bool IN_PLACE = true;
  void load(int64_t j, __m256* v) const { v[0] = _mm256_loadu_ps(w + j); }
};

// 8 int8 values -> float.
inline __m256 widen_int8(const int8_t* q) {
  __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

// 8 int8 weights -> float, unscaled: the per-row scale multiplies the dot product instead.
struct Int8Row {
  const int8_t* q;
  float scale;
  static constexpr int64_t STEP = 8;
  static constexpr bool IN_PLACE = false;
  void load(int64_t j, __m256* w) const { w[0] = widen_int8(q + j); }
};

// 32 int8 weights of a row with a scale per group of inputs (a GGUF file's Q8_0 blocks,
// group 32) -> float, each times its group's scale: the exact weights, as the file
// dequantizes them (the panel GEMM's dequantization; the row kernel is int8_group_dot_rows).
// group a multiple of 32.
struct Int8GroupRow {
  const int8_t* q;
  const float* scales;
  int64_t group;
  static constexpr int64_t STEP = 32;
  static constexpr float scale = 1.0f;
  static constexpr bool IN_PLACE = false;
  void load(int64_t j, __m256* w) const {
    __m256 s = _mm256_set1_ps(scales[j / group]);
    for (int i = 0; i < 4; i++) w[i] = _mm256_mul_ps(widen_int8(q + j + 8 * i), s);
  }
};

// Calls run(make_row) with the row maker of an int8 weight: per row (group 0) or per group.
template <class Run>
void with_int8_rows(const int8_t* q, const float* scales, int64_t group, int64_t k, Run run) {
  if (group) {
    int64_t groups = k / group;
    run([=](int64_t col) { return Int8GroupRow{q + col * k, scales + col * groups, group}; });
  } else {
    run([=](int64_t col) { return Int8Row{q + col * k, scales[col]}; });
  }
}

// 32 int4 weights -> level * scale + min, group a multiple of 32 (the panel GEMM's
// dequantization); byte j holds element 2j in its low nibble and 2j + 1 in its high one.
struct Int4Row {
  const uint8_t* packed;
  const float* scales;
  const float* mins;
  int64_t group;
  static constexpr int64_t STEP = 32;
  static constexpr float scale = 1.0f;
  static constexpr bool IN_PLACE = false;
  void load(int64_t j, __m256* w) const {
    const __m128i low_nibbles = _mm_set1_epi8(0x0F);
    int64_t g = j / group;
    __m256 s = _mm256_set1_ps(scales[g]);
    __m256 low = _mm256_set1_ps(mins[g]);
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + j / 2));
    __m128i even = _mm_and_si128(b, low_nibbles);
    __m128i odd = _mm_and_si128(_mm_srli_epi16(b, 4), low_nibbles);
    // Interleaving the two gives the 32 levels in element order.
    __m128i first = _mm_unpacklo_epi8(even, odd);
    __m128i second = _mm_unpackhi_epi8(even, odd);
    __m128i quarters[4] = {first, _mm_srli_si128(first, 8), second, _mm_srli_si128(second, 8)};
    for (int i = 0; i < 4; i++)
      w[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(quarters[i])), s, low);
  }
};

// out[r, col] = row.scale * dot(weight row, x[r]) for M rows; the weight is dequantized
// in registers, STEP elements at a time, and never stored.
// With one accumulator per activation row every FMA would wait for the one before it
// (4-5 cycles on these cores): at one or two rows that latency, not memory, would bound
// the kernel (an int8 row read at ~6 GB/s). So each row sums CHAINS independent chains
// over consecutive vectors, added together at the end.
template <int M, class Row>
void dot_rows(const Row& row, const float* x, int64_t x_stride, int64_t k, float* out,
              int64_t out_stride) {
  static_assert(Row::STEP == 8, "one vector of weights a load");
  constexpr int CHAINS = M <= 2 ? 4 : 2;  // M * CHAINS accumulators + CHAINS weights <= 16
  __m256 acc[M][CHAINS];
  for (int r = 0; r < M; r++)
    for (int c = 0; c < CHAINS; c++) acc[r][c] = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 * CHAINS <= k; j += 8 * CHAINS) {
    __m256 w[CHAINS];
    for (int c = 0; c < CHAINS; c++) row.load(j + 8 * c, &w[c]);
    for (int r = 0; r < M; r++)
      for (int c = 0; c < CHAINS; c++)
        acc[r][c] = _mm256_fmadd_ps(w[c], _mm256_loadu_ps(x + r * x_stride + j + 8 * c), acc[r][c]);
  }
  for (; j < k; j += 8) {
    __m256 w;
    row.load(j, &w);
    for (int r = 0; r < M; r++)
      acc[r][0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + r * x_stride + j), acc[r][0]);
  }
  for (int r = 0; r < M; r++) {
    __m256 sum = acc[r][0];
    for (int c = 1; c < CHAINS; c++) sum = _mm256_add_ps(sum, acc[r][c]);
    out[r * out_stride] = row.scale * vec::sum8(sum);
  }
}

template <class Row>
void dot_all_rows(const Row& row, const float* x, int64_t m, int64_t x_stride, int64_t k,
                  float* out, int64_t out_stride) {
  int64_t r = 0;
  for (; r + ROWS <= m; r += ROWS)
    dot_rows<ROWS>(row, x + r * x_stride, x_stride, k, out + r * out_stride, out_stride);
  const float* xr = x + r * x_stride;
  float* outr = out + r * out_stride;
  switch (m - r) {
    case 3: dot_rows<3>(row, xr, x_stride, k, outr, out_stride); break;
    case 2: dot_rows<2>(row, xr, x_stride, k, outr, out_stride); break;
    case 1: dot_rows<1>(row, xr, x_stride, k, outr, out_stride); break;
    default: break;
  }
}

// Output rows in tiles: a tile's weight rows (~TILE_BYTES of int8/int4) stay in L2 while
// each group of ROWS activation rows, in L1, passes over them, so that above a few rows
// the activations are not streamed from L2 once per output row (measured: ~1.2x at
// 32-128 rows, quant_kernel_bench). dot(col, r, rows, out_r) sums output column col of
// activation rows r .. r + rows (rows <= ROWS) into out_r[i * n], each in one order.
constexpr int64_t TILE_BYTES = 48 * 1024;

template <class Dot>
void row_tiles(Dot dot, int64_t m, int64_t n, int64_t row_bytes, float* out, int threads) {
  int64_t tile = row_bytes >= TILE_BYTES ? 1 : TILE_BYTES / row_bytes;
  // Equal shares for the threads (each call ends at a barrier): the tiles' count a
  // multiple of theirs. SmolLM2's 30 int4-g32 layers at 1 / 8 rows, 2 threads: 5.97 ->
  // 5.50 and 26.2 -> 21.8 ms (Zen 3, as above).
  int64_t tiles = (n + tile - 1) / tile;
  tiles = (tiles + threads - 1) / threads * threads;
  tile = (n + tiles - 1) / tiles;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t t = 0; t < tiles; t++) {
    int64_t first = t * tile, end = first + tile < n ? first + tile : n;
    for (int64_t r = 0; r < m; r += ROWS) {
      int64_t rows = m - r < ROWS ? m - r : ROWS;
      for (int64_t col = first; col < end; col++) dot(col, r, rows, out + r * n + col);
    }
  }
}

template <class MakeRow>
void tiled_matmul(MakeRow make_row, const float* x, int64_t m, int64_t x_stride, int64_t n,
                  int64_t k, int64_t row_bytes, float* out, int threads) {
  auto dot = [&](int64_t col, int64_t r, int64_t rows, float* out_r) {
    dot_all_rows(make_row(col), x + r * x_stride, rows, x_stride, k, out_r, n);
  };
  row_tiles(dot, m, n, row_bytes, out, threads);
}

// The row kernel of int8 weights with a scale per group (Q8_0): each 32 inputs' dot
// product is summed unscaled and meets its group's scale once, where Int8GroupRow
// would scale every weight. SmolLM2's Q8_0 head (49,152 x 576) at 1 row, 2 threads:
// 4.1 ms that way, 1.4 ms this way (AMD EPYC family 25 model 1, Zen 3, avx2).
template <int M>
void int8_group_dot_rows(const int8_t* q, const float* scales, int64_t group, const float* x,
                         int64_t x_stride, int64_t k, float* out, int64_t out_stride) {
  __m256 acc[M];
  for (int r = 0; r < M; r++) acc[r] = _mm256_setzero_ps();
  for (int64_t first = 0; first < k; first += group) {
    __m256 scale = _mm256_set1_ps(*scales++);
    for (int64_t j = first; j < first + group; j += 32) {
      __m256 w[4];
      for (int i = 0; i < 4; i++) w[i] = widen_int8(q + j + 8 * i);
      for (int r = 0; r < M; r++) {
        const float* xr = x + r * x_stride + j;
        __m256 dot = _mm256_mul_ps(w[0], _mm256_loadu_ps(xr));
        for (int i = 1; i < 4; i++) dot = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(xr + 8 * i), dot);
        acc[r] = _mm256_fmadd_ps(dot, scale, acc[r]);
      }
    }
  }
  for (int r = 0; r < M; r++) out[r * out_stride] = vec::sum8(acc[r]);
}

void int8_group_row_matmul(const int8_t* q, const float* scales, int64_t group, const float* x,
                           int64_t m, int64_t x_stride, int64_t n, int64_t k, float* out,
                           int threads) {
  int64_t groups = k / group;
  auto dot = [=](int64_t col, int64_t r, int64_t rows, float* out_r) {
    const int8_t* row = q + col * k;
    const float* s = scales + col * groups;
    const float* xr = x + r * x_stride;
    switch (rows) {
      case 4: int8_group_dot_rows<4>(row, s, group, xr, x_stride, k, out_r, n); break;
      case 3: int8_group_dot_rows<3>(row, s, group, xr, x_stride, k, out_r, n); break;
      case 2: int8_group_dot_rows<2>(row, s, group, xr, x_stride, k, out_r, n); break;
      default: int8_group_dot_rows<1>(row, s, group, xr, x_stride, k, out_r, n); break;
    }
  };
  row_tiles(dot, m, n, k, out, threads);
}

// The row kernel of an int8 weight: per row (dot_rows on Int8Row) or per group.
void int8_row_matmul(const int8_t* q, const float* scales, int64_t group, const float* x,
                     int64_t m, int64_t x_stride, int64_t n, int64_t k, float* out, int threads) {
  if (group)
    return int8_group_row_matmul(q, scales, group, x, m, x_stride, n, k, out, threads);
  auto row = [=](int64_t col) { return Int8Row{q + col * k, scales[col]}; };
  tiled_matmul(row, x, m, x_stride, n, k, k, out, threads);
}

// The int4 row kernel reads a weight row's 32 levels of a chunk with two widening loads
// and no interleave: levels 0..15 of bytes 0-7 come out as the even elements then the
// odd ones, and so on for bytes 8-15, so each activation row is reordered that way once
// per call (Int4Activations). The scale multiplies a chunk's dot product, and the
// minimums meet each group's sum of activations: level * scale + min is never formed.
// SmolLM2's 30 layers of int4-g32 projections, 1 thread, this build against the one
// that dequantized in registers, interleaved in one process: 22.1 -> 14.4 ms at 1 row,
// 25.1 -> 21.9 at 2, 30.1 -> 28.1 at 4 (AMD EPYC, avx2, load 2.6).
struct Int4Activations {
  const float* x;     // [m, k], each 32-chunk as even then odd elements of its halves
  const float* sums;  // [m, groups], each group's sum of activations
};

Int4Activations reorder_int4(const float* x, int64_t m, int64_t x_stride, int64_t k,
                             int64_t group) {
  static thread_local std::vector<float> reordered, sums;
  int64_t groups = k / group;
  if (static_cast<int64_t>(reordered.size()) < m * k) reordered.resize(m * k);
  if (static_cast<int64_t>(sums.size()) < m * groups) sums.resize(m * groups);
  for (int64_t r = 0; r < m; r++) {
    const float* row = x + r * x_stride;
    float* out = reordered.data() + r * k;
    for (int64_t j = 0; j < k; j += 16)
      for (int64_t i = 0; i < 8; i++) {
        out[j + i] = row[j + 2 * i];
        out[j + 8 + i] = row[j + 2 * i + 1];
      }
    for (int64_t g = 0; g < groups; g++) {
      float sum = 0.0f;
      for (int64_t j = g * group; j < (g + 1) * group; j++) sum += row[j];
      sums.data()[r * groups + g] = sum;
    }
  }
  return {reordered.data(), sums.data()};
}

template <int M>
void int4_dot_rows(const Int4Row& row, int64_t groups, const Int4Activations& x, int64_t k,
                   float* out, int64_t out_stride) {
  const __m256i low_nibble = _mm256_set1_epi32(0x0F);
  __m256 acc[M];
  for (int r = 0; r < M; r++) acc[r] = _mm256_setzero_ps();
  // By group: each chunk finds its scale without a division.
  for (int64_t first = 0, g = 0; first < k; first += row.group, g++) {
    __m256 scale = _mm256_set1_ps(row.scales[g]);
    for (int64_t j = first; j < first + row.group; j += 32) {
      const uint8_t* bytes = row.packed + j / 2;
      __m256i low8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
      __m256i high8 =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + 8)));
      __m256 w[4] = {_mm256_cvtepi32_ps(_mm256_and_si256(low8, low_nibble)),
                     _mm256_cvtepi32_ps(_mm256_srli_epi32(low8, 4)),
                     _mm256_cvtepi32_ps(_mm256_and_si256(high8, low_nibble)),
                     _mm256_cvtepi32_ps(_mm256_srli_epi32(high8, 4))};
      for (int r = 0; r < M; r++) {
        const float* xr = x.x + r * k + j;
        __m256 dot = _mm256_mul_ps(w[0], _mm256_loadu_ps(xr));
        for (int i = 1; i < 4; i++) dot = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(xr + 8 * i), dot);
        acc[r] = _mm256_fmadd_ps(dot, scale, acc[r]);
      }
    }
  }
  // The minimums' term, 8 groups a vector: as one scalar chain it cost 6% at 1 row and
  // 15% at 4 (SmolLM2's 30 layers, int4-g32, 2 threads: 6.35 -> 5.97 and 13.86 -> 11.84
  // ms; AMD EPYC family 25 model 1, Zen 3, avx2).
  for (int r = 0; r < M; r++) {
    const float* sums = x.sums + r * groups;
    __m256 lows = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= groups; g += 8)
      lows = _mm256_fmadd_ps(_mm256_loadu_ps(row.mins + g), _mm256_loadu_ps(sums + g), lows);
    float low = vec::sum8(lows);
    for (; g < groups; g++) low += row.mins[g] * sums[g];
    out[r * out_stride] = vec::sum8(acc[r]) + low;
  }
}

// row_tiles' tiles and order for int4 rows, on the reordered activations.
void int4_row_matmul(const uint8_t* packed, const float* scales, const float* mins,
                     int64_t group, const float* x, int64_t m, int64_t x_stride, int64_t n,
                     int64_t k, float* out, int threads) {
  int64_t groups = k / group;
  Int4Activations all = reorder_int4(x, m, x_stride, k, group);
  auto dot = [=](int64_t col, int64_t r, int64_t rows, float* out_r) {
    Int4Activations x_r{all.x + r * k, all.sums + r * groups};
    Int4Row row{packed + col * (k / 2), scales + col * groups, mins + col * groups, group};
    switch (rows) {
      case 4: int4_dot_rows<4>(row, groups, x_r, k, out_r, n); break;
      case 3: int4_dot_rows<3>(row, groups, x_r, k, out_r, n); break;
      case 2: int4_dot_rows<2>(row, groups, x_r, k, out_r, n); break;
      default: int4_dot_rows<1>(row, groups, x_r, k, out_r, n); break;
    }
  };
  row_tiles(dot, m, n, k / 2, out, threads);
}

template <class Row>
void dequantize(const Row& row, int64_t k, float* w) {
  const __m256 scale = _mm256_set1_ps(row.scale);
  for (int64_t j = 0; j < k; j += Row::STEP) {
    __m256 v[Row::STEP / 8];
    row.load(j, v);
    for (int i = 0; i < Row::STEP / 8; i++) _mm256_storeu_ps(w + j + 8 * i, _mm256_mul_ps(v[i], scale));
  }
}

// Wider calls (from a few rows: decode batches, prefill) are compute-bound, so they run as
// a GEMM: a panel of output rows is dequantized once into a float32 buffer that stays in
// L2 (float32 weights are their own panel), and a register-blocked micro-kernel multiplies
// it by every activation row.
//
// Up to OUTER_ROWS rows the micro-kernel dots NR weight rows with MR activation rows along
// K: NR * MR accumulators, NR weight vectors and one activation vector are the 16 ymm
// registers, and each FMA costs 7/12 of a load.
constexpr int MR = 4;
constexpr int NR = 3;

//
// A narrow step's first pass over a panel reads the weight from memory, NW rows side by
// side: each pass's tile prefetches the rows of the next (`ahead`, null on later passes
// and at the panel's end), a 64-byte line of each per two steps, or the step waits on
// memory (docs/engine.md, "bf16 matmuls", on prefetching).
template <int NW, int MX>
void micro_kernel(const float* w, int64_t k, const float* x, int64_t x_stride, float* out,
                  int64_t out_stride, const float* ahead) {
  __m256 acc[NW][MX];
  for (int i = 0; i < NW; i++)
    for (int r = 0; r < MX; r++) acc[i][r] = _mm256_setzero_ps();
  for (int64_t j = 0; j < k; j += 8) {
    if (ahead && j % 16 == 0)
      for (int i = 0; i < NW; i++)
        _mm_prefetch(reinterpret_cast<const char*>(ahead + i * k + j), _MM_HINT_T0);
    __m256 wv[NW];
    for (int i = 0; i < NW; i++) wv[i] = _mm256_loadu_ps(w + i * k + j);
    for (int r = 0; r < MX; r++) {
      __m256 xv = _mm256_loadu_ps(x + r * x_stride + j);
      for (int i = 0; i < NW; i++) acc[i][r] = _mm256_fmadd_ps(wv[i], xv, acc[i][r]);
    }
  }
  for (int r = 0; r < MX; r++)
    for (int i = 0; i < NW; i++) out[r * out_stride + i] = vec::sum8(acc[i][r]);
}

// The micro-kernel for the last, short block of rows or of the panel.
template <int NW, int MX>
void micro_rows(int64_t mx, const float* w, int64_t k, const float* x, int64_t x_stride,
                float* out, int64_t out_stride, const float* ahead) {
  if constexpr (MX > 1)
    if (mx < MX) return micro_rows<NW, MX - 1>(mx, w, k, x, x_stride, out, out_stride, ahead);
  micro_kernel<NW, MX>(w, k, x, x_stride, out, out_stride, ahead);
}

template <int NW>
void micro_any(int64_t nw, int64_t mx, const float* w, int64_t k, const float* x,
               int64_t x_stride, float* out, int64_t out_stride, const float* ahead) {
  if constexpr (NW > 1)
    if (nw < NW) return micro_any<NW - 1>(nw, mx, w, k, x, x_stride, out, out_stride, ahead);
  micro_rows<NW, MR>(mx, w, k, x, x_stride, out, out_stride, ahead);
}

// From OUTER_ROWS rows it computes a tile of TILE_W weight rows by 8 * TILE_V activation
// rows as outer products, one input at a time: each weight is broadcast and multiplied by
// that input's value in 8 activation rows at once, read from a copy of the activations
// packed column-wise (x^T, pack_rows). Its 12 accumulators hold 96 outputs, where the dot
// form's hold 12 of 8 partial sums each, and a tile reads 4 bytes of each weight row an
// input instead of 32. SmolLM2's 30 layers + LM head at 64 rows, 1 thread, thread CPU,
// against the dot form in one process: float32 521 -> 494 ms, int8 510 -> 500 (AMD EPYC,
// avx2, load 7-8); at 8 rows the dot form is 5% (float32) to 19% (int8) faster.
//
// A CPU with AVX-512 gets a build of its own (library.py): there a full tile's two vectors
// of 8 rows are one 512-bit vector, and its 32 registers hold 12 weight rows' accumulators.
// Each lane still sums one output in input order, so both builds give the same bits.
constexpr int64_t OUTER_ROWS = 16;
#ifdef __AVX512F__
constexpr int TILE_W = 12;
#else
constexpr int TILE_W = 6;
#endif
constexpr int TILE_V = 2;
constexpr int64_t TILE_ROWS = 8 * TILE_V;

// sums[i * sums_stride + 8v + l] = dot(weight row i, activation row 8v + l) over k inputs:
// the outputs as [weight row][activation row]. Every output is summed in input order,
// whatever the tile, panel or thread. Passes over K in blocks of 256 (the tile's packed
// activations staying in L1) gave the same sums and measured no faster at 64 rows.
template <int W, int V>
void outer_tile(const float* w, int64_t k, const float* xt, float* sums, int64_t sums_stride) {
#ifdef __AVX512F__
  if constexpr (V == 2) {
    __m512 acc[W];
    for (int i = 0; i < W; i++) acc[i] = _mm512_setzero_ps();
    int64_t j = 0;
    do {
      __m512 xv = _mm512_loadu_ps(xt + j * 16);
      for (int i = 0; i < W; i++)
        acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(w[i * k + j]), xv, acc[i]);
    } while (++j < k);
    for (int i = 0; i < W; i++) _mm512_storeu_ps(sums + i * sums_stride, acc[i]);
    return;
  }
#endif
  __m256 acc[W][V];
  for (int i = 0; i < W; i++)
    for (int v = 0; v < V; v++) acc[i][v] = _mm256_setzero_ps();
  // k >= 8. As a loop that might run zero times, gcc 12 kept the accumulators on the
  // stack too, storing all 12 on every input: half the speed.
  int64_t j = 0;
  do {
    __m256 xv[V];
    for (int v = 0; v < V; v++) xv[v] = _mm256_loadu_ps(xt + j * 8 * V + 8 * v);
    for (int i = 0; i < W; i++) {
      __m256 b = _mm256_broadcast_ss(w + i * k + j);
      for (int v = 0; v < V; v++) acc[i][v] = _mm256_fmadd_ps(b, xv[v], acc[i][v]);
    }
  } while (++j < k);
  for (int i = 0; i < W; i++)
    for (int v = 0; v < V; v++) _mm256_storeu_ps(sums + i * sums_stride + 8 * v, acc[i][v]);
}

// The tile for the panel's last, short group of weight rows, and for a last block of 8
// activation rows.
template <int W>
void any_tile(int64_t w_rows, int64_t vectors, const float* w, int64_t k, const float* xt,
              float* sums, int64_t sums_stride) {
  if constexpr (W > 1)
    if (w_rows < W) return any_tile<W - 1>(w_rows, vectors, w, k, xt, sums, sums_stride);
  if (vectors == TILE_V)
    outer_tile<W, TILE_V>(w, k, xt, sums, sums_stride);
  else
    outer_tile<W, 1>(w, k, xt, sums, sums_stride);
}

// Grown once per thread (OpenMP keeps its threads), never freed: no allocation per call.
template <class T>
T* scratch(std::vector<T>& buffer, int64_t elements) {
  if (static_cast<int64_t>(buffer.size()) < elements) buffer.resize(elements);
  return buffer.data();
}

// x [rows, k] -> blocks of TILE_ROWS rows (the last of 8 when rows, padded with zero rows
// to `padded`, a multiple of 8, leave that), each [k][its rows]: block b starts at
// b * TILE_ROWS * k. Called by every thread of the team, each packing its share of the
// blocks.
void pack_rows(const float* x, int64_t rows, int64_t x_stride, int64_t k, int64_t padded,
               float* xt) {
  int64_t blocks = (padded + TILE_ROWS - 1) / TILE_ROWS;
#pragma omp for schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    int64_t first = b * TILE_ROWS;
    int64_t width = padded - first < TILE_ROWS ? padded - first : TILE_ROWS;
    float* block = xt + first * k;
    for (int64_t r = 0; r < width; r++) {
      const float* row = x + (first + r) * x_stride;
      for (int64_t j = 0; j < k; j++) block[j * width + r] = first + r < rows ? row[j] : 0.0f;
    }
  }
}

// The rows a wide call's outer tiles compute, a multiple of 8 (zero rows past `rows` where
// it is more): the rest, from there to `rows`, take the dot form, as a narrow call's rows
// do. Zero rows padding a vector cost as much as real ones, and the dot form costs about a
// tile's share per row: so whole vectors of 8 in tiles and the last rows % 8 in the dot
// form, except where the rows past the last full tile of 16 are 13-15, which a padded
// tile of 16 computes for less than a tile of 8 and the dot form. SmolLM2's 120 int4
// projections + Q8_0 head through the panel GEMM (int4_gemm_f32 / int8_gemm_f32), 2
// threads, against padding every call to a multiple of 8, alternating (AMD EPYC family 25
// model 1, Zen 3, avx2): 1.31-1.34x at 17 rows, 1.22-1.27x at 18-20, 1.09x at 23, 1.09-1.11x
// at 25, 1.03-1.04x at 28, 0.975x at 29 and 0.96x at 31 (hence 29-31 rows padded to 32);
// multiples of 8 unchanged.
int64_t tiled_rows(int64_t rows) {
  if (rows < OUTER_ROWS) return 0;
  if (rows % TILE_ROWS >= TILE_ROWS - 3) return (rows + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS;
  return rows / 8 * 8;
}

// A long prefill passes over the weight once per ROW_BLOCK activation rows, so that a
// panel's sums stay in cache, at the cost of dequantizing the weight once per block. A
// step's matmuls at 2,048 rows (quant_kernel_bench's, int8, thread CPU): 5.2 s in one
// pass (45 GFLOP/s, 0.8x float32's F.linear), 4.2 s in blocks of 512; blocks of 128 did
// 3.9 s but cost 19% at 256 rows.
constexpr int64_t ROW_BLOCK = 512;

// Output rows per panel: panel_bytes of rows of row_bytes, a whole number of tiles of
// `tile` rows, and as many panels as make equal shares for the threads (576 float32
// outputs at 576 inputs: 12 panels of 48, not 11 of 54 that leave one thread a panel more).
int64_t panel_rows(int64_t n, int64_t row_bytes, int64_t tile, int64_t panel_bytes,
                   int threads) {
  int64_t rows = panel_bytes / row_bytes / tile * tile;
  if (rows < tile) rows = tile;
  int64_t panels = (n + rows - 1) / rows;
  panels = (panels + threads - 1) / threads * threads;
  rows = (n + panels - 1) / panels;
  return (rows + tile - 1) / tile * tile;
}

// v[j] = row j of an 8 x 8 block -> v[j] = its column j.
inline void transpose8(__m256 v[8]) {
  __m256 t[8], u[8];
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_ps(v[j], v[j + 1]);
    t[j + 1] = _mm256_unpackhi_ps(v[j], v[j + 1]);
  }
  // u[4h + c] (rows 4h..4h+3) holds, in its 128-bit lane L, column 4L + c.
  for (int h = 0; h < 2; h++) {
    const __m256* q = t + 4 * h;
    u[4 * h] = _mm256_shuffle_ps(q[0], q[2], 0x44);
    u[4 * h + 1] = _mm256_shuffle_ps(q[0], q[2], 0xEE);
    u[4 * h + 2] = _mm256_shuffle_ps(q[1], q[3], 0x44);
    u[4 * h + 3] = _mm256_shuffle_ps(q[1], q[3], 0xEE);
  }
  for (int c = 0; c < 4; c++) {
    v[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    v[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

// out[r * n + i] = sums[i * stride + r] for r < rows, i < count: a panel's sums (a lane
// per activation row, the tiles' layout) into the output's rows, 8 x 8 at a time (a
// scalar copy cost ~5% of a 64-row bf16 step on Zen 4).
inline void store_sums(const float* sums, int64_t stride, int64_t rows, int64_t count,
                       float* out, int64_t n) {
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) {
    int64_t i = 0;
    for (; i + 8 <= count; i += 8) {
      __m256 v[8];
      for (int j = 0; j < 8; j++) v[j] = _mm256_loadu_ps(sums + (i + j) * stride + r);
      transpose8(v);
      for (int j = 0; j < 8; j++) _mm256_storeu_ps(out + (r + j) * n + i, v[j]);
    }
    for (; i < count; i++)
      for (int j = 0; j < 8; j++) out[(r + j) * n + i] = sums[i * stride + r + j];
  }
  for (; r < rows; r++)
    for (int64_t i = 0; i < count; i++) out[r * n + i] = sums[i * stride + r];
}

template <class MakeRow>
void panel_matmul(MakeRow make_row, const float* x, int64_t m, int64_t x_stride, int64_t n,
                  int64_t k, int64_t panel_bytes, float* out, int threads) {
  static thread_local std::vector<float> packed;
  int64_t panel = panel_rows(n, 4 * k, TILE_W, panel_bytes, threads);
  int64_t panels = (n + panel - 1) / panel;
  for (int64_t block = 0; block < m; block += ROW_BLOCK) {
    int64_t rows = block + ROW_BLOCK < m ? ROW_BLOCK : m - block;
    const float* xb = x + block * x_stride;
    int64_t tiled = tiled_rows(rows);
    float* xt = tiled ? scratch(packed, tiled * k) : nullptr;
    // One team for both loops: a second parallel region would wake the threads again.
#pragma omp parallel num_threads(threads)
    {
      if (tiled) pack_rows(xb, rows < tiled ? rows : tiled, x_stride, k, tiled, xt);
#pragma omp for schedule(static)
      for (int64_t p = 0; p < panels; p++) {
        static thread_local std::vector<float> dequantized, sums_buffer;
        int64_t first = p * panel, count = first + panel < n ? panel : n - first;
        const float* w;
        if constexpr (decltype(make_row(0))::IN_PLACE) {
          w = make_row(first).w;
        } else {
          float* rows_f32 = scratch(dequantized, panel * k);
          for (int64_t i = 0; i < count; i++)
            dequantize(make_row(first + i), k, rows_f32 + i * k);
          w = rows_f32;
        }
        float* out_panel = out + block * n + first;
        if (tiled) {
          float* sums = scratch(sums_buffer, panel * tiled);
          for (int64_t r = 0; r < tiled; r += TILE_ROWS) {
            int64_t vectors = tiled - r < TILE_ROWS ? (tiled - r) / 8 : TILE_V;
            for (int64_t i = 0; i < count; i += TILE_W)
              any_tile<TILE_W>(count - i, vectors, w + i * k, k, xt + r * k,
                               sums + i * tiled + r, tiled);
          }
          store_sums(sums, tiled, rows < tiled ? rows : tiled, count, out_panel, n);
        }
        // The panel's first pass over the weight (no tiles before it) prefetches its rows.
        for (int64_t r = tiled; r < rows; r += MR)
          for (int64_t i = 0; i < count; i += NR)
            micro_any<NR>(count - i, rows - r, w + i * k, k, xb + r * x_stride, x_stride,
                          out_panel + r * n + i, n,
                          r == 0 && i + NR < count ? w + (i + NR) * k : nullptr);
      }
    }
  }
}

#ifdef __AVX512BF16__
// panel_matmul in bf16 (bf16.h): the activation rows rounded to bf16 once per block of
// rows, each panel of weight rows in bf16 (the weight's copy made at load, else its rows
// dequantized and rounded here), bf16_panel's sums of bf16 products in float32, in input
// order. Panels of panel_bytes of bf16 rows: twice float32's rows, for the same L2.
template <class MakeRow>
void bf16_panel_matmul(MakeRow make_row, const uint16_t* bf16, const float* x, int64_t m,
                       int64_t x_stride, int64_t n, int64_t k, int64_t panel_bytes, float* out,
                       int threads) {
  static thread_local std::vector<uint16_t> packed;
  int64_t panel = panel_rows(n, 2 * k, BF16_PANEL_MULTIPLE, panel_bytes, threads);
  int64_t panels = (n + panel - 1) / panel;
  for (int64_t block = 0; block < m; block += ROW_BLOCK) {
    int64_t rows = block + ROW_BLOCK < m ? ROW_BLOCK : m - block;
    const float* xb = x + block * x_stride;
    int64_t padded = bf16_padded_rows(rows, k);
    uint16_t* xt = scratch(packed, padded * k);
#pragma omp parallel num_threads(threads)
    {
      bf16_pack_rows(xb, rows, x_stride, k, padded, xt);
#pragma omp for schedule(static)
      for (int64_t p = 0; p < panels; p++) {
        static thread_local std::vector<uint16_t> rounded;
        static thread_local std::vector<float> row_f32, sums_buffer;
        int64_t first = p * panel, count = first + panel < n ? panel : n - first;
        const uint16_t* w = bf16 ? bf16 + first * k : nullptr;
        if (!w) {
          uint16_t* rows_bf16 = scratch(rounded, panel * k);
          float* row = scratch(row_f32, k);
          for (int64_t i = 0; i < count; i++) {
            dequantize(make_row(first + i), k, row);
            to_bf16(row, k, rows_bf16 + i * k);
          }
          w = rows_bf16;
        }
        float* sums = scratch(sums_buffer, panel * padded);
        bf16_panel(w, count, k, xt, padded, sums);
        float* out_panel = out + block * n + first;
        store_sums(sums, padded, rows, count, out_panel, n);
      }
    }
  }
}
#endif

// The panel GEMM, in bf16 where the weight asks and the build has it.
template <class MakeRow>
void wide_matmul(MakeRow make_row, const NativeWeight& w, const float* x, int64_t m,
                 int64_t x_stride, float* out, int64_t panel_bytes, int threads) {
#ifdef __AVX512BF16__
  if (w.wide_bf16)
    return bf16_panel_matmul(make_row, w.bf16, x, m, x_stride, w.n, w.k, panel_bytes, out,
                             threads);
#endif
  panel_matmul(make_row, x, m, x_stride, w.n, w.k, panel_bytes, out, threads);
}

}  // namespace

void native_linear(const NativeWeight& w, const float* x, int64_t m, int64_t x_stride,
                   float* out, int64_t row_kernel_rows, int64_t panel_bytes, int threads) {
  // A step of up to blocks_rows rows reads the checkpoint's own blocks where the weight
  // keeps them.
  if (w.blocks && m <= w.blocks_rows)
    return native_linear(*w.blocks, x, m, x_stride, out, w.blocks_row_rows, panel_bytes,
                         threads);
  const int64_t k = w.k;
  bool integer_dot = m <= w.integer_rows && k % 32 == 0;
  if (w.format == WEIGHT_INT4_COLS8 || w.format == WEIGHT_INT8_COLS8) {
    cols8_qdot(w, x, m, x_stride, out, threads);
#ifdef COLS16_KERNEL
  } else if (w.format == WEIGHT_INT4_COLS16 || w.format == WEIGHT_INT8_COLS16) {
    cols16_qdot(w, x, m, x_stride, out, threads);
#endif
  } else if (integer_dot && w.format == WEIGHT_INT8) {
    int8_qdot(static_cast<const int8_t*>(w.data), w.scales, w.group, w.n, k, x, m, x_stride,
              w.integer16, out, threads);
  } else if (integer_dot && w.format == WEIGHT_INT4) {
    int4_qdot(static_cast<const uint8_t*>(w.data), w.scales, w.mins, w.group, w.n, k, x, m,
              x_stride, w.integer16, out, threads);
#ifdef __AVX512BF16__
  } else if (w.format == WEIGHT_FLOAT32 && w.wide_bf16 && w.bf16 && m <= row_kernel_rows) {
    // A weight computed in bf16 is so in every step, with the panel's sums (bf16.h): a
    // row's result does not depend on its step's width. The row kernel where it takes k.
    const float* data = static_cast<const float*>(w.data);
    auto row = [=](int64_t col) { return Float32Row{data + col * k}; };
    if (bf16_rows_take(k))
      bf16_rows(w.bf16, w.n, k, x, m, x_stride, out, threads);
    else
      bf16_panel_matmul(row, w.bf16, x, m, x_stride, w.n, k, panel_bytes, out, threads);
#endif
  } else if (w.format == WEIGHT_FLOAT32) {
    const float* data = static_cast<const float*>(w.data);
    auto row = [=](int64_t col) { return Float32Row{data + col * k}; };
    if (m <= row_kernel_rows)
      tiled_matmul(row, x, m, x_stride, w.n, k, 4 * k, out, threads);
    else
      wide_matmul(row, w, x, m, x_stride, out, panel_bytes, threads);
  } else if (w.format == WEIGHT_INT8) {
    const int8_t* q = static_cast<const int8_t*>(w.data);
    if (m <= row_kernel_rows)
      int8_row_matmul(q, w.scales, w.group, x, m, x_stride, w.n, k, out, threads);
    else
      with_int8_rows(q, w.scales, w.group, k, [&](auto row) {
        wide_matmul(row, w, x, m, x_stride, out, panel_bytes, threads);
      });
  } else {
    const uint8_t* packed = static_cast<const uint8_t*>(w.data);
    const float *scales = w.scales, *mins = w.mins;
    int64_t group = w.group, groups = k / group;
    auto row = [=](int64_t col) {
      return Int4Row{packed + col * (k / 2), scales + col * groups, mins + col * groups, group};
    };
    if (m <= row_kernel_rows)
      int4_row_matmul(packed, scales, mins, w.group, x, m, x_stride, w.n, k, out, threads);
    else
      wide_matmul(row, w, x, m, x_stride, out, panel_bytes, threads);
  }
  if (w.bias)
    for (int64_t r = 0; r < m; r++)
      for (int64_t col = 0; col < w.n; col++) out[r * w.n + col] += w.bias[col];
}

extern "C" {

// x float32 [m, k] (row stride x_stride), q int8 [n, k], scales float32 [n] (group 0) or
// [n, k/group], out [m, n].
void int8_matmul_f32(const float* x, int64_t m, int64_t x_stride, const int8_t* q,
                     const float* scales, int64_t group, int64_t n, int64_t k, float* out,
                     int threads) {
  int8_row_matmul(q, scales, group, x, m, x_stride, n, k, out, threads);
}

// x float32 [m, k], packed uint8 [n, k/2], scales/mins float32 [n, k/group], out [m, n].
void int4_matmul_f32(const float* x, int64_t m, int64_t x_stride, const uint8_t* packed,
                     const float* scales, const float* mins, int64_t group, int64_t n,
                     int64_t k, float* out, int threads) {
  int4_row_matmul(packed, scales, mins, group, x, m, x_stride, n, k, out, threads);
}

// The float32 weights [n, k]: what benchmarks/quant_kernel_bench.py measures the kernels
// against (dequantize + torch's matmul).
void int8_dequantize_f32(const int8_t* q, const float* scales, int64_t group, int64_t n,
                         int64_t k, float* w, int threads) {
  with_int8_rows(q, scales, group, k, [&](auto make_row) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t col = 0; col < n; col++) dequantize(make_row(col), k, w + col * k);
  });
}

void int4_dequantize_f32(const uint8_t* packed, const float* scales, const float* mins,
                         int64_t group, int64_t n, int64_t k, float* w, int threads) {
  int64_t groups = k / group;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t col = 0; col < n; col++) {
    Int4Row row{packed + col * (k / 2), scales + col * groups, mins + col * groups, group};
    dequantize(row, k, w + col * k);
  }
}

// The same products for many rows (decode batches, prefill): dequantized panels of
// panel_bytes of float32 weight rows, each multiplied by every activation row.
void int8_gemm_f32(const float* x, int64_t m, int64_t x_stride, const int8_t* q,
                   const float* scales, int64_t group, int64_t n, int64_t k, float* out,
                   int64_t panel_bytes, int threads) {
  with_int8_rows(q, scales, group, k, [&](auto row) {
    panel_matmul(row, x, m, x_stride, n, k, panel_bytes, out, threads);
  });
}

void int4_gemm_f32(const float* x, int64_t m, int64_t x_stride, const uint8_t* packed,
                   const float* scales, const float* mins, int64_t group, int64_t n, int64_t k,
                   float* out, int64_t panel_bytes, int threads) {
  int64_t groups = k / group;
  auto row = [=](int64_t col) {
    return Int4Row{packed + col * (k / 2), scales + col * groups, mins + col * groups, group};
  };
  panel_matmul(row, x, m, x_stride, n, k, panel_bytes, out, threads);
}

}  // extern "C"
