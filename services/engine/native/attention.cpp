// Paged decode attention over one layer's KV pool, float32, AVX2 + FMA.
//
// One call per layer: the step's new keys and values go into their pool slots,
// then each decode attends over its own blocks where they lie (no gather, no
// padding to the batch's longest). A work item is one (decode, KV head, tile of
// up to 3 of the query heads sharing it): with SmolLM2's 3 query heads per KV
// head every key and value row is read once. Softmax in two passes over a
// per-thread row of scores (max-subtracted, exp vectorised), then the weighted
// sum of the values scaled by 1 / sum once at the end. Each output row is
// computed by one thread in a fixed order: the thread count never changes it.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "vec.h"

namespace {

constexpr int kTile = 3;     // query heads per work item: 12 accumulators of 8 in the value pass
constexpr int kChunk = 32;   // head_dim floats per value-pass chunk: 4 ymm per head

// e^x for x <= 0 (scores minus their max), 0 below -87 and for -inf (the padding),
// where vec::exp8 would clamp.
inline __m256 exp_nonpositive(__m256 x) {
    return _mm256_and_ps(vec::exp8(x), _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ));
}

// The same row of the next block, one block ahead: a KV head's rows are a third of
// each pool row (strided) and a table's blocks need not be neighbours, which the
// hardware prefetcher follows poorly. Kernel alone, 1 thread, A/B in one process:
// 32 decodes of 50-300 2137 -> 1169 us, 8 of 1000-2000 5317 -> 3272; two blocks
// ahead measured no better.
inline void prefetch_row(const float* row, int64_t floats) {
    for (int64_t f = 0; f < floats; f += 16)
        _mm_prefetch(reinterpret_cast<const char*>(row + f), _MM_HINT_T0);
}

struct Pool {
    const float* k;
    const float* v;
    int64_t block_size;
    int64_t row;  // floats between consecutive positions of one KV head: kv_heads * head_dim
};

// visit(p, row) for each position p < context: row is one KV head's floats of `cache`
// from `offset`; the same `floats` of the next block's row are prefetched meanwhile.
template <typename Visit>
void for_each_position(const float* cache, const Pool& pool, const int64_t* table,
                       int64_t context, int64_t offset, int64_t floats, Visit visit) {
    for (int64_t start = 0; start < context; start += pool.block_size) {
        const int64_t b = start / pool.block_size;
        const float* block = cache + table[b] * pool.block_size * pool.row + offset;
        const float* next = start + pool.block_size < context
                                ? cache + table[b + 1] * pool.block_size * pool.row + offset
                                : nullptr;
        const int64_t rows = std::min(pool.block_size, context - start);
        for (int64_t i = 0; i < rows; ++i) {
            if (next) prefetch_row(next + i * pool.row, floats);
            visit(start + i, block + i * pool.row);
        }
    }
}

// scores[t * stride + p] = scale * q_t . key_p for the tile's T heads: each key row is
// read once, the q rows stay in L1.
template <int T>
void scores_of(const float* const* q, const Pool& pool, const int64_t* table, int64_t context,
               int64_t head_offset, int64_t head_dim, float scale, float* scores, int64_t stride) {
    for_each_position(pool.k, pool, table, context, head_offset, head_dim,
                      [&](int64_t p, const float* key) {
        __m256 even[T], odd[T];
        for (int t = 0; t < T; ++t) even[t] = odd[t] = _mm256_setzero_ps();
        for (int64_t d = 0; d < head_dim; d += 16) {
            const __m256 k0 = _mm256_loadu_ps(key + d);
            const __m256 k1 = _mm256_loadu_ps(key + d + 8);
            for (int t = 0; t < T; ++t) {
                even[t] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q[t] + d), even[t]);
                odd[t] = _mm256_fmadd_ps(k1, _mm256_loadu_ps(q[t] + d + 8), odd[t]);
            }
        }
        for (int t = 0; t < T; ++t)
            scores[t * stride + p] = scale * vec::sum8(_mm256_add_ps(even[t], odd[t]));
    });
}

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

