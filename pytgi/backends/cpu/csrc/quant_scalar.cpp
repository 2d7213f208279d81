// The portable (scalar C++) table of quant.h's kernels: the reference every ISA table must match
// bit for bit, and what runs on CPUs without one. Loops are written element by element; float
// steps use explicit std::fma where the vector kernels fuse, so no contraction choice of the
// compiler can change the result.
#include "quant.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace pytgi {
namespace quant {
namespace {

void quantize_rows(const float* x, int64_t xs, int64_t rows, int64_t k, int64_t kblocks,
                   int8_t* q, float* scale, int32_t* sum, float* scaled_sum) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * xs;
    for (int64_t b = 0; b < kblocks; ++b) {
      const int64_t k0 = b * kKBlock, n = std::max<int64_t>(0, std::min(kKBlock, k - k0));
      float amax = 0.f;
      for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(xr[k0 + i]));
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      int8_t* qb = q + r * kblocks * kKBlock + k0;
      int32_t halves[2] = {0, 0};
      for (int64_t i = 0; i < kKBlock; ++i) {
        const int32_t v = i < n ? static_cast<int32_t>(std::nearbyint(xr[k0 + i] * inv)) : 0;
        qb[i] = static_cast<int8_t>(v);
        halves[i / 16] += v;
      }
      const float s = amax / 127.f;
      scale[r * kblocks + b] = s;
      sum[r * kblocks + b] = halves[0] + halves[1];
      float* ss = scaled_sum + kSums * (r * kblocks + b);
      ss[0] = s * static_cast<float>(halves[0] + halves[1]);
      ss[1] = s * static_cast<float>(halves[0]);
      ss[2] = s * static_cast<float>(halves[1]);
    }
  }
}

// The 4-bit code (0..15) of column c at offset j (0..31) of one k-block.
inline int nibble_at(const uint8_t* blk, int c, int j) {
  const int quad = j / 4;
  const uint8_t byte = blk[(quad % 4) * 32 + c * 4 + j % 4];
  return quad < 4 ? byte & 15 : byte >> 4;
}

// The signed code of column c at offset j of one k-block, as the int8 kernels see it: kInt8 its
// int8, kInt4 its nibble 0..15 (the offset of 8 is applied in the epilogue), kLut4 the int8
// table value.
inline int32_t code_i8(const Matrix& w, const uint8_t* blk, int c, int j) {
  if (w.format == kInt8) return static_cast<int8_t>(blk[(j / 4) * 32 + c * 4 + j % 4]);
  const int nibble = nibble_at(blk, c, j);
  return w.format == kInt4 ? nibble : w.table_i8[nibble];
}

// One column's dot product over k-block kb: the int32 sums of its two 16-wide halves.
inline void block_dot(const Matrix& w, const uint8_t* blk, const int8_t* xq, int c,
                      int32_t* lo, int32_t* hi) {
  int32_t d0 = 0, d1 = 0;
  for (int j = 0; j < 16; ++j) d0 += code_i8(w, blk, c, j) * xq[j];
  for (int j = 16; j < 32; ++j) d1 += code_i8(w, blk, c, j) * xq[j];
  *lo = d0;
  *hi = d1;
}

