// A float32 weight's matmul through matmul.cpp's kernels, for the LM head (cpu_linear.py):
// the panel GEMM that the layer halves use beats torch's GEMM in row slices on SmolLM2's
// 49,152-row head at 8-32 rows by 15-30% of CPU (docs/engine.md).
#include "matmul.h"

extern "C" {

// out [m, n] = x [m, k] (row stride x_stride) @ w [n, k]^T + bias (null: none).
void f32_linear(const float* x, int64_t m, int64_t x_stride, const float* w, const float* bias,
                int64_t n, int64_t k, float* out, int64_t row_kernel_rows, int64_t panel_bytes,
                int threads) {
  NativeWeight weight{WEIGHT_FLOAT32, w, nullptr, nullptr, 0, bias, n, k};
  native_linear(weight, x, m, x_stride, out, row_kernel_rows, panel_bytes, threads);
}

// native_linear on a weight as the layers describe it (bindings.Weight): one projection in
// any format, wide path and all: the kernel tests, benchmarks/flops_bench.py and the bf16
// LM head of wide steps (native_layers.NativeHead).
void weight_linear(const NativeWeight* w, const float* x, int64_t m, int64_t x_stride,
                   float* out, int64_t row_kernel_rows, int64_t panel_bytes, int threads) {
  native_linear(*w, x, m, x_stride, out, row_kernel_rows, panel_bytes, threads);
}

}  // extern "C"
