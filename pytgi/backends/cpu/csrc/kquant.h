// pytgi's native K-quant kernels: GGUF Q4_K and Q6_K weights kept in their 256-value super-block
// structure (repacked at load by pytgi/backends/cpu/kquant_layout.py, which documents the layout
// for Python), multiplied with int8 activations quantised per row and 256-wide block (as
// llama.cpp's q8_K), or dequantised exactly into fp32 panels for fp32 activations.
//
// Layout: a logical [N, K] weight (K a multiple of 256) is cut into groups of 8 output columns
// (N padded with zero columns to a multiple of 16, so groups pair) and super-blocks of 256 along
// K. Each (group, super-block) holds one contiguous blob:
//   Q4_K (1152 bytes): 8 sub-blocks x 128 bytes of nibbles in quant.h's 4-bit layout (byte
//       v*32 + c*4 + i of sub-block b: column c at k = 32 b + 4 v + i in its low nibble, at
//       k = 32 b + 16 + 4 v + i in its high nibble), then the 6-bit scales sc[b][c] (64 bytes,
//       uint8), then the 6-bit mins m[b][c] (64 bytes);
//   Q6_K (1664 bytes): 8 sub-blocks x 128 bytes of the low nibbles of u = q + 32 (0..63) in the
//       same 4-bit layout, 8 sub-blocks x 64 bytes of the 2 high bits (byte j*32 + c*4 + i of
//       sub-block b, bits 2t..2t+1: column c at k-quad j + 2t, offset i), then the int8 scales
//       sc[h][c] of the 16 16-wide sub-blocks h (128 bytes).
// and d[g, s] float32 [groups, super-blocks, 2, 8]: row 0 the super-block scale d of each column,
// row 1 dmin (Q4_K; zero for Q6_K), both the fp16 values of the file widened exactly.
//
// Values (bit for bit gguf's dequantize): Q4_K w = (d * sc) * q - dmin * m (the product is exact,
// one rounding); Q6_K w = (d * sc) * (u - 32).
//
// Int8 activations: x ~= dx[s] * q[256 s + i], q = round(x * 127 / max|x| over the super-block)
// (ties to even), bsum[16 s + h] = the sum of q over its 16-wide sub-block h. Per row, column and
// super-block, with exact int32 sums:
//   Q4_K: isum = sum_b sc[b] * dot_b(q4, q), msum = sum_b m[b] * (bsum[2b] + bsum[2b+1]);
//         acc = fma(d * dx, isum, acc); acc = fma(-(dmin * dx), msum, acc)
//   Q6_K: isum = sum_h sc[h] * (dot_h(u, q) - 32 * bsum[h]); acc = fma(d * dx, isum, acc)
// then y = acc + bias (or + 0). Every table runs exactly these float operations in this order,
// so every table gives the same bits, and a row's result never depends on its neighbours.
#pragma once

#include <cstdint>
#include <cstring>

namespace pytgi {
namespace kquant {

constexpr int64_t kGroup = 8;    // output columns per group
constexpr int64_t kSuper = 256;  // k per super-block: the activation quantisation block
constexpr int64_t kSub16 = 16;   // 16-wide sums per super-block (bsum)
constexpr int64_t kRowsPerPass = 4;

enum Format : int { kQ4K = 4, kQ6K = 5 };  // after quant.h's formats 0..3

inline int64_t blob_bytes(int format) { return format == kQ4K ? 1152 : 1664; }

struct Matrix {
  int format;
  int64_t n, k;            // logical shape
  int64_t groups, supers;  // groups * 8 >= n (even), supers * 256 == k
  const uint8_t* blob;     // [groups, supers, blob_bytes]
  const float* d;          // [groups, supers, 2, 8]

  const uint8_t* at(int64_t g, int64_t s) const {
    return blob + (g * supers + s) * blob_bytes(format);
  }
  const float* d_at(int64_t g, int64_t s) const { return d + (g * supers + s) * 2 * kGroup; }
};

struct Acts {
  const int8_t* q;      // [rows, supers * 256]
  const float* dx;      // [rows, supers]
  const int32_t* bsum;  // [rows, supers * 16]
  int64_t supers;
};

// Shared by every table (its float steps are fixed here once): x rows [rows, k] (row stride
// xs) -> Acts arrays with row strides supers * 256, supers and supers * 16.
void quantize_rows(const float* x, int64_t xs, int64_t rows, int64_t supers, int8_t* q,
                   float* dx, int32_t* bsum);

// Group g's exact weights as fp32 panel rows: panel[k * stride + c], k < K (every table).
void dequant_group(const Matrix& w, int64_t g, float* panel, int64_t stride);

struct Kernels {
  const char* name;
  // y[r, 8 g + c] (+ bias) for rows [0, rows) and groups [g0, g1) (g0 and g1 even); columns past
  // n are not written.
  void (*gemm_i8)(const Matrix& w, const Acts& a, int64_t rows, int64_t g0, int64_t g1,
                  float* y, int64_t ys, const float* bias);
};

const Kernels& scalar_kernels();
const Kernels* avx2_kernels();    // null when this build has no AVX2 code
const Kernels* vnni512_kernels();  // null when not compiled in

// The int8 activation quad at k of row xq, as one int32 (what a vpdpbusd lane multiplies).
inline int32_t quad_at(const int8_t* xq, int64_t k) {
  int32_t v;
  std::memcpy(&v, xq + k, 4);
  return v;
}

}  // namespace kquant
}  // namespace pytgi
