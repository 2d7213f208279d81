// The zmm passes of the AVX-512 VNNI table: int8 activations times 4-bit codes (kInt4, symmetric
// or affine) or 8-bit codes (kInt8 with one scale per 32, 64 or column; affine or not) on zmm
// vpdpbusd, two 8-column groups at once. Other formats keep the ymm passes.
//
// The packed layout (quant.h) already interleaves the rows of a weight for this: each 32-byte
// vector of a group's k-block holds one k-quad of 8 output columns (what llama.cpp builds at load
// when it repacks Q4_0 into 8-row blocks), so a broadcast activation quad multiplies 8 columns
// with no horizontal sums. The ymm passes (quant_i8_passes.h) do one group (8 columns) per pass;
// here one zmm register holds the same k-quad of two neighbouring groups (16 columns), so each
// broadcast activation quad, each vpdpbusd and each float epilogue serves twice the columns.
// That is what a batch (16 clients) or a prefill chunk needs, where the pass is compute bound.
// 8-bit codes run as unsigned bytes w + 128 (as VnniDot in quant_vnni_i8.cpp), their chain
// started at -128 x sum(x).
//
// Results equal the ymm passes' (and quant_scalar.cpp's) bit for bit: the integer dot products
// are exact whatever the grouping (the symmetric offset, -8 x sum(x), starts the low-nibble
// chain instead of being subtracted after it: the same integer), and the float epilogue of each
// column runs the same operations in the same order (cvt, scale_w x scale_x, fma; the mins' fma;
// + bias, or + 0 without one). Compiled under a GCC target pragma like quant_vnni_i8.cpp.
#include "quant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__GNUC__) && \
    !defined(__clang__) && !defined(PYTGI_NO_VNNI)
#include "quant_avx2.h"  // before the pragma: its inline helpers stay AVX2 code

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni")

#include <immintrin.h>

namespace pytgi {
namespace quant {
namespace vnni512 {
namespace {

constexpr int kMaxRows = 4;  // rows per pass: 3 zmm accumulators each (low, high, float)

inline void keep(__m512i& v) { asm("" : "+v"(v)); }

// The 16 scales (or mins) of groups g and g + 1 at scale row `row`.
template <bool HALF>
inline __m512 load_pair_row(const uint8_t* g0, const uint8_t* g1, int64_t row) {
  if constexpr (HALF) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g0 + row * 16));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g1 + row * 16));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1));
  } else {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g0 + row * 32));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g1 + row * 32));
    return _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
  }
}

inline __m512i quad512(const int8_t* xq, int64_t k) {
  int32_t v;
  std::memcpy(&v, xq + k, 4);
  return _mm512_set1_epi32(v);
}

struct Rows {
  const int8_t* q[kMaxRows];
  const float* scale[kMaxRows];
  const int32_t* sum[kMaxRows];
  const float* scaled_sum[kMaxRows];
};