// out_t = sum_p weights[t][p] * value_p / sums[t], head_dim in chunks of 32 floats so
// the tile's accumulators stay in registers while each value row is read once.
template <int T>
void weighted_values(const float* weights, int64_t stride, const float* sums, const Pool& pool,
                     const int64_t* table, int64_t context, int64_t head_offset,
                     int64_t head_dim, float* const* out) {
    for (int64_t c = 0; c < head_dim; c += kChunk) {
        __m256 acc[T][4];
        for (int t = 0; t < T; ++t)
            for (int j = 0; j < 4; ++j) acc[t][j] = _mm256_setzero_ps();
        for_each_position(pool.v, pool, table, context, head_offset + c, kChunk,
                          [&](int64_t p, const float* value) {
            for (int t = 0; t < T; ++t) {
                const __m256 w = _mm256_set1_ps(weights[t * stride + p]);
                for (int j = 0; j < 4; ++j)
                    acc[t][j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(value + 8 * j), acc[t][j]);
            }
        });
        for (int t = 0; t < T; ++t) {
            const __m256 inverse = _mm256_set1_ps(1.0f / sums[t]);
            for (int j = 0; j < 4; ++j)
                _mm256_storeu_ps(out[t] + c + 8 * j, _mm256_mul_ps(acc[t][j], inverse));
        }
    }
}

template <int T>
void attend_tile(const float* const* q, float* const* out, const Pool& pool, const int64_t* table,
                 int64_t context, int64_t head_offset, int64_t head_dim, float scale) {
    thread_local std::vector<float> scratch;
    const int64_t padded = (context + 7) / 8 * 8;
    scratch.resize(static_cast<size_t>(T * padded));
    float* scores = scratch.data();
    scores_of<T>(q, pool, table, context, head_offset, head_dim, scale, scores, padded);
    float sums[T];
    for (int t = 0; t < T; ++t) sums[t] = exponentiate(scores + t * padded, context, padded);
    weighted_values<T>(scores, padded, sums, pool, table, context, head_offset, head_dim, out);
}

}  // namespace

extern "C" {

// q [decodes, heads, head_dim] with token/head strides (a view of the fused qkv output);
// k, v [tokens, kv_heads, head_dim] likewise, written to slot_mapping[token] of the
// pools [blocks, block_size, kv_heads, head_dim] (contiguous) before any decode reads;
// block_tables [decodes, table_width], context_lens [decodes]; out [decodes, heads,
// head_dim] contiguous. head_dim a multiple of 32; heads a multiple of kv_heads.
void paged_attention_decode_f32(const float* q, int64_t q_token_stride, int64_t q_head_stride,
                                const float* k, int64_t k_token_stride, int64_t k_head_stride,
                                const float* v, int64_t v_token_stride, int64_t v_head_stride,
                                const int64_t* slot_mapping, int64_t tokens, float* k_cache,
                                float* v_cache, const int64_t* block_tables, int64_t table_width,
                                const int64_t* context_lens, int64_t decodes, int64_t heads,
                                int64_t kv_heads, int64_t head_dim, int64_t block_size,
                                float scale, float* out, int threads) {
    const int64_t row = kv_heads * head_dim;
    const size_t head_bytes = static_cast<size_t>(head_dim) * sizeof(float);
    for (int64_t i = 0; i < tokens; ++i) {
        for (int64_t h = 0; h < kv_heads; ++h) {
            std::memcpy(k_cache + slot_mapping[i] * row + h * head_dim,
                        k + i * k_token_stride + h * k_head_stride, head_bytes);
            std::memcpy(v_cache + slot_mapping[i] * row + h * head_dim,
                        v + i * v_token_stride + h * v_head_stride, head_bytes);
        }
    }
    const Pool pool{k_cache, v_cache, block_size, row};
    const int64_t group = heads / kv_heads;
    const int64_t tiles = (group + kTile - 1) / kTile;
    const int64_t items = decodes * kv_heads * tiles;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (int64_t item = 0; item < items; ++item) {
        const int64_t seq = item / (kv_heads * tiles);
        const int64_t kv_head = item / tiles % kv_heads;
        const int64_t first = kv_head * group + item % tiles * kTile;
        const int n = static_cast<int>(std::min<int64_t>(kTile, kv_head * group + group - first));
        const float* q_rows[kTile];
        float* out_rows[kTile];
        for (int t = 0; t < n; ++t) {
            q_rows[t] = q + seq * q_token_stride + (first + t) * q_head_stride;
            out_rows[t] = out + (seq * heads + first + t) * head_dim;
        }
        const int64_t* table = block_tables + seq * table_width;
        const int64_t context = context_lens[seq];
        const int64_t offset = kv_head * head_dim;
        if (n == 3)
            attend_tile<3>(q_rows, out_rows, pool, table, context, offset, head_dim, scale);
        else if (n == 2)
            attend_tile<2>(q_rows, out_rows, pool, table, context, offset, head_dim, scale);
        else
            attend_tile<1>(q_rows, out_rows, pool, table, context, offset, head_dim, scale);
    }
}

}  // extern "C"
