// The AVX-512 VNNI table of the K-quant kernels: kquant_passes.h over zmm traits, two
// neighbouring groups (16 columns) per pass, so each broadcast activation quad and each vpdpbusd
// serves 16 output columns. Compiled under a GCC target pragma like quant_vnni512.cpp; the
// platform selects it only on a CPU with AVX-512 VNNI, VL and BW (quant_ops.cpp's select).
#include "kquant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(PYTGI_NO_VNNI)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni")

#include <immintrin.h>

#include "kquant_passes.h"

namespace pytgi {
namespace kquant {
namespace {

struct Vnni512 {
  using V = __m512i;
  using F = __m512;
  static constexpr int kCols = 16;
  static V zero() { return _mm512_setzero_si512(); }
  static F zero_f() { return _mm512_setzero_ps(); }
  static V load(const uint8_t* a, const uint8_t* b) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  static V low4(V v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
  static V high4(V v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
  static V bits2(V v, int shift) {
    return _mm512_and_si512(_mm512_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm512_set1_epi8(3));
  }
  static V shl4(V v) { return _mm512_slli_epi16(v, 4); }
  static V or_(V a, V b) { return _mm512_or_si512(a, b); }
  static V set1(int32_t x) { return _mm512_set1_epi32(x); }
  static V add(V a, V b) { return _mm512_add_epi32(a, b); }
  static V sub(V a, V b) { return _mm512_sub_epi32(a, b); }
  static __m128i bytes16(const uint8_t* a, const uint8_t* b) {
    return _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
  }
  // a sub-block's 16 column scales as int32: vpdpbusd sums a sub-block unscaled, one vpmulld
  // then scales it
  using S = __m512i;
  static S scales_u8(const uint8_t* a, const uint8_t* b) { return _mm512_cvtepu8_epi32(bytes16(a, b)); }
  static S scales_i8(const uint8_t* a, const uint8_t* b) { return _mm512_cvtepi8_epi32(bytes16(a, b)); }
  using P = __m512i;
  static constexpr int kQ6Flush = 4;  // int32 partial sums: one flush per 16-wide sub-block
  static P pacc(P p, V u, V s) { return _mm512_dpbusd_epi32(p, u, s); }
  static V flush(V isum, P p, S sc) { return _mm512_add_epi32(isum, _mm512_mullo_epi32(p, sc)); }
  static V scaled(S sc, int32_t x) { return _mm512_mullo_epi32(sc, _mm512_set1_epi32(x)); }
  static V shl32_5(V v) { return _mm512_slli_epi32(v, 5); }
  static F load_f(const float* a, const float* b) {
    const __m256i lo = _mm256_castps_si256(_mm256_loadu_ps(a));
    const __m256i hi = _mm256_castps_si256(_mm256_loadu_ps(b));
    return _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
  }
  static F set1_f(float x) { return _mm512_set1_ps(x); }
  static F cvt(V v) { return _mm512_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F neg(F a) {
    return _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(static_cast<int>(0x80000000u))));
  }
  static void store_f(float* out, F v) { _mm512_store_ps(out, v); }
};

}  // namespace

const Kernels* vnni512_kernels() {
  static const Kernels table{"avx512_vnni", passes::gemm_i8<Vnni512>};
  return &table;
}

}  // namespace kquant
}  // namespace pytgi

#pragma GCC pop_options

#else

namespace pytgi {
namespace kquant {
const Kernels* vnni512_kernels() { return nullptr; }
}  // namespace kquant
}  // namespace pytgi

#endif
