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
#include "quant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "quant_avx2.h"

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

// Broadcast of the 4 activation bytes at xq + k (k % 4 == 0).
inline __m256i quad(const int8_t* xq, int64_t k) {
  int32_t v;
  std::memcpy(&v, xq + k, 4);
  return _mm256_set1_epi32(v);
}

// The per-pass row pointers of R activation rows.
struct RowActs {
  const int8_t* q[kRowsPerPass];
  const float *scale[kRowsPerPass], *scaled_sum[kRowsPerPass];
  const int32_t* sum[kRowsPerPass];
};

// ---- int8 codes (optionally affine, or two 16-wide scale halves per block) ---------------------
template <int R, bool HALF, bool MINS, bool SUB16>
void int8_pass(const GroupView& gv, const RowActs& a, __m256* out) {
  const uint8_t *codes = gv.codes, *scales = gv.scales, *mins = gv.mins;
  const int64_t kblocks = gv.kblocks, mul = gv.row_mul, shift = gv.row_shift;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    const uint8_t* blk = codes + kb * 256;
    prefetch_ahead<R, 256>(blk);
    __m256i d0[R], d1[R];
    for (int r = 0; r < R; ++r) d0[r] = d1[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int qd = 0; qd < 8; ++qd) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + qd * 32));
      const __m256i aw = _mm256_abs_epi8(wv);
      for (int r = 0; r < R; ++r) {
        const __m256i xs = _mm256_sign_epi8(quad(a.q[r], kb * kKBlock + qd * 4), wv);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), ones);
        if (SUB16 && qd >= 4) {
          d1[r] = _mm256_add_epi32(d1[r], p);
          keep(d1[r]);
        } else {
          d0[r] = _mm256_add_epi32(d0[r], p);
          keep(d0[r]);
        }
      }
    }
    const int64_t row = (kb * mul) >> shift;
    const __m256 ws0 = load_row<HALF>(scales, row);
    for (int r = 0; r < R; ++r) {
      const __m256 dx = _mm256_set1_ps(a.scale[r][kb]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0[r]), _mm256_mul_ps(ws0, dx), acc[r]);
      const float* ss = a.scaled_sum[r] + kSums * kb;
      if constexpr (SUB16) {
        const __m256 ws1 = load_row<HALF>(scales, row + 1);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1[r]), _mm256_mul_ps(ws1, dx), acc[r]);
        if constexpr (MINS) {
          acc[r] = _mm256_fmadd_ps(load_row<HALF>(mins, row), _mm256_set1_ps(ss[1]), acc[r]);
          acc[r] = _mm256_fmadd_ps(load_row<HALF>(mins, row + 1), _mm256_set1_ps(ss[2]), acc[r]);
        }
      } else if constexpr (MINS) {
        acc[r] = _mm256_fmadd_ps(load_row<HALF>(mins, row), _mm256_set1_ps(ss[0]), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

// ---- 4-bit linear codes: symmetric (code - 8) or affine (mins) ---------------------------------
template <int R, bool HALF, bool MINS>
void int4_pass(const GroupView& gv, const RowActs& a, __m256* out) {
  const uint8_t *codes = gv.codes, *scales = gv.scales, *mins = gv.mins;
  const int64_t kblocks = gv.kblocks, mul = gv.row_mul, shift = gv.row_shift;
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0f);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    const uint8_t* blk = codes + kb * 128;
    prefetch_ahead<R, 128>(blk);
    __m256i s16[R];
    for (int r = 0; r < R; ++r) s16[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + v * 32));
      const __m256i lo = _mm256_and_si256(b, low);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
      for (int r = 0; r < R; ++r) {
        const int64_t k = kb * kKBlock + v * 4;
        const __m256i p0 = _mm256_maddubs_epi16(lo, quad(a.q[r], k));
        const __m256i p1 = _mm256_maddubs_epi16(hi, quad(a.q[r], k + 16));
        s16[r] = _mm256_add_epi16(s16[r], _mm256_add_epi16(p0, p1));
        keep(s16[r]);
      }
    }
    const int64_t row = (kb * mul) >> shift;
    const __m256 ws = load_row<HALF>(scales, row);
    for (int r = 0; r < R; ++r) {
      __m256i d = _mm256_madd_epi16(s16[r], ones);
      if constexpr (!MINS) d = _mm256_sub_epi32(d, _mm256_set1_epi32(8 * a.sum[r][kb]));
      const __m256 dx = _mm256_set1_ps(a.scale[r][kb]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(ws, dx), acc[r]);
      if constexpr (MINS) {
        const __m256 wm = load_row<HALF>(mins, row);
        acc[r] = _mm256_fmadd_ps(wm, _mm256_set1_ps(a.scaled_sum[r][kSums * kb]), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

// ---- 4-bit table codes (NF4, FP4): the int8 table via pshufb --------------------------------
template <int R, bool HALF>
void lut4_pass(const GroupView& gv, const __m256i table, const RowActs& a, __m256* out) {
  const uint8_t *codes = gv.codes, *scales = gv.scales;
  const int64_t kblocks = gv.kblocks, mul = gv.row_mul, shift = gv.row_shift;
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0f);
  const __m256 inv127 = _mm256_set1_ps(1.f / 127.f);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    const uint8_t* blk = codes + kb * 128;
    prefetch_ahead<R, 128>(blk);
    __m256i d[R];
    for (int r = 0; r < R; ++r) d[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + v * 32));
      const __m256i t0 = _mm256_shuffle_epi8(table, _mm256_and_si256(b, low));
      const __m256i t1 =
          _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(b, 4), low));
      const __m256i a0 = _mm256_abs_epi8(t0), a1 = _mm256_abs_epi8(t1);
      for (int r = 0; r < R; ++r) {
        const int64_t k = kb * kKBlock + v * 4;
        const __m256i p0 = _mm256_maddubs_epi16(a0, _mm256_sign_epi8(quad(a.q[r], k), t0));
        const __m256i p1 = _mm256_maddubs_epi16(a1, _mm256_sign_epi8(quad(a.q[r], k + 16), t1));
        d[r] = _mm256_add_epi32(d[r], _mm256_add_epi32(_mm256_madd_epi16(p0, ones),
                                                       _mm256_madd_epi16(p1, ones)));
        keep(d[r]);
      }
    }
    const __m256 ws = load_row<HALF>(scales, (kb * mul) >> shift);
    for (int r = 0; r < R; ++r) {
      const __m256 s = _mm256_mul_ps(_mm256_mul_ps(ws, _mm256_set1_ps(a.scale[r][kb])), inv127);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[r]), s, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