void gemm_i8(const Matrix& w, const Acts& a, int64_t rows, int64_t g0, int64_t g1, float* y,
             int64_t ys, const float* bias) {
  const int64_t kb_n = a.kblocks;
  float s0[kGroup], s1[kGroup], mn[kGroup], mn1[kGroup];
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t r = 0; r < rows; ++r) {
      float acc[kGroup] = {};
      const int8_t* xq = a.q + r * kb_n * kKBlock;
      for (int64_t kb = 0; kb < kb_n; ++kb) {
        const uint8_t* blk = w.block(g, kb);
        load_scales8(w.scales, w.half_scales, w.scale_rows, g, w.scale_row(kb), s0);
        if (w.scale_block == 16) {
          load_scales8(w.scales, w.half_scales, w.scale_rows, g, w.scale_row(kb, 1), s1);
        }
        if (w.mins) load_scales8(w.mins, w.half_scales, w.scale_rows, g, w.scale_row(kb), mn);
        if (w.mins && w.scale_block == 16) {
          load_scales8(w.mins, w.half_scales, w.scale_rows, g, w.scale_row(kb, 1), mn1);
        }
        const float dx = a.scale[r * kb_n + kb];
        const int32_t xsum = a.sum[r * kb_n + kb];
        const float* sdx = a.scaled_sum + kSums * (r * kb_n + kb);
        for (int c = 0; c < kGroup; ++c) {
          int32_t lo, hi;
          block_dot(w, blk, xq + kb * kKBlock, c, &lo, &hi);
          if (w.scale_block == 16) {
            acc[c] = std::fma(static_cast<float>(lo), s0[c] * dx, acc[c]);
            acc[c] = std::fma(static_cast<float>(hi), s1[c] * dx, acc[c]);
            if (w.mins) {
              acc[c] = std::fma(mn[c], sdx[1], acc[c]);
              acc[c] = std::fma(mn1[c], sdx[2], acc[c]);
            }
            continue;
          }
          int32_t d = lo + hi;
          if (w.format == kInt4 && !w.mins) d -= 8 * xsum;
          float s = s0[c] * dx;
          if (w.format == kLut4) s *= 1.f / 127.f;
          acc[c] = std::fma(static_cast<float>(d), s, acc[c]);
          if (w.mins) acc[c] = std::fma(mn[c], sdx[0], acc[c]);
        }
      }
      for (int c = 0; c < kGroup && g * kGroup + c < w.n; ++c) {
        y[r * ys + g * kGroup + c] = acc[c] + (bias ? bias[g * kGroup + c] : 0.f);
      }
    }
  }
}

// The weight of column c at offset j of a k-block, exactly as QuantizedWeight.dequantize (and
// the codebook and fp8 references) compute it.
inline float weight_at(const Matrix& w, const uint8_t* blk, const float* s, const float* mn,
                       int c, int j) {
  if (w.format == kFp8) return s[c] * e4m3_to_float(blk[(j / 4) * 32 + c * 4 + j % 4]);
  if (w.format == kLut4) return s[c] * w.table[nibble_at(blk, c, j)];
  const int32_t code = code_i8(w, blk, c, j);
  if (w.mins) return std::fma(s[c], static_cast<float>(code), mn[c]);
  return s[c] * static_cast<float>(w.format == kInt4 ? code - 8 : code);
}

void dequant_group(const Matrix& w, int64_t g, float* panel, int64_t stride);

void gemm_f32(const Matrix& w, const float* x, int64_t xs, int64_t rows, int64_t g0, int64_t g1,
              float* y, int64_t ys, const float* bias) {
  std::vector<float> panel(w.kblocks * kKBlock * kGroup);
  for (int64_t g = g0; g < g1; ++g) {
    dequant_group(w, g, panel.data(), kGroup);
    for (int64_t r = 0; r < rows; ++r) {
      for (int c = 0; c < kGroup && g * kGroup + c < w.n; ++c) {
        float acc = 0.f;
        for (int64_t k = 0; k < w.k; ++k) acc = std::fma(x[r * xs + k], panel[k * kGroup + c], acc);
        y[r * ys + g * kGroup + c] = acc + (bias ? bias[g * kGroup + c] : 0.f);
      }
    }
  }
}

void dequant_group(const Matrix& w, int64_t g, float* panel, int64_t stride) {
  float s[kGroup], mn[kGroup];
  for (int64_t kb = 0; kb < w.kblocks; ++kb) {
    const uint8_t* blk = w.block(g, kb);
    for (int half = 0; half < 2; ++half) {
      load_scales8(w.scales, w.half_scales, w.scale_rows, g, w.scale_row(kb, half), s);
      if (w.mins) load_scales8(w.mins, w.half_scales, w.scale_rows, g, w.scale_row(kb, half), mn);
      for (int j = 16 * half; j < 16 * half + 16; ++j) {
        for (int c = 0; c < kGroup; ++c) {
          panel[(kb * kKBlock + j) * stride + c] = weight_at(w, blk, s, mn, c, j);
        }
      }
    }
  }
}

}  // namespace

const Kernels& scalar_kernels() {
  static const Kernels table{"scalar", quantize_rows, gemm_i8, gemm_f32, dequant_group};
  return table;
}

}  // namespace quant
}  // namespace pytgi
