// The bf16 panel (bf16.h) with AMX tiles, for Xeons with amx_tile + amx_bf16 (Sapphire
// Rapids and later); compiled only into such a CPU's build (library.py).
//
// UNTESTED on hardware: no AMX CPU could be reached when it was written (issue #32);
// tests/unit/kernels/test_bf16_panel.py runs it where one can and skips elsewhere.
//
// The layouts are bf16.h's own, which are the tiles': a weight panel's 16 rows by 32
// inputs are an A tile as they lie (row stride 2k bytes), and a packed block of 16
// activation rows' 16 input pairs is a B tile (rows of 64 bytes). A C tile is then 16
// weight rows by 16 activation rows of float32 sums, bf16_panel's sums layout.
// _tile_dpbf16ps's order of additions within a tile is the hardware's: the bit-level
// test of the vdpbf16ps kernel holds here only within its float32 tolerance.

#include "bf16.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace {

// Linux keeps a process's AMX state off until it asks (arch/x86/include/uapi/asm/prctl.h).
constexpr int ARCH_REQ_XCOMP_PERM = 0x1023;
constexpr int XFEATURE_XTILEDATA = 18;

struct TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Every tile 16 rows of 64 bytes: tmm0-3 the sums (C), tmm4-5 weights (A), tmm6-7
// activations (B). Loaded by each thread (the configuration is per thread).
void configure() {
  static thread_local bool configured = false;
  if (configured) return;
  TileConfig config;
  std::memset(&config, 0, sizeof(config));
  config.palette_id = 1;
  for (int t = 0; t < 8; t++) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
  configured = true;
}

// A weight tiles of 16 rows by B activation tiles of 16 rows, all k inputs, into sums.
template <int A, int B>
void tiles(const uint16_t* w, int64_t k, const uint16_t* xt, float* sums, int64_t padded) {
  const int64_t w_stride = 2 * k, sums_stride = 4 * padded;
  // The second activation block starts 16 rows (16 * k elements) after the first.
  const uint16_t* x1 = xt + BF16_BLOCK_ROWS * k;
  _tile_zero(0);
  if constexpr (B == 2) _tile_zero(1);
  if constexpr (A == 2) _tile_zero(2);
  if constexpr (A == 2 && B == 2) _tile_zero(3);
  for (int64_t c = 0; c < k; c += 32) {
    // Input chunk c: 32 weights a row, 16 pairs of each activation row (c * 16 elements in).
    _tile_loadd(4, w + c, w_stride);
    if constexpr (A == 2) _tile_loadd(5, w + 16 * k + c, w_stride);
    _tile_loadd(6, xt + c * 16, 64);
    if constexpr (B == 2) _tile_loadd(7, x1 + c * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (B == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (A == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (A == 2 && B == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, sums, sums_stride);
  if constexpr (B == 2) _tile_stored(1, sums + 16, sums_stride);
  if constexpr (A == 2) _tile_stored(2, sums + 16 * padded, sums_stride);
  if constexpr (A == 2 && B == 2) _tile_stored(3, sums + 16 * padded + 16, sums_stride);
}

template <int A>
void tiles_any(int64_t blocks, const uint16_t* w, int64_t k, const uint16_t* xt, float* sums,
               int64_t padded) {
  if (blocks >= 2)
    tiles<A, 2>(w, k, xt, sums, padded);
  else
    tiles<A, 1>(w, k, xt, sums, padded);
}

}  // namespace

bool amx_available() {
  static const bool granted =
      syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  return granted;
}

void amx_panel(const uint16_t* w, int64_t count, int64_t k, const uint16_t* xt,
               int64_t padded, float* sums) {
  static thread_local std::vector<uint16_t> tail;
  static thread_local std::vector<float> tail_sums;
  configure();
  for (int64_t r = 0; r < padded; r += 2 * BF16_BLOCK_ROWS) {
    int64_t blocks = (padded - r) / BF16_BLOCK_ROWS;
    const uint16_t* x = xt + r * k;
    int64_t i = 0;
    for (; i + 32 <= count; i += 32) tiles_any<2>(blocks, w + i * k, k, x, sums + i * padded + r, padded);
    for (; i + 16 <= count; i += 16) tiles_any<1>(blocks, w + i * k, k, x, sums + i * padded + r, padded);
    if (i < count) {
      // The last rows, fewer than a tile's 16: from a zero-padded copy, into sums of 16
      // rows of which only theirs are kept.
      int64_t left = count - i;
      if (static_cast<int64_t>(tail.size()) < 16 * k) tail.resize(16 * k);
      if (static_cast<int64_t>(tail_sums.size()) < 16 * padded) tail_sums.resize(16 * padded);
      std::memcpy(tail.data(), w + i * k, 2 * left * k);
      std::memset(tail.data() + left * k, 0, 2 * (16 - left) * k);
      tiles_any<1>(blocks, tail.data(), k, x, tail_sums.data() + r, padded);
      for (int64_t row = 0; row < left; row++)
        std::memcpy(sums + (i + row) * padded + r, tail_sums.data() + row * padded + r,
                    4 * (blocks >= 2 ? 32 : 16));
    }
  }
}

#endif
