// A decoder layer's two dense halves in float32 (services/engine/model.py's
// DecoderLayer.attention_inputs and attention_outputs), one call each, for x86 CPUs with
// AVX2 + FMA: from Python these are ~90 torch calls a layer at 1-10 us each, which is
// half of a batch-1 step (docs/engine.md, "One stream"). services/engine/native_layers.py
// fills NativeLayer once per layer and calls these with the step's rows.
//
// The arithmetic is the torch twins' (kernels/rms_norm_ref.py, rotary_ref.py,
// activation_ref.py), in float32; the projections are matmul.cpp's kernels, split over
// output rows by OpenMP, so the thread count never changes a result. Intermediates live
// in buffers of the calling thread, grown once and kept between calls.

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "attention.h"
#include "lora.h"
#include "matmul.h"
#include "vec.h"

// bindings.py's Layer mirrors this layout; native_layout() below lets it check that at load.
struct NativeLayer {
  NativeWeight qkv, o, gate_up, down;
  const float* input_norm;  // [hidden]
  const float* post_norm;   // [hidden]
  double eps;
  int64_t hidden, heads, kv_heads, head_dim, intermediate;
  int64_t row_kernel_rows, panel_bytes;  // quantization/cpu_kernel.py's crossover and panel
};

namespace {

// Elementwise passes over tokens run on the team only when there are enough of them to
// pay for waking it.
constexpr int64_t PARALLEL_TOKENS = 64;

float* buffer(std::vector<float>& v, int64_t floats) {
  if (static_cast<int64_t>(v.size()) < floats) v.resize(floats);
  return v.data();
}

// out = weight * (x * rsqrt(mean(x^2) + eps)), one row of n (a multiple of 8).
void rms_norm_row(const float* x, const float* weight, int64_t n, double eps, float* out) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; j += 8) {
    __m256 v = _mm256_loadu_ps(x + j);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float scale = 1.0f / sqrtf(vec::sum8(acc) / n + static_cast<float>(eps));
  __m256 s = _mm256_set1_ps(scale);
  for (int64_t j = 0; j < n; j += 8)
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_loadu_ps(weight + j),
                                            _mm256_mul_ps(_mm256_loadu_ps(x + j), s)));
}

// Half-split rotary (dimension i turns with i + d/2) of `heads` heads of one token, from
// the projection's row into a contiguous [heads, d] row; cos and sin are the token's [d].
void rotate_heads(const float* x, int64_t heads, int64_t d, const float* cos, const float* sin,
                  float* out) {
  int64_t half = d / 2;
  for (int64_t h = 0; h < heads; h++) {
    const float* xh = x + h * d;
    float* oh = out + h * d;
    for (int64_t i = 0; i < half; i++) {
      float x1 = xh[i], x2 = xh[i + half];
      oh[i] = x1 * cos[i] - x2 * sin[i];
      oh[i + half] = x2 * cos[i + half] + x1 * sin[i + half];
    }
  }
}

// row [2 * n], gate then up -> silu(gate) * up in the gate half, in place (n a multiple of 8).
// Vectorised as torch's silu is: scalar expf would cost ~0.5 ms a token a step.
void silu_and_mul_row(float* row, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t j = 0; j < n; j += 8) {
    __m256 g = _mm256_loadu_ps(row + j);
    __m256 e = vec::exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(row + j, _mm256_mul_ps(silu, _mm256_loadu_ps(row + n + j)));
  }
}

void add_rows(const float* a, const float* b, int64_t count, float* out) {
  for (int64_t j = 0; j < count; j++) out[j] = a[j] + b[j];
}

// out = x @ W^T (+ bias), plus the rows' adapter updates where the step has adapters
// (lora null: none; row_adapter: each row's adapter in the step's stack, -1 the base).
void linear(const NativeLayer& layer, const NativeWeight& w, const NativeLowRank* lora,
            const int64_t* row_adapter, const float* x, int64_t m, int64_t x_stride, float* out,
            int threads) {
  native_linear(w, x, m, x_stride, out, layer.row_kernel_rows, layer.panel_bytes, threads);
  if (lora) lora_add(*lora, row_adapter, x, m, x_stride, w.k, w.n, out, threads);
}

}  // namespace

