// Shared helpers of the AVX2 (+FMA, F16C) quantized kernels (quant_avx2_i8.cpp: int8
// activations; quant_avx2_f32.cpp: fp32 activations). Included only where __AVX2__, __FMA__ and
// __F16C__ are defined.
#pragma once

#include "quant.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace pytgi {
namespace quant {
namespace avx2 {

// Pins an integer accumulator in a register at this point. Integer adds are associative, so
// GCC otherwise rebuilds a block's sums as a tree: all 32 products of a 4-row pass live at once,
// spill to the stack, and the pass runs at half speed.
inline void keep(__m256i& v) { asm("" : "+x"(v)); }

// At one or two rows a pass streams codes from DRAM faster than the hardware prefetcher
// fetches them (4-bit: 11 -> 16 GB/s with this, docs/PERFORMANCE.md): ask for the lines
// kPrefetchBytes ahead.
constexpr int64_t kPrefetchBytes = 1024;

template <int R, int64_t BYTES>
inline void prefetch_ahead(const uint8_t* blk) {
  if constexpr (R <= 2) {
    for (int64_t line = 0; line < BYTES; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + line), _MM_HINT_T0);
    }
  }
}

// Group g's codes and scale rows, with the loop invariants held in locals (the compiler cannot
// keep a Matrix's fields in registers across the stores of a pass).
struct GroupView {
  const uint8_t* codes;   // k-block kb at codes + kb * block_bytes
  const uint8_t* scales;  // scale row s at scales + s * row_bytes
  const uint8_t* mins;    // likewise, or null
  int64_t kblocks;
  int64_t row_mul, row_shift, half_step;  // first row of k-block kb: (kb * mul) >> shift
};

inline GroupView view_of(const Matrix& w, int64_t g) {
  const int64_t row_bytes = w.half_scales ? 16 : 32, offset = g * w.scale_rows * row_bytes;
  GroupView v{w.codes + g * w.kblocks * block_bytes(w.format),
              static_cast<const uint8_t*>(w.scales) + offset,
              w.mins ? static_cast<const uint8_t*>(w.mins) + offset : nullptr,
              w.kblocks, 1, 0, 0};
  switch (w.scale_block) {
    case 16: v.row_mul = 2, v.half_step = 1; break;
    case 64: v.row_shift = 1; break;
    case 0: v.row_mul = 0; break;
    default: break;
  }
  return v;
}

template <bool HALF>
inline __m256 load_row(const uint8_t* base, int64_t row) {
  if constexpr (HALF) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + row * 16)));
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(base + row * 32));
  }
}

inline void store_rows(const __m256* acc, int rows, float* y, int64_t ys, int64_t g, int64_t n,
                const float* bias) {
  const int64_t c0 = g * kGroup, width = std::min<int64_t>(kGroup, n - c0);
  alignas(32) float buf[kGroup] = {};
  if (bias) std::copy_n(bias + c0, width, buf);
  const __m256 b = _mm256_load_ps(buf);
  for (int r = 0; r < rows; ++r) {
    const __m256 v = _mm256_add_ps(acc[r], b);
    if (width == kGroup) {
      _mm256_storeu_ps(y + r * ys + c0, v);
    } else {
      alignas(32) float out[kGroup];
      _mm256_store_ps(out, v);
      std::copy_n(out, width, y + r * ys + c0);
    }
  }
}

// The fp32-activation half of the AVX2 table (quant_avx2_f32.cpp).
void gemm_f32(const Matrix& w, const float* x, int64_t xs, int64_t rows, int64_t g0, int64_t g1,
              float* y, int64_t ys, const float* bias);
void dequant_group(const Matrix& w, int64_t g, float* panel, int64_t stride);

}  // namespace avx2
}  // namespace quant
}  // namespace pytgi
