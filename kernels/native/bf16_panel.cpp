// The bf16 panel micro-kernel (bf16.h) with vdpbf16ps, for CPUs with AVX512-BF16 (Zen 4,
// Zen 5, Cooper Lake and later Xeons): each instruction does two bf16 products per float32
// lane, twice the float32 FMA's work, from half the bytes.
//
// The outer-product tile of matmul.cpp's float32 panel: a weight row's pair of inputs is
// broadcast (one 32-bit word) and dotted with that pair in 16 activation rows at once, one
// accumulator of 16 outputs per weight row and block. vdpbf16ps adds the odd input's
// product, then the even one's, each sum rounded to float32 (the products of two bf16 are
// exact in float32; measured on Zen 4, as Intel's SDM writes it), so every output is summed
// in input order, whatever the tile, panel or thread: tests/unit/kernels/test_bf16_panel.py
// emulates exactly that.

#include "bf16.h"

#include <immintrin.h>

#include <vector>

#ifdef __AVX512BF16__

namespace {

// The main tile: WIDE_W weight rows by two blocks of 16 activation rows, 16 accumulators,
// each broadcast serving two vdpbf16ps (10 loads for 16 of them). SmolLM2's four layer
// shapes, 1 thread, thread CPU, against one block of 16 by 16 weight rows (17 loads for
// 16): 157 against 135 GFLOP/s at 64 rows, 171 against 149 at 256 (AMD EPYC Zen 4,
// shared; 12 and 10 rows by two blocks measured 144-148 at 64). The tile of one block
// (TILE_W rows, 16 accumulators) takes the rest: a last block of 16 or of 8, a short panel.
constexpr int WIDE_W = 8;
constexpr int TILE_W = 16;

// A wide step's first pass over a panel reads its rows from memory: each tile prefetches
// the next tile's rows (`ahead`, null on later passes, which find them in cache, and at the
// panel's end), or W rows side by side are more streams than the hardware prefetcher
// follows. SmolLM2's 121 weights, 2 threads, two builds alternating in one process
// (benchmarks/library_ab.py): 1.20-1.32x at 32 rows, 1.12-1.13x at 64, 1.02-1.05x at 256
// (docs/engine.md, "bf16 matmuls"); the same bits.
template <int W>
void wide_tile(const uint16_t* w, int64_t k, const uint16_t* xt, float* sums,
               int64_t sums_stride, const uint16_t* ahead) {
  const int64_t pairs = k / 2;
  const int32_t* wp = reinterpret_cast<const int32_t*>(w);
  const uint16_t* xt1 = xt + BF16_BLOCK_ROWS * k;
  __m512 acc[W][2];
  for (int i = 0; i < W; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  int64_t j = 0;
  // k >= 8. A loop that might run zero times kept the accumulators on the stack
  // (matmul.cpp's outer_tile).
  do {
    // The next tile's W rows, W * 4 bytes of them an input pair: 32 at W = 8, so a line
    // every second pair.
    if (ahead && !(j & 1))
      _mm_prefetch(reinterpret_cast<const char*>(ahead + j * W * 2), _MM_HINT_T0);
    __m512bh x0 = (__m512bh)_mm512_loadu_si512(xt + j * 32);
    __m512bh x1 = (__m512bh)_mm512_loadu_si512(xt1 + j * 32);
    for (int i = 0; i < W; i++) {
      __m512bh b = (__m512bh)_mm512_set1_epi32(wp[i * pairs + j]);
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], x0, b);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], x1, b);
    }
  } while (++j < pairs);
  for (int i = 0; i < W; i++) {
    _mm512_storeu_ps(sums + i * sums_stride, acc[i][0]);
    _mm512_storeu_ps(sums + i * sums_stride + 16, acc[i][1]);
  }
}

