// The low-rank products of a step's LoRA adapters, beside the projections they extend
// (services/engine/lora/step_lora.py computes the same in torch; native_layers.py fills
// these structures once per set of adapters, and bindings.py mirrors their layout).
#pragma once

#include <stdint.h>

// One projection's adapters stacked: each adapter's update of a row x is
// (x @ a_t[g]) @ b_t[g], its scaling already folded into b_t (lora/adapter.py).
struct NativeLowRank {
  const float* a_t;  // [adapters, k, width] (zero-padded to the widest), or null: no
                     // adapter of the step targets this projection
  const float* b_t;  // [adapters, width, n]
  int64_t width;
};

// One layer's four projections, as NativeLayer names them.
struct NativeLora {
  NativeLowRank qkv, o, gate_up, down;
};

// out [m, n] (contiguous) gains, in each row r whose row_adapter[r] >= 0, that adapter's
// update of x's row r (x [m, k], row stride x_stride); rows of -1 (the base model) are
// untouched. Each row is computed alone, in one order, so neither the thread count nor
// the other rows of the step change its result.
void lora_add(const NativeLowRank& p, const int64_t* row_adapter, const float* x, int64_t m,
              int64_t x_stride, int64_t k, int64_t n, float* out, int threads);
