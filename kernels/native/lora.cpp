// A step's LoRA updates in the native layer halves (lora.h). A decode step holds a few
// rows per adapter, and a rank-8 update of a row is ~2% of its projection's arithmetic:
// what made adapter steps slow was leaving the native path for torch's per-op dispatch,
// not the products. So each row is done alone, straight from the stacked weights: the
// low-rank vector (width floats) first, then its product with b_t into a row buffer,
// added to the projection's output once, as the torch path adds its update.

#include <stdint.h>

#include <vector>

#include "lora.h"

namespace {

// Rows per thread below which waking the team costs more than the rows.
constexpr int64_t PARALLEL_ROWS = 4;

void lora_row(const NativeLowRank& p, int64_t adapter, const float* x, int64_t k, int64_t n,
              float* out, float* low, float* update) {
  const int64_t width = p.width;
  const float* a = p.a_t + adapter * k * width;
  const float* b = p.b_t + adapter * width * n;
  for (int64_t w = 0; w < width; w++) low[w] = 0.0f;
  for (int64_t i = 0; i < k; i++) {
    const float xi = x[i];
    const float* a_row = a + i * width;
    for (int64_t w = 0; w < width; w++) low[w] += xi * a_row[w];
  }
  for (int64_t j = 0; j < n; j++) update[j] = 0.0f;
  for (int64_t w = 0; w < width; w++) {
    const float lw = low[w];
    const float* b_row = b + w * n;
    for (int64_t j = 0; j < n; j++) update[j] += lw * b_row[j];
  }
  for (int64_t j = 0; j < n; j++) out[j] += update[j];
}

}  // namespace

void lora_add(const NativeLowRank& p, const int64_t* row_adapter, const float* x, int64_t m,
              int64_t x_stride, int64_t k, int64_t n, float* out, int threads) {
  if (p.a_t == nullptr || row_adapter == nullptr) return;
#pragma omp parallel for num_threads(threads) if (m >= PARALLEL_ROWS * threads)
  for (int64_t r = 0; r < m; r++) {
    if (row_adapter[r] < 0) continue;
    // Per thread, kept between calls: the low-rank vector, then the update row.
    static thread_local std::vector<float> scratch;
    if (static_cast<int64_t>(scratch.size()) < p.width + n) scratch.resize(p.width + n);
    lora_row(p, row_adapter[r], x + r * x_stride, k, n, out + r * n, scratch.data(),
             scratch.data() + p.width);
  }
}