// Prefetch of the weight rows after a tile's or a row group's (`ahead`; null after the
// last): a 64-byte line per input pair, while the tile reads W * 4 bytes of its own rows.
// A narrow step reads each weight once, and waited on memory without it (docs/engine.md,
// "bf16 matmuls").
inline void prefetch_ahead(const uint16_t* ahead, int64_t j) {
  if (ahead) _mm_prefetch(reinterpret_cast<const char*>(ahead + j * 32), _MM_HINT_T0);
}

// W weight rows by one block of 8 * V activation rows (V = 2: a zmm of 16; V = 1: a ymm
// of the last 8).
template <int W, int V>
void tile(const uint16_t* w, int64_t k, const uint16_t* xt, float* sums, int64_t sums_stride,
          const uint16_t* ahead) {
  const int64_t pairs = k / 2;
  const int32_t* wp = reinterpret_cast<const int32_t*>(w);
  int64_t j = 0;
  if constexpr (V == 2) {
    __m512 acc[W];
    for (int i = 0; i < W; i++) acc[i] = _mm512_setzero_ps();
    do {
      prefetch_ahead(ahead, j);
      __m512bh xv = (__m512bh)_mm512_loadu_si512(xt + j * 32);
      for (int i = 0; i < W; i++)
        acc[i] = _mm512_dpbf16_ps(acc[i], xv, (__m512bh)_mm512_set1_epi32(wp[i * pairs + j]));
    } while (++j < pairs);
    for (int i = 0; i < W; i++) _mm512_storeu_ps(sums + i * sums_stride, acc[i]);
  } else {
    __m256 acc[W];
    for (int i = 0; i < W; i++) acc[i] = _mm256_setzero_ps();
    do {
      prefetch_ahead(ahead, j);
      __m256bh xv = (__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt + j * 16));
      for (int i = 0; i < W; i++)
        acc[i] = _mm256_dpbf16_ps(acc[i], xv, (__m256bh)_mm256_set1_epi32(wp[i * pairs + j]));
    } while (++j < pairs);
    for (int i = 0; i < W; i++) _mm256_storeu_ps(sums + i * sums_stride, acc[i]);
  }
}

// The tile for the panel's last, short group of weight rows, and for a last block of 8.
template <int W>
void any_tile(int64_t w_rows, int64_t vectors, const uint16_t* w, int64_t k, const uint16_t* xt,
              float* sums, int64_t sums_stride, const uint16_t* ahead) {
  if constexpr (W > 1)
    if (w_rows < W) return any_tile<W - 1>(w_rows, vectors, w, k, xt, sums, sums_stride, ahead);
  if (vectors == 2)
    tile<W, 2>(w, k, xt, sums, sums_stride, ahead);
  else
    tile<W, 1>(w, k, xt, sums, sums_stride, ahead);
}

// The row kernel's pieces (bf16_rows below).
constexpr int ROWS_W = 16;    // weight rows a group: one output per float32 lane
constexpr int ROWS_MAX = 4;   // activation rows at once: one accumulator each

// v[i] = the 16 dwords of row i of a 16 x 16 block -> v[j] = its column j: each weight
// row's 16 input pairs become 16 vectors, each one pair of all 16 rows. Unpacks of
// dwords and quadwords within 128-bit lanes, then a 4 x 4 transpose of the lanes.
inline void transpose16(__m512i v[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
  }
  // u[4 * c + g] (rows 4g..4g+3) holds, in its 128-bit lane L, column 4L + c.
  __m512i u[16];
  for (int g = 0; g < 4; g++) {
    const __m512i *lo = t + 4 * g, *hi = t + 4 * g + 1;
    u[0 + g] = _mm512_unpacklo_epi64(lo[0], lo[2]);
    u[4 + g] = _mm512_unpackhi_epi64(lo[0], lo[2]);
    u[8 + g] = _mm512_unpacklo_epi64(hi[0], hi[2]);
    u[12 + g] = _mm512_unpackhi_epi64(hi[0], hi[2]);
  }
  for (int c = 0; c < 4; c++) {
    const __m512i* q = u + 4 * c;
    __m512i a = _mm512_shuffle_i32x4(q[0], q[1], 0x44), b = _mm512_shuffle_i32x4(q[0], q[1], 0xEE);
    __m512i e = _mm512_shuffle_i32x4(q[2], q[3], 0x44), f = _mm512_shuffle_i32x4(q[2], q[3], 0xEE);
    v[0 + c] = _mm512_shuffle_i32x4(a, e, 0x88);
    v[4 + c] = _mm512_shuffle_i32x4(a, e, 0xDD);
    v[8 + c] = _mm512_shuffle_i32x4(b, f, 0x88);
    v[12 + c] = _mm512_shuffle_i32x4(b, f, 0xDD);
  }
}

