// The AVX2 (+FMA, F16C) table of quant.h's kernels, fp32-activation half: the weights of a group
// dequantised in registers (gemm_f32, small M) or into an fp32 panel for the packed-tile GEMM
// (dequant_group, larger M). dequant_group equals quant_scalar.cpp's bit for bit, and gemm_f32
// equals the packed-tile GEMM on those panels bit for bit (the same weights, one FMA chain per
// row in k order: docs/KERNELS.md's row invariance).
#include "quant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "quant_avx2.h"

namespace pytgi {
namespace quant {
namespace avx2 {
namespace {

// A vector of 8 columns x 4 k (byte c * 4 + i of each 128-bit half: column c, k offset i) -> its
// 4 k rows of 8 columns as the 4 64-bit chunks of the result.
inline __m256i quads_to_rows(__m256i v) {
  const __m256i by_k = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0,
                                        4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, by_k),
                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The 8 code bytes of each of the 4 k rows, in the low half of each result.
inline void split_rows(__m256i rows, __m128i* out) {
  const __m128i lo = _mm256_castsi256_si128(rows), hi = _mm256_extracti128_si256(rows, 1);
  out[0] = lo;
  out[1] = _mm_srli_si128(lo, 8);
  out[2] = hi;
  out[3] = _mm_srli_si128(hi, 8);
}

inline __m256 e4m3_to_ps(__m128i bytes) {
  const __m256i b = _mm256_cvtepu8_epi32(bytes);
  const __m256i em = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
  const __m256 normal = _mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_slli_epi32(em, 20), _mm256_set1_epi32(120 << 23)));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(0.001953125f));
  const __m256 is_normal = _mm256_castsi256_ps(_mm256_cmpgt_epi32(em, _mm256_set1_epi32(7)));
  const __m256 sign = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24));
  return _mm256_or_ps(_mm256_blendv_ps(sub, normal, is_normal), sign);
}

// The 8 weights of one k row from its 8 code bytes (exactly QuantizedWeight's dequantisation).
template <int FMT, bool MINS>
inline __m256 decode_row(__m128i bytes, __m256 s, __m256 m, __m256 tlo, __m256 thi) {
  if constexpr (FMT == kFp8) {
    return _mm256_mul_ps(s, e4m3_to_ps(bytes));
  } else if constexpr (FMT == kLut4) {
    const __m256i idx = _mm256_cvtepu8_epi32(bytes);
    const __m256 hi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(7)));
    return _mm256_mul_ps(s, _mm256_blendv_ps(_mm256_permutevar8x32_ps(tlo, idx),
                                             _mm256_permutevar8x32_ps(thi, idx), hi));
  } else {
    __m256i code = FMT == kInt8 ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
    if constexpr (MINS) return _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(code), m);
    if constexpr (FMT == kInt4) code = _mm256_sub_epi32(code, _mm256_set1_epi32(8));
    return _mm256_mul_ps(s, _mm256_cvtepi32_ps(code));
  }
}

// k-quad qd (0..7) of a k-block's codes as a vector of 8 columns x 4 bytes.
template <int FMT>
inline __m256i quad_codes(const uint8_t* blk, int qd) {
  if constexpr (FMT == kInt4 || FMT == kLut4) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + qd % 4 * 32));
    const __m256i low = _mm256_set1_epi8(0x0f);
    return qd < 4 ? _mm256_and_si256(b, low) : _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + qd * 32));
  }
}

