// The AVX-512 VNNI table of quant.h's kernels: quant_i8_passes.h's int8-activation passes on
// vpdpbusd (ymm lanes, EVEX-encoded: AVX512VNNI + AVX512VL), the rest of the AVX2 table as is.
// This file is compiled under a GCC target pragma, so the extension still builds with -mavx2 alone
// and loads on CPUs without VNNI: quant_ops.cpp's select() hands this table out only when the
// CPU reports avx512vnni, avx512vl and avx512bw. Results equal the AVX2 table's bit for bit
// (quant_i8_passes.h says why). Building with -DPYTGI_NO_VNNI, with clang, or without AVX2
// compiles the table out (vnni_kernels() is null).
#include "quant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__GNUC__) && \
    !defined(__clang__) && !defined(PYTGI_NO_VNNI)
// Before the pragma: these headers' inline functions stay AVX2 code, the one copy every
// translation unit shares.
#include "quant_avx2.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni")
#include "quant_i8_passes.h"

namespace pytgi {
namespace quant {
namespace avx2 {
namespace {

// AVX-512 VNNI: vpdpbusd adds each lane's 4 u8 x s8 products into its int32, exactly.
struct VnniDot {
  static constexpr bool kOffsetCodes = true;  // dot() is exact for any unsigned bytes
  static __m256i dot(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
  // A 4-bit k-block's running sums: low and high nibbles in two int32 chains (twice the
  // independent vpdpbusd chains per row; their latency, not throughput, bounds a pass).
  struct Nibbles {
    __m256i lo, hi;
  };
  static Nibbles nibbles_zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
  static void nibbles_add(Nibbles& acc, __m256i lo, __m256i x_lo, __m256i hi, __m256i x_hi) {
    acc.lo = _mm256_dpbusd_epi32(acc.lo, lo, x_lo);
    acc.hi = _mm256_dpbusd_epi32(acc.hi, hi, x_hi);
    keep(acc.lo);
    keep(acc.hi);
  }
  static __m256i nibbles_sum(Nibbles acc) { return _mm256_add_epi32(acc.lo, acc.hi); }
};

void gemm_i8_vnni(const Matrix& w, const Acts& a, int64_t rows, int64_t g0, int64_t g1,
                  float* y, int64_t ys, const float* bias) {
  // 4- and 8-bit codes: pairs of groups on zmm (quant_vnni512.cpp); the rest here
  const int64_t done = vnni512_gemm_pairs(w, a, rows, g0, g1, y, ys, bias);
  if (done < g1) gemm_i8_with<VnniDot>(w, a, rows, done, g1, y, ys, bias);
}

}  // namespace
}  // namespace avx2
}  // namespace quant
}  // namespace pytgi

#pragma GCC pop_options

namespace pytgi {
namespace quant {

const Kernels* vnni_kernels() {
  const Kernels* avx2 = avx2_kernels();  // compiled under the same conditions: never null here
  static const Kernels table{"avx512_vnni", avx2->quantize_rows, avx2::gemm_i8_vnni,
                             avx2->gemm_f32, avx2->dequant_group};
  return &table;
}

}  // namespace quant
}  // namespace pytgi

#else

namespace pytgi {
namespace quant {
const Kernels* vnni_kernels() { return nullptr; }
}  // namespace quant
}  // namespace pytgi

#endif
