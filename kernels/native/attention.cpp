// Paged decode attention over one layer's KV pool, float32 or bf16, AVX2 + FMA.
//
// One call per layer: the step's new keys and values go into their pool slots,
// then each decode attends over its own blocks where they lie (no gather, no
// padding to the batch's longest). A work item is one decode with all its heads,
// so each position's keys and values are read as one contiguous pool row (every
// KV head's), once: 24-29% less time than an item per KV head reading its strided
// third of each row, at 64 decodes of 50-300 and 8-32 of 1000-2000 (memory-bound),
// within 6% of it where the pool is in cache. Softmax in two passes over a
// per-thread row of scores per head (max-subtracted, exp vectorised), then the
// weighted sum of the values scaled by 1 / sum once at the end. Each output row is
// computed by one thread in a fixed order: the thread count never changes it.
//
// A bf16 pool (--kv-cache-dtype bf16) holds each key and value rounded to nearest even
// (torch's .to(torch.bfloat16), bit for bit) and is read back by widening: half the
// bytes a decode reads, which is what its time goes to; the arithmetic stays float32.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "vec.h"

namespace {

constexpr int kTile = 3;     // query heads per tile: 12 accumulators of 8 in a value sweep
constexpr int kChunk = 32;   // head_dim floats per value sweep: 4 ymm per head

// e^x for x <= 0 (scores minus their max), 0 below -87 and for -inf (the padding),
// where vec::exp8 would clamp.
inline __m256 exp_nonpositive(__m256 x) {
    return _mm256_and_ps(vec::exp8(x), _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ));
}

// 8 pool entries as floats: a bf16 entry is a float32's upper half.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

// A key or value into the pool: as it is, or rounded to bf16 as torch rounds (to nearest
// even; a NaN stays a quiet NaN).
inline void put(float* to, const float* from, int64_t n) {
    std::memcpy(to, from, static_cast<size_t>(n) * sizeof(float));
}
inline void put(uint16_t* to, const float* from, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, from + i, sizeof bits);
        to[i] = std::isnan(from[i]) ? uint16_t{0x7FC0}
                                    : static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
    }
}

// The same entries of the next block, one block ahead: a table's blocks need not be
// neighbours, so the hardware prefetcher cannot follow them. Kernel alone, 1 thread,
// A/B in one process: 32 decodes of 50-300 2137 -> 1169 us, 8 of 1000-2000 5317 ->
// 3272 (when each item read one KV head's strided third of the rows); two blocks
// ahead measured no better.
template <typename T>
inline void prefetch(const T* from, int64_t entries) {
    const char* bytes = reinterpret_cast<const char*>(from);
    for (int64_t b = 0; b < entries * static_cast<int64_t>(sizeof(T)); b += 64)
        _mm_prefetch(bytes + b, _MM_HINT_T0);
}

template <typename T>
struct Pool {
    const T* k;
    const T* v;
    int64_t block_size;
    int64_t row;  // entries between consecutive positions: kv_heads * head_dim
};

// In place: scores -> e^(score - max), padded with zeros to a multiple of 8; returns the sum.
float exponentiate(float* scores, int64_t context, int64_t padded) {
    float top = -INFINITY;
    for (int64_t p = 0; p < context; ++p) top = std::max(top, scores[p]);
    for (int64_t p = context; p < padded; ++p) scores[p] = -INFINITY;
    const __m256 shift = _mm256_set1_ps(top);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t p = 0; p < padded; p += 8) {
        const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(scores + p), shift));
        _mm256_storeu_ps(scores + p, e);
        sum = _mm256_add_ps(sum, e);
    }
    return vec::sum8(sum);
}

// acc_t += sum over the block's rows of weights[t][start + i] * value_i, for T heads
// sharing one KV head and head_dim in chunks of 32 floats (12 accumulators in registers).
template <int T, typename E>
void add_values(const float* weights, int64_t stride, const E* values, const E* next,
                int64_t rows, int64_t row, int64_t head_dim, float* acc) {
    for (int64_t c = 0; c < head_dim; c += kChunk) {
        __m256 a[T][4];
        for (int t = 0; t < T; ++t)
            for (int j = 0; j < 4; ++j) a[t][j] = _mm256_loadu_ps(acc + t * head_dim + c + 8 * j);
        for (int64_t i = 0; i < rows; ++i) {
            const E* value = values + i * row + c;
            if (next) prefetch(next + i * row + c, kChunk);
            for (int t = 0; t < T; ++t) {
                const __m256 w = _mm256_set1_ps(weights[t * stride + i]);
                for (int j = 0; j < 4; ++j)
                    a[t][j] = _mm256_fmadd_ps(w, load8(value + 8 * j), a[t][j]);
            }
        }
        for (int t = 0; t < T; ++t)
            for (int j = 0; j < 4; ++j) _mm256_storeu_ps(acc + t * head_dim + c + 8 * j, a[t][j]);
    }
}