// Groups g, g + 1 (views a, b) x R rows -> out[r] = 16 columns' sums (before the bias).
template <int R, bool HALF, bool MINS>
void int4_pair_pass(const avx2::GroupView& a, const avx2::GroupView& b, const Rows& x,
                    __m512* out) {
  const int64_t kblocks = a.kblocks, mul = a.row_mul, shift = a.row_shift;
  const __m512i low = _mm512_set1_epi8(0x0f);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    const uint8_t *c0 = a.codes + kb * 128, *c1 = b.codes + kb * 128;
    if constexpr (R <= 2) {
      for (int64_t line = 0; line < 128; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(c0 + avx2::kPrefetchBytes + line), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(c1 + avx2::kPrefetchBytes + line), _MM_HINT_T0);
      }
    }
    __m512i lo_acc[R], hi_acc[R];
    for (int r = 0; r < R; ++r) {
      // symmetric codes: sum (code - 8) x = sum code x - 8 sum x; the offset starts the chain
      lo_acc[r] = MINS ? _mm512_setzero_si512() : _mm512_set1_epi32(-8 * x.sum[r][kb]);
      hi_acc[r] = _mm512_setzero_si512();
    }
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c0 + v * 32));
      const __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c1 + v * 32));
      const __m512i codes = _mm512_inserti64x4(_mm512_castsi256_si512(va), vb, 1);
      const __m512i lo = _mm512_and_si512(codes, low);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), low);
      for (int r = 0; r < R; ++r) {
        const int64_t k = kb * kKBlock + v * 4;
        lo_acc[r] = _mm512_dpbusd_epi32(lo_acc[r], lo, quad512(x.q[r], k));
        hi_acc[r] = _mm512_dpbusd_epi32(hi_acc[r], hi, quad512(x.q[r], k + 16));
        keep(lo_acc[r]);
        keep(hi_acc[r]);
      }
    }
    const int64_t row = (kb * mul) >> shift;
    const __m512 ws = load_pair_row<HALF>(a.scales, b.scales, row);
    for (int r = 0; r < R; ++r) {
      const __m512i d = _mm512_add_epi32(lo_acc[r], hi_acc[r]);
      const __m512 dx = _mm512_set1_ps(x.scale[r][kb]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(ws, dx), acc[r]);
      if constexpr (MINS) {
        const __m512 wm = load_pair_row<HALF>(a.mins, b.mins, row);
        acc[r] = _mm512_fmadd_ps(wm, _mm512_set1_ps(x.scaled_sum[r][kSums * kb]), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

// 8-bit codes, one scale row per block (not the 16-wide halves): (w + 128) x, two chains per row
// (even and odd k-quads) to hide vpdpbusd's latency.
template <int R, bool HALF, bool MINS>
void int8_pair_pass(const avx2::GroupView& a, const avx2::GroupView& b, const Rows& x,
                    __m512* out) {
  const int64_t kblocks = a.kblocks, mul = a.row_mul, shift = a.row_shift;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    const uint8_t *c0 = a.codes + kb * 256, *c1 = b.codes + kb * 256;
    if constexpr (R <= 2) {
      for (int64_t line = 0; line < 256; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(c0 + avx2::kPrefetchBytes + line), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(c1 + avx2::kPrefetchBytes + line), _MM_HINT_T0);
      }
    }
    __m512i even[R], odd[R];
    for (int r = 0; r < R; ++r) {
      even[r] = _mm512_set1_epi32(-128 * x.sum[r][kb]);
      odd[r] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int qd = 0; qd < 8; ++qd) {
      const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c0 + qd * 32));
      const __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c1 + qd * 32));
      const __m512i codes =
          _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(va), vb, 1), flip);
      for (int r = 0; r < R; ++r) {
        const __m512i xq = quad512(x.q[r], kb * kKBlock + qd * 4);
        if (qd % 2 == 0) {
          even[r] = _mm512_dpbusd_epi32(even[r], codes, xq);
          keep(even[r]);
        } else {
          odd[r] = _mm512_dpbusd_epi32(odd[r], codes, xq);
          keep(odd[r]);
        }
      }
    }
    const int64_t row = (kb * mul) >> shift;
    const __m512 ws = load_pair_row<HALF>(a.scales, b.scales, row);
    for (int r = 0; r < R; ++r) {
      const __m512i d = _mm512_add_epi32(even[r], odd[r]);
      const __m512 dx = _mm512_set1_ps(x.scale[r][kb]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(ws, dx), acc[r]);
      if constexpr (MINS) {
        const __m512 wm = load_pair_row<HALF>(a.mins, b.mins, row);
        acc[r] = _mm512_fmadd_ps(wm, _mm512_set1_ps(x.scaled_sum[r][kSums * kb]), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

using PairPass = void (*)(const avx2::GroupView&, const avx2::GroupView&, const Rows&, __m512*);

// The pass for w's format, or null where the ymm passes stay (table codes, fp8, 16-wide scales).
template <int R>
PairPass pick(const Matrix& w) {
  const bool mins = w.mins != nullptr, half = w.half_scales;
  if (w.format == kInt4) {
    if (half) return mins ? int4_pair_pass<R, true, true> : int4_pair_pass<R, true, false>;
    return mins ? int4_pair_pass<R, false, true> : int4_pair_pass<R, false, false>;
  }
  if (w.format != kInt8 || w.scale_block == 16) return nullptr;
  if (half) return mins ? int8_pair_pass<R, true, true> : int8_pair_pass<R, true, false>;
  return mins ? int8_pair_pass<R, false, true> : int8_pair_pass<R, false, false>;
}

// acc[r] (+ bias, or + 0: the ymm passes' store adds a zero vector too) -> y's 16 columns from
// c0, those below n only.
void store_pair(const __m512* acc, int rows, float* y, int64_t ys, int64_t c0, int64_t n,
                const float* bias) {
  const int64_t width = std::min<int64_t>(2 * kGroup, n - c0);
  const __mmask16 mask = static_cast<__mmask16>((1u << width) - 1);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + c0) : _mm512_setzero_ps();
  for (int r = 0; r < rows; ++r) {
    _mm512_mask_storeu_ps(y + r * ys + c0, mask, _mm512_add_ps(acc[r], b));
  }
}

}  // namespace
}  // namespace vnni512

int64_t vnni512_gemm_pairs(const Matrix& w, const Acts& a, int64_t rows, int64_t g0,
                           int64_t g1, float* y, int64_t ys, const float* bias) {
  using namespace vnni512;
  const PairPass passes[kMaxRows] = {pick<1>(w), pick<2>(w), pick<3>(w), pick<4>(w)};
  if (passes[0] == nullptr) return g0;
  const int64_t kbn = a.kblocks, end = g0 + (g1 - g0) / 2 * 2;
  for (int64_t g = g0; g < end; g += 2) {
    const avx2::GroupView va = avx2::view_of(w, g), vb = avx2::view_of(w, g + 1);
    for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
      const int n = static_cast<int>(std::min<int64_t>(kMaxRows, rows - r0));
      Rows x;
      for (int r = 0; r < n; ++r) {
        x.q[r] = a.q + (r0 + r) * kbn * kKBlock;
        x.scale[r] = a.scale + (r0 + r) * kbn;
        x.sum[r] = a.sum + (r0 + r) * kbn;
        x.scaled_sum[r] = a.scaled_sum + (r0 + r) * kbn * kSums;
      }
      __m512 acc[kMaxRows];
      passes[n - 1](va, vb, x, acc);
      store_pair(acc, n, y + r0 * ys, ys, g * kGroup, w.n, bias);
    }
  }
  return end;
}

}  // namespace quant
}  // namespace pytgi

#pragma GCC pop_options

#else

namespace pytgi {
namespace quant {
int64_t vnni512_gemm_pairs(const Matrix&, const Acts&, int64_t, int64_t g0, int64_t, float*,
                           int64_t, const float*) {
  return g0;
}
}  // namespace quant
}  // namespace pytgi

#endif