// ---- fp32 activations, weights dequantised in registers: R rows x one group ------------------
// Each k row of the group is decoded once into 8 floats and multiplies the R rows' broadcast
// activation. Row invariance (docs/KERNELS.md): each row sums in one FMA chain over k in order,
// whatever R, exactly as the packed-tile GEMM on a dequantised panel does (more rows).
template <int FMT, int R, bool HALF, bool MINS>
void f32_pass(const GroupView& gv, const float* table, const float* const* x, __m256* out) {
  constexpr int C = 1;
  constexpr int64_t kBytes = FMT == kInt4 || FMT == kLut4 ? 128 : 256;
  const uint8_t *codes = gv.codes, *scales = gv.scales, *mins = gv.mins;
  const int64_t kblocks = gv.kblocks, mul = gv.row_mul, shift = gv.row_shift;
  const int64_t half_step = gv.half_step;
  __m256 tlo = _mm256_setzero_ps(), thi = tlo;
  if constexpr (FMT == kLut4) tlo = _mm256_loadu_ps(table), thi = _mm256_loadu_ps(table + 8);
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    const uint8_t* blk = codes + kb * kBytes;
    prefetch_ahead<R, kBytes>(blk);
    const int64_t row = (kb * mul) >> shift;
    const __m256 s0 = load_row<HALF>(scales, row), s1 = load_row<HALF>(scales, row + half_step);
    __m256 m0 = _mm256_setzero_ps(), m1 = m0;
    if constexpr (MINS) m0 = load_row<HALF>(mins, row), m1 = load_row<HALF>(mins, row + half_step);
#pragma GCC unroll 8
    for (int qd = 0; qd < 8; ++qd) {
      __m128i rows[4];
      split_rows(quads_to_rows(quad_codes<FMT>(blk, qd)), rows);
      for (int i = 0; i < 4; ++i) {
        const __m256 wv = decode_row<FMT, MINS>(rows[i], qd < 4 ? s0 : s1, qd < 4 ? m0 : m1,
                                                tlo, thi);
        const int64_t k = kb * kKBlock + qd * 4 + i;
        for (int r = 0; r < R; ++r) {
          acc[r][i % C] = _mm256_fmadd_ps(_mm256_broadcast_ss(x[r] + k), wv, acc[r][i % C]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    __m256 total = acc[r][0];
    for (int c = 1; c < C; ++c) total = _mm256_add_ps(total, acc[r][c]);
    out[r] = total;
  }
}

using F32PassFn = void (*)(const GroupView&, const float*, const float* const*, __m256*);

template <int R, bool HALF>
F32PassFn pick_f32_pass(const Matrix& w) {
  const bool mins = w.mins != nullptr;
  switch (w.format) {
    case kInt8: return mins ? f32_pass<kInt8, R, HALF, true> : f32_pass<kInt8, R, HALF, false>;
    case kInt4: return mins ? f32_pass<kInt4, R, HALF, true> : f32_pass<kInt4, R, HALF, false>;
    case kLut4: return f32_pass<kLut4, R, HALF, false>;
    default: return f32_pass<kFp8, R, HALF, false>;
  }
}

template <int R>
F32PassFn pick_f32(const Matrix& w) {
  return w.half_scales ? pick_f32_pass<R, true>(w) : pick_f32_pass<R, false>(w);
}

}  // namespace

void gemm_f32(const Matrix& w, const float* x, int64_t xs, int64_t rows, int64_t g0, int64_t g1,
              float* y, int64_t ys, const float* bias) {
  const F32PassFn passes[kRowsPerPass] = {pick_f32<1>(w), pick_f32<2>(w), pick_f32<3>(w),
                                          pick_f32<4>(w)};
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t r0 = 0; r0 < rows; r0 += kRowsPerPass) {
      const int n = static_cast<int>(std::min<int64_t>(kRowsPerPass, rows - r0));
      const float* xr[kRowsPerPass];
      for (int r = 0; r < n; ++r) xr[r] = x + (r0 + r) * xs;
      __m256 acc[kRowsPerPass];
      passes[n - 1](view_of(w, g), w.table, xr, acc);
      store_rows(acc, n, y + r0 * ys, ys, g, w.n, bias);
    }
  }
}

template <int FMT, bool MINS>
void dequant_group_of(const Matrix& w, int64_t g, float* panel, int64_t stride) {
  constexpr int64_t kBytes = FMT == kInt4 || FMT == kLut4 ? 128 : 256;
  const __m256 tlo = _mm256_loadu_ps(w.table), thi = _mm256_loadu_ps(w.table + 8);
  float sv[2][kGroup], mv[2][kGroup] = {};
  const uint8_t* codes = w.codes + g * w.kblocks * kBytes;
  for (int64_t kb = 0; kb < w.kblocks; ++kb) {
    for (int half = 0; half < 2; ++half) {  // the 16-wide halves of the block
      load_scales8(w.scales, w.half_scales, w.scale_rows, g, w.scale_row(kb, half), sv[half]);
      if (MINS) load_scales8(w.mins, w.half_scales, w.scale_rows, g, w.scale_row(kb, half), mv[half]);
    }
    for (int qd = 0; qd < 8; ++qd) {  // k-quad qd: k = 32 kb + 4 qd + i
      const __m256 s = _mm256_loadu_ps(sv[qd / 4]), m = _mm256_loadu_ps(mv[qd / 4]);
      __m128i rows[4];
      split_rows(quads_to_rows(quad_codes<FMT>(codes + kb * kBytes, qd)), rows);
      for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps(panel + (kb * kKBlock + qd * 4 + i) * stride,
                         decode_row<FMT, MINS>(rows[i], s, m, tlo, thi));
      }
    }
  }
}

void dequant_group(const Matrix& w, int64_t g, float* panel, int64_t stride) {
  const bool mins = w.mins != nullptr;
  switch (w.format) {
    case kInt8:
      return mins ? dequant_group_of<kInt8, true>(w, g, panel, stride)
                  : dequant_group_of<kInt8, false>(w, g, panel, stride);
    case kInt4:
      return mins ? dequant_group_of<kInt4, true>(w, g, panel, stride)
                  : dequant_group_of<kInt4, false>(w, g, panel, stride);
    case kLut4: return dequant_group_of<kLut4, false>(w, g, panel, stride);
    default: return dequant_group_of<kFp8, false>(w, g, panel, stride);
  }
}

}  // namespace avx2
}  // namespace quant
}  // namespace pytgi

#endif