// Up to 3 query heads that share a KV head: the unit of both passes, so each key and
// value vector loaded serves all of them.
struct Tile {
    int64_t first;   // its first query head
    int n;           // query heads
    int64_t offset;  // its KV head's floats within a pool row
};

// scores[t * stride + p] = scale * q_t . key for the tile's T heads.
template <int T, typename E>
inline void dot_tile(const E* key, const float* q, int64_t q_head_stride, int64_t head_dim,
                     float scale, float* scores, int64_t stride, int64_t p) {
    __m256 even[T], odd[T];
    for (int t = 0; t < T; ++t) even[t] = odd[t] = _mm256_setzero_ps();
    for (int64_t d = 0; d < head_dim; d += 16) {
        const __m256 k0 = load8(key + d);
        const __m256 k1 = load8(key + d + 8);
        for (int t = 0; t < T; ++t) {
            even[t] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q + t * q_head_stride + d), even[t]);
            odd[t] = _mm256_fmadd_ps(k1, _mm256_loadu_ps(q + t * q_head_stride + d + 8), odd[t]);
        }
    }
    for (int t = 0; t < T; ++t)
        scores[t * stride + p] = scale * vec::sum8(_mm256_add_ps(even[t], odd[t]));
}

struct Shape {
    int64_t heads, head_dim;
    const std::vector<Tile>& tiles;
};

template <typename E>
void attend(const float* q, int64_t q_head_stride, float* out, const Pool<E>& pool,
            const int64_t* table, int64_t context, const Shape& shape, float scale) {
    const int64_t heads = shape.heads, head_dim = shape.head_dim, bs = pool.block_size;
    const int64_t padded = (context + 7) / 8 * 8;
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(heads * (padded + head_dim + 1)));
    float* scores = scratch.data();
    float* acc = scores + heads * padded;
    float* sums = acc + heads * head_dim;
    for (int64_t start = 0; start < context; start += bs) {
        const int64_t b = start / bs;
        const E* block = pool.k + table[b] * bs * pool.row;
        const E* next = start + bs < context ? pool.k + table[b + 1] * bs * pool.row : nullptr;
        const E* values = pool.v + table[b] * bs * pool.row;
        const int64_t rows = std::min(bs, context - start);
        for (int64_t i = 0; i < rows; ++i) {
            const E* keys = block + i * pool.row;
            if (next) prefetch(next + i * pool.row, pool.row);
            // And this position's values, for the second pass: it would wait on memory
            // for every block otherwise (a decode's K and V, ~150 KB at 100 positions,
            // stay in L2 until then). Decoding alone waits on memory ~70% of its time
            // (64 decodes of 95 positions: 34 ms a step from DRAM, 9.5 with every table
            // on the same blocks); this took 34.1 -> 29.9 ms on 1 thread, 19.2 -> 17.0
            // on 2, the same bits (AMD EPYC Zen 4; docs/engine.md).
            prefetch(values + i * pool.row, pool.row);
            for (const Tile& tile : shape.tiles) {
                const E* key = keys + tile.offset;
                const float* qt = q + tile.first * q_head_stride;
                float* st = scores + tile.first * padded;
                if (tile.n == 3)
                    dot_tile<3>(key, qt, q_head_stride, head_dim, scale, st, padded, start + i);
                else if (tile.n == 2)
                    dot_tile<2>(key, qt, q_head_stride, head_dim, scale, st, padded, start + i);
                else
                    dot_tile<1>(key, qt, q_head_stride, head_dim, scale, st, padded, start + i);
            }
        }
    }
    for (int64_t h = 0; h < heads; ++h)
        sums[h] = exponentiate(scores + h * padded, context, padded);
    std::fill(acc, acc + heads * head_dim, 0.0f);
    for (int64_t start = 0; start < context; start += bs) {
        const int64_t b = start / bs;
        const E* block = pool.v + table[b] * bs * pool.row;
        const E* next = start + bs < context ? pool.v + table[b + 1] * bs * pool.row : nullptr;
        const int64_t rows = std::min(bs, context - start);
        // Every head over this block while it is in cache, a tile of up to 3 query heads
        // of one KV head at a time.
        for (const Tile& tile : shape.tiles) {
            const E* values = block + tile.offset;
            const E* ahead = next ? next + tile.offset : nullptr;
            const float* w = scores + tile.first * padded + start;
            float* a = acc + tile.first * head_dim;
            if (tile.n == 3)
                add_values<3>(w, padded, values, ahead, rows, pool.row, head_dim, a);
            else if (tile.n == 2)
                add_values<2>(w, padded, values, ahead, rows, pool.row, head_dim, a);
            else
                add_values<1>(w, padded, values, ahead, rows, pool.row, head_dim, a);
        }
    }
    for (int64_t h = 0; h < heads; ++h) {
        const __m256 inverse = _mm256_set1_ps(1.0f / sums[h]);
        for (int64_t d = 0; d < head_dim; d += 8)
            _mm256_storeu_ps(out + h * head_dim + d,
                             _mm256_mul_ps(_mm256_loadu_ps(acc + h * head_dim + d), inverse));
    }
}

