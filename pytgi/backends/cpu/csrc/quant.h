// pytgi's quantized linear kernels: the packed weight layouts, the int8 activation rows, and the
// table of per-ISA kernels (one dispatch point, quant_ops.cpp's select(): scalar C++ always, AVX2
// where compiled and the CPU has it, AVX-512 VNNI above that; Arm tables plug in next to them).
//
// Weight layout (built by pytgi/backends/cpu/quant_layout.py, which documents it for Python):
// a logical [N, K] weight is cut into groups of 8 output columns (N padded with zero columns to a
// multiple of 16, so groups pair into the fp32 path's 16-column tiles) and blocks of 32 along K
// (K padded with zero codes). Each (group, k-block) holds its codes contiguously:
//   8-bit codes (kInt8: int8; kFp8: e4m3 bytes): 256 bytes = 8 k-quads x 8 columns x 4 k, i.e.
//       byte q*32 + c*4 + i is column c at k = 32*kb + 4*q + i: one 32-byte load is a k-quad
//       of all 8 columns, and one broadcast 4-byte activation quad feeds all 8;
//   4-bit codes (kInt4: 0..15, kLut4: table index): 128 bytes = 4 vectors of 32; byte
//       v*32 + c*4 + i holds column c at k-quad v in its low nibble and k-quad v + 4 in its high
//       nibble.
// Scales (and mins, for affine codes) are [groups, scale_rows, 8] float32 or float16, one row
// per scale block along K (16, 32 or 64 wide, or a single row per column).
//
// Values: kInt8 w = scale * code (+ min); kInt4 w = scale * (code - 8) without mins, scale *
// code + min with them; kLut4 w = scale * table[code]; kFp8 w = scale * e4m3(code).
#pragma once

#include <cstdint>
#include <cstring>

namespace pytgi {
namespace quant {

constexpr int64_t kGroup = 8;       // output columns per group: one int32 / float lane each
constexpr int64_t kKBlock = 32;     // k per block: the activation quantisation block
constexpr int64_t kPanelCols = 16;  // the fp32 path's panel: two groups
constexpr int64_t kRowsPerPass = 4; // activation rows one pass over a group's codes serves
constexpr int64_t kSums = 3;        // scaled sums per block: whole, first half, second half

enum Format : int { kInt8 = 0, kInt4 = 1, kLut4 = 2, kFp8 = 3 };

inline int64_t block_bytes(int format) {
  return format == kInt4 || format == kLut4 ? 128 : 256;
}

struct Matrix {
  int format;
  int64_t n, k;               // logical shape
  int64_t groups, kblocks;    // padded: groups * 8 >= n, kblocks * 32 >= k
  const uint8_t* codes;       // [groups, kblocks, block_bytes]
  const void* scales;         // [groups, scale_rows, 8]
  const void* mins;           // same, or null (symmetric codes)
  bool half_scales;           // float16 scales and mins, else float32
  int64_t scale_block;        // 16, 32, 64, or 0 (one scale per column)
  int64_t scale_rows;
  float table[16];            // kLut4: code values
  int8_t table_i8[16];        // kLut4: round(127 * table) for int8 activations