extern "C" {

// x [tokens, hidden]; residual [tokens, hidden] or null (the first layer); cos and sin
// [tokens, head_dim]. Writes q [tokens, heads, head_dim], k and v [tokens, kv_heads,
// head_dim], and stream = x + residual (untouched when residual is null: the stream is x).
// lora: the layer's adapters where some row runs one (row_adapter: lora.h), else null.
void layer_inputs_f32(const NativeLayer* layer, const float* x, const float* residual,
                      int64_t tokens, const float* cos, const float* sin, float* q, float* k,
                      float* v, float* stream, const NativeLora* lora,
                      const int64_t* row_adapter, int threads) {
  static thread_local std::vector<float> normed_buffer, qkv_buffer;
  const NativeLayer& L = *layer;
  const int64_t hidden = L.hidden, d = L.head_dim;
  const int64_t q_size = L.heads * d, kv_size = L.kv_heads * d, width = L.qkv.n;
  float* normed = buffer(normed_buffer, tokens * hidden);
  float* qkv = buffer(qkv_buffer, tokens * width);
  const float* source = residual ? stream : x;
#pragma omp parallel for num_threads(threads) if (tokens >= PARALLEL_TOKENS)
  for (int64_t t = 0; t < tokens; t++) {
    if (residual) add_rows(x + t * hidden, residual + t * hidden, hidden, stream + t * hidden);
    rms_norm_row(source + t * hidden, L.input_norm, hidden, L.eps, normed + t * hidden);
  }
  linear(L, L.qkv, lora ? &lora->qkv : nullptr, row_adapter, normed, tokens, hidden, qkv,
         threads);
#pragma omp parallel for num_threads(threads) if (tokens >= PARALLEL_TOKENS)
  for (int64_t t = 0; t < tokens; t++) {
    const float* row = qkv + t * width;
    rotate_heads(row, L.heads, d, cos + t * d, sin + t * d, q + t * q_size);
    rotate_heads(row + q_size, L.kv_heads, d, cos + t * d, sin + t * d, k + t * kv_size);
    for (int64_t j = 0; j < kv_size; j++) v[t * kv_size + j] = row[q_size + kv_size + j];
  }
}

// attended [tokens, heads * head_dim] (row stride attended_stride), residual [tokens,
// hidden]. Writes stream = o_proj(attended) + residual and out = the MLP of its norm.
// lora and row_adapter as layer_inputs_f32's.
void layer_outputs_f32(const NativeLayer* layer, const float* attended, int64_t attended_stride,
                       const float* residual, int64_t tokens, float* out, float* stream,
                       const NativeLora* lora, const int64_t* row_adapter, int threads) {
  static thread_local std::vector<float> projected_buffer, normed_buffer, gate_up_buffer;
  const NativeLayer& L = *layer;
  const int64_t hidden = L.hidden, inter = L.intermediate;
  float* projected = buffer(projected_buffer, tokens * hidden);
  float* normed = buffer(normed_buffer, tokens * hidden);
  float* gate_up = buffer(gate_up_buffer, tokens * 2 * inter);
  linear(L, L.o, lora ? &lora->o : nullptr, row_adapter, attended, tokens, attended_stride,
         projected, threads);
#pragma omp parallel for num_threads(threads) if (tokens >= PARALLEL_TOKENS)
  for (int64_t t = 0; t < tokens; t++) {
    add_rows(projected + t * hidden, residual + t * hidden, hidden, stream + t * hidden);
    rms_norm_row(stream + t * hidden, L.post_norm, hidden, L.eps, normed + t * hidden);
  }
  linear(L, L.gate_up, lora ? &lora->gate_up : nullptr, row_adapter, normed, tokens, hidden,
         gate_up, threads);
#pragma omp parallel for num_threads(threads) if (tokens >= PARALLEL_TOKENS)
  for (int64_t t = 0; t < tokens; t++) silu_and_mul_row(gate_up + t * 2 * inter, inter);
  // The products sit in each row's gate half: the down projection reads them in place.
  linear(L, L.down, lora ? &lora->down : nullptr, row_adapter, gate_up, tokens, 2 * inter, out,
         threads);
}

// Every layer of a step whose tokens are all decodes, one token per sequence: from Python
// the same work is three calls a layer (the halves around attention.cpp's), ~30 us of
// wrappers each at one stream. The arithmetic is those calls' own, in their order, so
// the result is theirs bit for bit. x [tokens, hidden] is the embeddings (left as they
// are); the pools are [layers, blocks, block_size, kv_heads, head_dim] (contiguous,
// layer_entries apart), of float32 entries or, where pool_bf16, of bf16 ones; the
// metadata is attention's for the step. loras: one NativeLora per layer where some row runs
// an adapter (row_adapter: lora.h), else null. Writes out (the last MLP's output) and
// stream (the stream before it), for the final norm.
void decode_layers_f32(const NativeLayer* layers, int64_t num_layers, const float* x,
                       int64_t tokens, const float* cos, const float* sin, void* k_pool,
                       void* v_pool, int64_t layer_entries, int64_t pool_bf16,
                       const int64_t* slot_mapping, const int64_t* block_tables,
                       int64_t table_width,
                       const int64_t* context_lens, int64_t block_size,
                       const NativeLora* loras, const int64_t* row_adapter, float* out,
                       float* stream, int threads) {
  static thread_local std::vector<float> q_buffer, k_buffer, v_buffer, attended_buffer;
  for (int64_t l = 0; l < num_layers; l++) {
    const NativeLayer& L = layers[l];
    const int64_t d = L.head_dim, q_size = L.heads * d, kv_size = L.kv_heads * d;
    float* q = buffer(q_buffer, tokens * q_size);
    float* k = buffer(k_buffer, tokens * kv_size);
    float* v = buffer(v_buffer, tokens * kv_size);
    float* attended = buffer(attended_buffer, tokens * q_size);
    // The first layer's stream is x itself; after it, the previous layer's, updated in
    // place (each add reads and writes one element at a time).
    const float* residual = l == 0 ? x : stream;
    const NativeLora* lora = loras ? loras + l : nullptr;
    layer_inputs_f32(&L, l == 0 ? x : out, l == 0 ? nullptr : stream, tokens, cos, sin, q, k,
                     v, stream, lora, row_adapter, threads);
    // native_attention.py's scale, head_dim ** -0.5 rounded to float.
    const float scale = static_cast<float>(pow(static_cast<double>(d), -0.5));
    const size_t entry = pool_bf16 ? 2 : 4;
    paged_attention_decode(q, q_size, d, k, kv_size, d, v, kv_size, d, slot_mapping, tokens,
                           static_cast<char*>(k_pool) + l * layer_entries * entry,
                           static_cast<char*>(v_pool) + l * layer_entries * entry, pool_bf16,
                           block_tables, table_width, context_lens, tokens, L.heads,
                           L.kv_heads, d, block_size, scale, attended, threads);
    layer_outputs_f32(&L, attended, q_size, residual, tokens, out, stream, lora, row_adapter,
                      threads);
  }
}

// The structures' layout as this compiler laid them out, for bindings.py's check at
// load: sizeof(NativeWeight), each field's offset in declaration order, then the same for
// NativeLayer, NativeLowRank and NativeLora. Returns how many values there are; writes at most `capacity` of them.
int64_t native_layout(int64_t* out, int64_t capacity) {
  const int64_t values[] = {
      sizeof(NativeWeight),
      offsetof(NativeWeight, format),
      offsetof(NativeWeight, data),
      offsetof(NativeWeight, scales),
      offsetof(NativeWeight, mins),
      offsetof(NativeWeight, group),
      offsetof(NativeWeight, bias),
      offsetof(NativeWeight, n),
      offsetof(NativeWeight, k),
      offsetof(NativeWeight, integer_rows),
      offsetof(NativeWeight, wide_bf16),
      offsetof(NativeWeight, bf16),
      offsetof(NativeWeight, blocks),
      offsetof(NativeWeight, blocks_rows),
      offsetof(NativeWeight, blocks_row_rows),
      offsetof(NativeWeight, integer16),
      sizeof(NativeLayer),
      offsetof(NativeLayer, qkv),
      offsetof(NativeLayer, o),
      offsetof(NativeLayer, gate_up),
      offsetof(NativeLayer, down),
      offsetof(NativeLayer, input_norm),
      offsetof(NativeLayer, post_norm),
      offsetof(NativeLayer, eps),
      offsetof(NativeLayer, hidden),
      offsetof(NativeLayer, heads),
      offsetof(NativeLayer, kv_heads),
      offsetof(NativeLayer, head_dim),
      offsetof(NativeLayer, intermediate),
      offsetof(NativeLayer, row_kernel_rows),
      offsetof(NativeLayer, panel_bytes),
      sizeof(NativeLowRank),
      offsetof(NativeLowRank, a_t),
      offsetof(NativeLowRank, b_t),
      offsetof(NativeLowRank, width),
      sizeof(NativeLora),
      offsetof(NativeLora, qkv),
      offsetof(NativeLora, o),
      offsetof(NativeLora, gate_up),
      offsetof(NativeLora, down),
  };
  const int64_t count = sizeof(values) / sizeof(values[0]);
  for (int64_t i = 0; i < count && i < capacity; i++) out[i] = values[i];
  return count;
}

}  // extern "C"