// paged_attention_decode's work, for a pool of float32 or bf16 entries E.
template <typename E>
void decode(const float* q, int64_t q_token_stride, int64_t q_head_stride, const float* k,
            int64_t k_token_stride, int64_t k_head_stride, const float* v, int64_t v_token_stride,
            int64_t v_head_stride, const int64_t* slot_mapping, int64_t tokens, E* k_cache,
            E* v_cache, const int64_t* block_tables, int64_t table_width,
            const int64_t* context_lens, int64_t decodes, int64_t heads, int64_t kv_heads,
            int64_t head_dim, int64_t block_size, float scale, float* out, int threads) {
    const int64_t row = kv_heads * head_dim;
    for (int64_t i = 0; i < tokens; ++i) {
        for (int64_t h = 0; h < kv_heads; ++h) {
            put(k_cache + slot_mapping[i] * row + h * head_dim,
                k + i * k_token_stride + h * k_head_stride, head_dim);
            put(v_cache + slot_mapping[i] * row + h * head_dim,
                v + i * v_token_stride + h * v_head_stride, head_dim);
        }
    }
    const Pool<E> pool{k_cache, v_cache, block_size, row};
    const int64_t group = heads / kv_heads;
    std::vector<Tile> tiles;
    for (int64_t kv = 0; kv < kv_heads; ++kv)
        for (int64_t first = kv * group; first < (kv + 1) * group; first += kTile)
            tiles.push_back(
                {first, static_cast<int>(std::min<int64_t>(kTile, (kv + 1) * group - first)),
                 kv * head_dim});
    const Shape shape{heads, head_dim, tiles};
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (int64_t seq = 0; seq < decodes; ++seq)
        attend(q + seq * q_token_stride, q_head_stride, out + seq * heads * head_dim, pool,
               block_tables + seq * table_width, context_lens[seq], shape, scale);
}

}  // namespace

extern "C" {

// q [decodes, heads, head_dim] with token/head strides (a view of the fused qkv output);
// k, v [tokens, kv_heads, head_dim] likewise, written to slot_mapping[token] of the
// pools [blocks, block_size, kv_heads, head_dim] (contiguous; float32 entries, or bf16
// ones where pool_bf16, the new keys and values rounded in) before any decode reads;
// block_tables [decodes, table_width], context_lens [decodes]; out [decodes, heads,
// head_dim] contiguous. head_dim a multiple of 32; heads a multiple of kv_heads.
void paged_attention_decode(const float* q, int64_t q_token_stride, int64_t q_head_stride,
                            const float* k, int64_t k_token_stride, int64_t k_head_stride,
                            const float* v, int64_t v_token_stride, int64_t v_head_stride,
                            const int64_t* slot_mapping, int64_t tokens, void* k_cache,
                            void* v_cache, int64_t pool_bf16, const int64_t* block_tables,
                            int64_t table_width, const int64_t* context_lens, int64_t decodes,
                            int64_t heads, int64_t kv_heads, int64_t head_dim,
                            int64_t block_size, float scale, float* out, int threads) {
    if (pool_bf16)
        decode(q, q_token_stride, q_head_stride, k, k_token_stride, k_head_stride, v,
               v_token_stride, v_head_stride, slot_mapping, tokens,
               static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache), block_tables,
               table_width, context_lens, decodes, heads, kv_heads, head_dim, block_size, scale,
               out, threads);
    else
        decode(q, q_token_stride, q_head_stride, k, k_token_stride, k_head_stride, v,
               v_token_stride, v_head_stride, slot_mapping, tokens, static_cast<float*>(k_cache),
               static_cast<float*>(v_cache), block_tables, table_width, context_lens, decodes,
               heads, kv_heads, head_dim, block_size, scale, out, threads);
}

}  // extern "C"
