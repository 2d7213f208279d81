// The AVX2 (+FMA, F16C) table of quant.h's kernels, int8-activation half (the fp32 half is
// quant_avx2_f32.cpp). Results equal quant_scalar.cpp's bit for bit.
//
// One pass = up to 4 rows x one group of 8 columns, accumulators in registers: each 32-byte load
// of codes is a k-quad (or two, for 4-bit codes) of all 8 columns, and one broadcast 4-byte
// activation quad multiplies it, so each int32 lane accumulates one column's dot product with no
// horizontal reduction. Per 32-wide k-block the int32 sums become floats, times (weight scale x
// activation scale), plus (min x scaled activation sum) for affine codes.
//   8-bit codes: maddubs(|w|, sign(x, w)) then madd with ones (|w| <= 128, |x| <= 127: no
//                int16 saturation);
//   4-bit codes: the nibbles are unsigned, so maddubs(nibble, x) directly; 8 of them add up in
//                int16 (8 x 2 x 15 x 127 < 2^15) before one madd per block; symmetric codes
//                subtract 8 x sum(x) per block;
//   4-bit table codes: pshufb looks the nibbles up in the int8 table, then as 8-bit codes.
// The passes are quant_i8_passes.h's, on its MaddubsDot; quant_vnni_i8.cpp runs the same passes
// on vpdpbusd and reuses this file's quantize_rows.
#include "quant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "quant_avx2.h"
#include "quant_i8_passes.h"

namespace pytgi {
namespace quant {
namespace avx2 {
namespace {

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline int32_t hsum8_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

void quantize_rows(const float* x, int64_t xs, int64_t rows, int64_t k, int64_t kblocks,
                   int8_t* q, float* scale, int32_t* sum, float* scaled_sum) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  alignas(32) float tail[kKBlock];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < kblocks; ++b) {
      const int64_t k0 = b * kKBlock, n = std::max<int64_t>(0, std::min(kKBlock, k - k0));
      const float* src = x + r * xs + k0;
      if (n < kKBlock) {
        std::fill(tail, tail + kKBlock, 0.f);
        std::copy_n(src, n, tail);
        src = tail;
      }
      __m256 v[4];
      for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(src + 8 * i);
      const __m256 m = _mm256_max_ps(
          _mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
          _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
      const float amax = hmax8(m);
      const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      __m256i iv[4];
      for (int i = 0; i < 4; ++i) iv[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
      const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]),
                                                _mm256_packs_epi32(iv[2], iv[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + r * kblocks * kKBlock + k0),
                          _mm256_permutevar8x32_epi32(packed, order));
      const int32_t lo = hsum8_i32(_mm256_add_epi32(iv[0], iv[1]));
      const int32_t hi = hsum8_i32(_mm256_add_epi32(iv[2], iv[3]));
      const float s = amax / 127.f;
      scale[r * kblocks + b] = s;
      sum[r * kblocks + b] = lo + hi;
      float* ss = scaled_sum + kSums * (r * kblocks + b);
      ss[0] = s * static_cast<float>(lo + hi);
      ss[1] = s * static_cast<float>(lo);
      ss[2] = s * static_cast<float>(hi);
    }
  }
}

void gemm_i8(const Matrix& w, const Acts& a, int64_t rows, int64_t g0, int64_t g1, float* y,
             int64_t ys, const float* bias) {
  gemm_i8_with<MaddubsDot>(w, a, rows, g0, g1, y, ys, bias);
}

}  // namespace
}  // namespace avx2

const Kernels* avx2_kernels() {
  static const Kernels table{"avx2", avx2::quantize_rows, avx2::gemm_i8, avx2::gemm_f32,
                             avx2::dequant_group};
  return &table;
}

}  // namespace quant
}  // namespace pytgi

#else

namespace pytgi {
namespace quant {
const Kernels* avx2_kernels() { return nullptr; }
}  // namespace quant
}  // namespace pytgi

#endif
