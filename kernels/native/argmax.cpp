// Greedy sampling's argmax over [rows, vocab] float32 logits, AVX2: torch.argmax of SmolLM2's
// 49,152-wide rows costs ~90 us a row alone and ~350 us a row at 64 rows (its multi-row
// reduction is scalar), against a vector pass at memory speed. The result is torch's: the
// first index of the largest value, or of the first NaN where a row has one.

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

namespace {

int64_t first_nan(const float* row, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (isnan(row[i])) return i;
  return -1;
}

// Two passes: the largest value (four independent max chains, at load speed), then the
// first index holding it (the row is in cache by then: 192 KiB for SmolLM2's).
int64_t argmax_row(const float* row, int64_t n) {
  __m256 top4[4], nan4 = _mm256_setzero_ps();
  for (auto& t : top4) t = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; j++) {
      const __m256 v = _mm256_loadu_ps(row + i + 8 * j);
      top4[j] = _mm256_max_ps(top4[j], v);
      nan4 = _mm256_or_ps(nan4, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
  // max_ps drops a NaN operand: a row with one is answered apart, as torch does.
  if (_mm256_movemask_ps(nan4)) return first_nan(row, n);
  const __m256 top8 = _mm256_max_ps(_mm256_max_ps(top4[0], top4[1]),
                                    _mm256_max_ps(top4[2], top4[3]));
  float lanes[8];
  _mm256_storeu_ps(lanes, top8);
  float top = lanes[0];
  for (int j = 1; j < 8; j++) top = fmaxf(top, lanes[j]);
  for (; i < n; i++) {
    if (isnan(row[i])) return first_nan(row, n);
    top = fmaxf(top, row[i]);
  }
  const __m256 wanted = _mm256_set1_ps(top);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + k), wanted, _CMP_EQ_OQ));
    if (hits) return k + __builtin_ctz(hits);
  }
  for (; k < n; k++)
    if (row[k] == top) return k;
  return 0;  // an empty row
}

}  // namespace

extern "C" {

// logits [rows, vocab] with row stride `stride` (vocab < 2^31); writes each row's argmax.
void argmax_rows_f32(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                     int64_t* out, int threads) {
#pragma omp parallel for num_threads(threads) if (rows > 1)
  for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(logits + r * stride, vocab);
}

}  // extern "C"