// M activation rows (their bf16 pairs, xp[r * pairs + j]) against the group of `count`
// weight rows from w: out[r * n + i], i < count.
template <int M>
void rows_group(const uint16_t* w, int64_t count, int64_t k, const uint32_t* xp, float* out,
                int64_t n, const uint16_t* ahead) {
  const int64_t pairs = k / 2;
  __m512 acc[M];
  for (int r = 0; r < M; r++) acc[r] = _mm512_setzero_ps();
  for (int64_t j0 = 0; j0 < pairs; j0 += 16) {
    // The next group's 16 lines for this block's 16 (prefetch_ahead).
    for (int64_t j = j0; j < j0 + 16; j++) prefetch_ahead(ahead, j);
    __m512i v[16];
    for (int i = 0; i < ROWS_W; i++)
      v[i] = i < count ? _mm512_loadu_si512(w + i * k + 2 * j0) : _mm512_setzero_si512();
    transpose16(v);
    // Pair by pair, in input order: the panel's order for every output.
    for (int c = 0; c < 16; c++)
      for (int r = 0; r < M; r++)
        acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)v[c],
                                  (__m512bh)_mm512_set1_epi32(xp[r * pairs + j0 + c]));
  }
  const __mmask16 lanes = count >= 16 ? 0xFFFF : (__mmask16)((1u << count) - 1);
  for (int r = 0; r < M; r++) _mm512_mask_storeu_ps(out + r * n, lanes, acc[r]);
}

template <int M>
void rows_any(int64_t m, const uint16_t* w, int64_t count, int64_t k, const uint32_t* xp,
              float* out, int64_t n, const uint16_t* ahead) {
  if constexpr (M > 1)
    if (m < M) return rows_any<M - 1>(m, w, count, k, xp, out, n, ahead);
  rows_group<M>(w, count, k, xp, out, n, ahead);
}

}  // namespace

void bf16_rows(const uint16_t* w, int64_t n, int64_t k, const float* x, int64_t m,
               int64_t x_stride, float* out, int threads) {
  static thread_local std::vector<uint16_t> rounded;
  if (static_cast<int64_t>(rounded.size()) < m * k) rounded.resize(m * k);
  for (int64_t r = 0; r < m; r++) to_bf16(x + r * x_stride, k, rounded.data() + r * k);
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(rounded.data());
  const int64_t groups = (n + ROWS_W - 1) / ROWS_W, pairs = k / 2;
  // Each output is one thread's, summed in one order: the thread count changes nothing.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t g = 0; g < groups; g++) {
    const int64_t first = g * ROWS_W, count = n - first < ROWS_W ? n - first : ROWS_W;
    const uint16_t* ahead = g + 1 < groups ? w + (first + ROWS_W) * k : nullptr;
    for (int64_t r = 0; r < m; r += ROWS_MAX)
      rows_any<ROWS_MAX>(m - r, w + first * k, count, k, xp + r * pairs, out + r * n + first,
                         n, r ? nullptr : ahead);
  }
}

void to_bf16(const float* x, int64_t n, uint16_t* out) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + j)));
  if (j < n)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j),
                     (__m128i)_mm256_cvtneps_pbh(_mm256_loadu_ps(x + j)));
}

