// The AVX2 table of the K-quant kernels: kquant_passes.h over ymm traits, one group (8 columns)
// per pass, the byte dot products as maddubs (exact: codes <= 63, activations within +-127, so no
// int16 pair sum saturates), summed in int16 (8 per lane for Q4_K: <= 30480; 2 for Q6_K:
// <= 32004) before one madd by the sub-block's scales.
#include "kquant.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "kquant_passes.h"

namespace pytgi {
namespace kquant {
namespace {

struct Avx2 {
  using V = __m256i;
  using F = __m256;
  static constexpr int kCols = 8;
  static V zero() { return _mm256_setzero_si256(); }
  static F zero_f() { return _mm256_setzero_ps(); }
  static V load(const uint8_t* a, const uint8_t*) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  }
  static V low4(V v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
  static V high4(V v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
  static V bits2(V v, int shift) {
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(3));
  }
  static V shl4(V v) { return _mm256_slli_epi16(v, 4); }
  static V or_(V a, V b) { return _mm256_or_si256(a, b); }
  // A sub-block's 8 column scales as int16 pairs (sc, sc) per 32-bit lane: madd multiplies the
  // two int16 pair sums of maddubs by the scale and adds them (|pair| <= 2 * 63 * 127 = 16002,
  // |sc| <= 128: no overflow).
  using S = __m256i;
  static S pairs(V v32) {
    const V low = _mm256_and_si256(v32, _mm256_set1_epi32(0xFFFF));
    return _mm256_or_si256(low, _mm256_slli_epi32(low, 16));
  }
  static S scales_u8(const uint8_t* a, const uint8_t*) {
    return pairs(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a))));
  }
  static S scales_i8(const uint8_t* a, const uint8_t*) {
    return pairs(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a))));
  }
  // partial sums in int16 pairs: maddubs, then one madd by the scales per flush
  using P = __m256i;
  static constexpr int kQ6Flush = 2;
  static P pacc(P p, V u, V s) { return _mm256_add_epi16(p, _mm256_maddubs_epi16(u, s)); }
  static V flush(V isum, P p, S sc) { return _mm256_add_epi32(isum, _mm256_madd_epi16(p, sc)); }
  // sc * x per lane: madd of (sc, sc) with (x, 0)
  static V scaled(S sc, int32_t x) { return _mm256_madd_epi16(sc, _mm256_set1_epi32(x & 0xFFFF)); }
  static V shl32_5(V v) { return _mm256_slli_epi32(v, 5); }
  static V set1(int32_t x) { return _mm256_set1_epi32(x); }
  static V add(V a, V b) { return _mm256_add_epi32(a, b); }
  static V sub(V a, V b) { return _mm256_sub_epi32(a, b); }
  static F load_f(const float* a, const float*) { return _mm256_loadu_ps(a); }
  static F set1_f(float x) { return _mm256_set1_ps(x); }
  static F cvt(V v) { return _mm256_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F neg(F a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.f)); }
  static void store_f(float* out, F v) { _mm256_store_ps(out, v); }
};

}  // namespace

const Kernels* avx2_kernels() {
  static const Kernels table{"avx2", passes::gemm_i8<Avx2>};
  return &table;
}

}  // namespace kquant
}  // namespace pytgi

#else

namespace pytgi {
namespace kquant {
const Kernels* avx2_kernels() { return nullptr; }
}  // namespace kquant
}  // namespace pytgi

#endif
