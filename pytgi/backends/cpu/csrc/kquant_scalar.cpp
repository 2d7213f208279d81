// The portable table of the K-quant kernels (kquant.h), the reference the SIMD tables equal bit
// for bit, and the steps every table shares: the activation quantiser and the exact dequantiser.
#include "kquant.h"

#include <algorithm>
#include <cmath>

namespace pytgi {
namespace kquant {

void quantize_rows(const float* x, int64_t xs, int64_t rows, int64_t supers, int8_t* q,
                   float* dx, int32_t* bsum) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * xs;
    for (int64_t s = 0; s < supers; ++s) {
      const float* xb = xr + s * kSuper;
      float amax = 0.f;
      for (int64_t i = 0; i < kSuper; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      int8_t* qb = q + (r * supers + s) * kSuper;
      int32_t* sums = bsum + (r * supers + s) * kSub16;
      for (int64_t h = 0; h < kSub16; ++h) {
        int32_t total = 0;
        for (int64_t i = 16 * h; i < 16 * h + 16; ++i) {
          const int32_t v = static_cast<int32_t>(std::nearbyint(xb[i] * inv));
          qb[i] = static_cast<int8_t>(v);
          total += v;
        }
        sums[h] = total;
      }
      dx[r * supers + s] = amax / 127.f;
    }
  }
}

namespace {

// The 4-bit code (0..15) of column c at offset j (0..31) of a 128-byte sub-block.
inline int nibble_at(const uint8_t* sub, int c, int j) {
  const int quad = j / 4;
  const uint8_t byte = sub[(quad % 4) * 32 + c * 4 + j % 4];
  return quad < 4 ? byte & 15 : byte >> 4;
}

// Q6_K: the unsigned code u (0..63) of column c at offset j of sub-block b of a blob.
inline int q6_at(const uint8_t* blob, int b, int c, int j) {
  const int quad = j / 4;
  const uint8_t high = blob[1024 + b * 64 + (quad % 2) * 32 + c * 4 + j % 4];
  return nibble_at(blob + b * 128, c, j) | (((high >> (2 * (quad / 2))) & 3) << 4);
}

inline float q4_sc(const uint8_t* blob, int b, int c) { return blob[1024 + b * 8 + c]; }
inline float q4_m(const uint8_t* blob, int b, int c) { return blob[1088 + b * 8 + c]; }
inline int32_t q6_sc(const uint8_t* blob, int h, int c) {
  return static_cast<int8_t>(blob[1536 + h * 8 + c]);
}

// One row's accumulators for group g over every super-block (kquant.h's arithmetic).
void row_group(const Matrix& w, const Acts& a, int64_t r, int64_t g, float* acc) {
  const int8_t* xq = a.q + r * a.supers * kSuper;
  for (int64_t s = 0; s < w.supers; ++s) {
    const uint8_t* blob = w.at(g, s);
    const float* dd = w.d_at(g, s);
    const int8_t* xs = xq + s * kSuper;
    const int32_t* bs = a.bsum + (r * a.supers + s) * kSub16;
    const float dx = a.dx[r * a.supers + s];
    for (int c = 0; c < kGroup; ++c) {
      int32_t isum = 0, msum = 0;
      for (int b = 0; b < 8; ++b) {
        if (w.format == kQ4K) {
          int32_t dot = 0;
          for (int j = 0; j < 32; ++j) dot += nibble_at(blob + b * 128, c, j) * xs[32 * b + j];
          isum += blob[1024 + b * 8 + c] * dot;
          msum += blob[1088 + b * 8 + c] * (bs[2 * b] + bs[2 * b + 1]);
          continue;
        }
        for (int h = 0; h < 2; ++h) {
          int32_t dot = 0;
          for (int j = 16 * h; j < 16 * h + 16; ++j) dot += q6_at(blob, b, c, j) * xs[32 * b + j];
          isum += q6_sc(blob, 2 * b + h, c) * (dot - 32 * bs[2 * b + h]);
        }
      }
      acc[c] = std::fma(dd[c] * dx, static_cast<float>(isum), acc[c]);
      if (w.format == kQ4K) {
        acc[c] = std::fma(-(dd[kGroup + c] * dx), static_cast<float>(msum), acc[c]);
      }
    }
  }
}

void gemm_i8(const Matrix& w, const Acts& a, int64_t rows, int64_t g0, int64_t g1, float* y,
             int64_t ys, const float* bias) {
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t r = 0; r < rows; ++r) {
      float acc[kGroup] = {};
      row_group(w, a, r, g, acc);
      for (int c = 0; c < kGroup && g * kGroup + c < w.n; ++c) {
        y[r * ys + g * kGroup + c] = acc[c] + (bias ? bias[g * kGroup + c] : 0.f);
      }
    }
  }
}

}  // namespace

// Per 16-wide half of each sub-block: each column's scale (and min) once, then the codes, in
// loops over the 8 columns the compiler vectorises. The float steps are gguf's: scale = d * sc,
// w = scale * q - min (Q4_K, min = dmin * m) or scale * q (Q6_K).
void dequant_group(const Matrix& w, int64_t g, float* panel, int64_t stride) {
  float scale[kGroup], min[kGroup];
  for (int64_t s = 0; s < w.supers; ++s) {
    const uint8_t* blob = w.at(g, s);
    const float* dd = w.d_at(g, s);
    for (int b = 0; b < 8; ++b) {
      for (int half = 0; half < 2; ++half) {
        for (int c = 0; c < kGroup; ++c) {
          if (w.format == kQ4K) {
            scale[c] = dd[c] * q4_sc(blob, b, c);
            min[c] = dd[kGroup + c] * q4_m(blob, b, c);
          } else {
            scale[c] = dd[c] * static_cast<float>(q6_sc(blob, 2 * b + half, c));
          }
        }
        for (int q = 4 * half; q < 4 * half + 4; ++q) {  // the k-quads of this half
          const uint8_t* nib = blob + b * 128 + (q % 4) * 32;
          const uint8_t* high = blob + 1024 + b * 64 + (q % 2) * 32;
          for (int i = 0; i < 4; ++i) {
            float* out = panel + (s * kSuper + 32 * b + 4 * q + i) * stride;
            for (int c = 0; c < kGroup; ++c) {
              const uint8_t byte = nib[c * 4 + i];
              const int code = q < 4 ? byte & 15 : byte >> 4;
              if (w.format == kQ4K) {
                out[c] = scale[c] * static_cast<float>(code) - min[c];
              } else {
                const int u = code | (((high[c * 4 + i] >> (2 * (q / 2))) & 3) << 4);
                out[c] = scale[c] * static_cast<float>(u - 32);
              }
            }
          }
        }
      }
    }
  }
}

const Kernels& scalar_kernels() {
  static const Kernels table{"scalar", gemm_i8};
  return table;
}

}  // namespace kquant
}  // namespace pytgi