int64_t bf16_padded_rows(int64_t rows, int64_t k) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  // AMX's tiles take 16 rows of activations and 32 inputs at a time.
  if (use_amx(k)) return (rows + 15) / 16 * 16;
#endif
  // Past one block of 16, a last part of 17-31 rows takes the wide tile with zero rows
  // padding it to 32: its two blocks share each weight pair's broadcast, where the
  // one-block tiles' two passes read the rows twice. 1.05-1.2x at 17-24 rows, 1.07-1.13x at
  // 50-56 (SmolLM2's 121 weights, as wide_tile's prefetch); a row's sums do not change.
  const int64_t wide = 2 * BF16_BLOCK_ROWS, tail = rows % wide;
  if (tail > BF16_BLOCK_ROWS) return rows - tail + wide;
  return (rows + 7) / 8 * 8;
}

void bf16_pack_rows(const float* x, int64_t rows, int64_t x_stride, int64_t k, int64_t padded,
                    uint16_t* xt) {
  static thread_local std::vector<uint16_t> row_buffer;
  if (static_cast<int64_t>(row_buffer.size()) < k) row_buffer.resize(k);
  const uint32_t* pairs = reinterpret_cast<const uint32_t*>(row_buffer.data());
  int64_t blocks = (padded + BF16_BLOCK_ROWS - 1) / BF16_BLOCK_ROWS;
#pragma omp for schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    int64_t first = b * BF16_BLOCK_ROWS;
    int64_t width = padded - first < BF16_BLOCK_ROWS ? padded - first : BF16_BLOCK_ROWS;
    uint32_t* block = reinterpret_cast<uint32_t*>(xt + first * k);
    for (int64_t r = 0; r < width; r++) {
      if (first + r < rows) {
        to_bf16(x + (first + r) * x_stride, k, row_buffer.data());
        for (int64_t j = 0; j < k / 2; j++) block[j * width + r] = pairs[j];
      } else {
        for (int64_t j = 0; j < k / 2; j++) block[j * width + r] = 0;
      }
    }
  }
}

void bf16_panel(const uint16_t* w, int64_t count, int64_t k, const uint16_t* xt,
                int64_t padded, float* sums) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (use_amx(k)) return amx_panel(w, count, k, xt, padded, sums);
#endif
  const uint16_t* end = w + count * k;
  auto ahead_of = [end](const uint16_t* rows) { return rows < end ? rows : nullptr; };
  int64_t r = 0;
  for (; r + 2 * BF16_BLOCK_ROWS <= padded; r += 2 * BF16_BLOCK_ROWS) {
    int64_t i = 0;
    for (; i + WIDE_W <= count; i += WIDE_W)
      wide_tile<WIDE_W>(w + i * k, k, xt + r * k, sums + i * padded + r, padded,
                        r == 0 ? ahead_of(w + (i + WIDE_W) * k) : nullptr);
    for (int64_t b = r; b < r + 2 * BF16_BLOCK_ROWS && i < count; b += BF16_BLOCK_ROWS)
      any_tile<TILE_W>(count - i, 2, w + i * k, k, xt + b * k, sums + i * padded + b, padded,
                       nullptr);
  }
  // A narrow step's blocks (or a wide one's last). The first pass over the panel reads
  // its rows from memory, each tile but the last prefetching the next's; later passes
  // find them in cache.
  for (; r < padded; r += BF16_BLOCK_ROWS) {
    int64_t vectors = padded - r < BF16_BLOCK_ROWS ? (padded - r) / 8 : 2;
    for (int64_t i = 0; i < count; i += TILE_W)
      any_tile<TILE_W>(count - i, vectors, w + i * k, k, xt + r * k, sums + i * padded + r,
                       padded, r == 0 ? ahead_of(w + (i + TILE_W) * k) : nullptr);
  }
}

extern "C" int64_t wide_bf16_kernel() {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (amx_available()) return 2;
#endif
  return 1;
}

#else

extern "C" int64_t wide_bf16_kernel() { return 0; }

#endif
