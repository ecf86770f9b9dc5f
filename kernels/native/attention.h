// attention.cpp's paged decode attention (float32 and bf16 pools), for the layer loop (layer.cpp) to call in a
// decode step; the documentation of its arguments is at its definition.
#pragma once

#include <stdint.h>

extern "C" void paged_attention_decode(
    const float* q, int64_t q_token_stride, int64_t q_head_stride, const float* k,
    int64_t k_token_stride, int64_t k_head_stride, const float* v, int64_t v_token_stride,
    int64_t v_head_stride, const int64_t* slot_mapping, int64_t tokens, void* k_cache,
    void* v_cache, int64_t pool_bf16, const int64_t* block_tables, int64_t table_width,
    const int64_t* context_lens, int64_t decodes, int64_t heads, int64_t kv_heads,
    int64_t head_dim, int64_t block_size, float scale, float* out, int threads);