  // The scale row of k-block kb (sub = 0, 1: its two 16-wide halves when scale_block == 16).
  int64_t scale_row(int64_t kb, int sub = 0) const {
    switch (scale_block) {
      case 16: return 2 * kb + sub;
      case 32: return kb;
      case 64: return kb / 2;
      default: return 0;
    }
  }
  const uint8_t* block(int64_t g, int64_t kb) const {
    return codes + (g * kblocks + kb) * block_bytes(format);
  }
};

// Activations quantised to int8 per row and 32-wide block: x ~= scale[b] * q[32 b + i], with
// q = round(x * 127 / max|x| over the block) (ties to even); sum[b] = the block's sum of q and
// scaled_sum[3 b] = scale[b] * sum[b] and scaled_sum[3 b + 1 + h] = scale[b] * (the sum of q over
// 16-wide half h of the block): what mins (per 32 / per 16) multiply.
struct Acts {
  const int8_t* q;            // [rows, kblocks * 32]
  const float* scale;         // [rows, kblocks]
  const int32_t* sum;         // [rows, kblocks]
  const float* scaled_sum;    // [rows, 3 * kblocks]
  int64_t kblocks;
};

// One ISA's kernels. With int8 activations every table computes bit-for-bit the same floats
// (integer dot products are exact, the float epilogues run the same operations in the same
// order); with fp32 activations they agree to fp32 rounding (sums in different orders), and
// dequant_group is exact everywhere.
struct Kernels {
  const char* name;
  // x rows [rows, k] (row stride xs) -> Acts arrays (row strides kblocks * 32, kblocks and
  // 3 kblocks)
  void (*quantize_rows)(const float* x, int64_t xs, int64_t rows, int64_t k, int64_t kblocks,
                        int8_t* q, float* scale, int32_t* sum, float* scaled_sum);
  // y[r, 8 g + c] (+ bias) for rows [0, rows) and groups [g0, g1), int8 activations; columns
  // past n are not written.
  void (*gemm_i8)(const Matrix& w, const Acts& a, int64_t rows, int64_t g0, int64_t g1,
                  float* y, int64_t ys, const float* bias);
  // The same with fp32 activations, the weights dequantised in registers (small M): x rows
  // [rows, kblocks * 32] (row stride xs, zero past k).
  void (*gemm_f32)(const Matrix& w, const float* x, int64_t xs, int64_t rows, int64_t g0,
                   int64_t g1, float* y, int64_t ys, const float* bias);
  // group g's dequantised weights as fp32 panel rows: panel[k * stride + c] for k < kblocks * 32.
  void (*dequant_group)(const Matrix& w, int64_t g, float* panel, int64_t stride);
};

const Kernels& scalar_kernels();
const Kernels* avx2_kernels();  // null when this build has no AVX2 code
const Kernels* vnni_kernels();  // AVX2 + vpdpbusd int8 passes; null when not compiled in

// The AVX-512 VNNI table's zmm passes (quant_vnni512.cpp): gemm_i8 over the pairs of groups in
// [g0, g1) for 4-bit and 8-bit codes; returns the first group it left (g1, or g1 - 1 for an odd
// count; g0 for a format it leaves to the ymm passes, or when compiled out).
int64_t vnni512_gemm_pairs(const Matrix& w, const Acts& a, int64_t rows, int64_t g0, int64_t g1,
                           float* y, int64_t ys, const float* bias);

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: normalise
    int e = -1;
    uint32_t m = mant;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400) == 0);
    bits = sign | ((112 - e) << 23) | ((m & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// e4m3fn (bias 7, no infinities; 0x7f / 0xff are NaN, never produced by pytgi's quantiser).
inline float e4m3_to_float(uint8_t b) {
  const int exp = (b >> 3) & 0xf, mant = b & 7;
  float v = exp == 0 ? mant * 0.001953125f  // 2^-9
                     : (1.f + mant * 0.125f) * static_cast<float>(1 << exp) * 0.0078125f;
  return (b & 0x80) ? -v : v;
}

// The 8 scales (or mins) of group g at scale row s, as floats.
inline void load_scales8(const void* base, bool half, int64_t rows, int64_t g, int64_t s,
                         float* out) {
  const int64_t offset = (g * rows + s) * kGroup;
  if (half) {
    const uint16_t* h = static_cast<const uint16_t*>(base) + offset;
    for (int c = 0; c < kGroup; ++c) out[c] = half_to_float(h[c]);
  } else {
    std::memcpy(out, static_cast<const float*>(base) + offset, kGroup * sizeof(float));
  }
}

}  // namespace quant
}  // namespace pytgi