template <int R, bool HALF>
void lut4_pass_of(const Matrix& w, const GroupView& gv, const RowActs& a, __m256* out) {
  const __m256i table = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.table_i8)));
  lut4_pass<R, HALF>(gv, table, a, out);
}

template <int R, bool HALF, bool MINS, bool SUB16>
void int8_pass_of(const Matrix&, const GroupView& gv, const RowActs& a, __m256* out) {
  int8_pass<R, HALF, MINS, SUB16>(gv, a, out);
}

template <int R, bool HALF, bool MINS>
void int4_pass_of(const Matrix&, const GroupView& gv, const RowActs& a, __m256* out) {
  int4_pass<R, HALF, MINS>(gv, a, out);
}

using PassFn = void (*)(const Matrix&, const GroupView&, const RowActs&, __m256*);

template <int R, bool HALF>
PassFn pick_pass(const Matrix& w) {
  const bool mins = w.mins != nullptr;
  switch (w.format) {
    case kInt8:
      if (w.scale_block == 16) {
        return mins ? int8_pass_of<R, HALF, true, true> : int8_pass_of<R, HALF, false, true>;
      }
      return mins ? int8_pass_of<R, HALF, true, false> : int8_pass_of<R, HALF, false, false>;
    case kInt4:
      return mins ? int4_pass_of<R, HALF, true> : int4_pass_of<R, HALF, false>;
    default:
      return lut4_pass_of<R, HALF>;
  }
}

template <int R>
PassFn pick(const Matrix& w) {
  return w.half_scales ? pick_pass<R, true>(w) : pick_pass<R, false>(w);
}

void gemm_i8(const Matrix& w, const Acts& a, int64_t rows, int64_t g0, int64_t g1, float* y,
             int64_t ys, const float* bias) {
  const PassFn passes[kRowsPerPass] = {pick<1>(w), pick<2>(w), pick<3>(w), pick<4>(w)};
  const int64_t kbn = a.kblocks;
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t r0 = 0; r0 < rows; r0 += kRowsPerPass) {
      const int n = static_cast<int>(std::min<int64_t>(kRowsPerPass, rows - r0));
      RowActs ra;
      for (int r = 0; r < n; ++r) {
        ra.q[r] = a.q + (r0 + r) * kbn * kKBlock;
        ra.scale[r] = a.scale + (r0 + r) * kbn;
        ra.sum[r] = a.sum + (r0 + r) * kbn;
        ra.scaled_sum[r] = a.scaled_sum + (r0 + r) * kbn * kSums;
      }
      __m256 acc[kRowsPerPass];
      passes[n - 1](w, view_of(w, g), ra, acc);
      store_rows(acc, n, y + r0 * ys, ys, g, w.n, bias);
    }
  }
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
