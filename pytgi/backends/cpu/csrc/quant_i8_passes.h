// The int8-activation passes of the x86 quantized kernels (quant.h's gemm_i8), written once over
// a Dot policy, the instruction that multiplies unsigned code bytes by signed activation bytes and
// adds each lane's 4 products into an int32:
//   MaddubsDot (AVX2, here): maddubs then madd with ones; 4-bit codes add 8 maddubs results in
//       int16 before one madd per block (quant_avx2_i8.cpp);
//   VnniDot (AVX-512 VNNI, quant_vnni_i8.cpp): vpdpbusd on ymm, one instruction; int8 codes with
//       one scale per 32 run as the unsigned bytes w + 128 times x, less 128 x sum(x) per block
//       (no abs / sign per row; int32 lanes never overflow: 32 x 255 x 127 per block).
// Both compute the exact integer dot products: maddubs never saturates on these operands (code
// bytes <= 128 after abs, 4-bit nibbles <= 15, activations in [-127, 127]: a pair is at most
// 2 x 128 x 127 = 32512 < 2^15, and 8 pairs of nibble products 8 x 2 x 15 x 127 = 30480 < 2^15),
// and the float epilogues are the same code, so every policy's results are bit-identical.
//
// Everything here has internal linkage (an unnamed namespace): each includer compiles its own
// copy for its own target (quant_vnni_i8.cpp under an AVX-512 target pragma), so the linker never
// folds an AVX-512 copy into the AVX2 table. Include after quant_avx2.h, which must come before
// any target pragma for the same reason.
#pragma once

#include "quant_avx2.h"

namespace pytgi {
namespace quant {
namespace avx2 {
namespace {

// AVX2: u8 x s8 -> int16 pairs (maddubs) -> int32 quads (madd with ones).
struct MaddubsDot {
  // dot() takes any unsigned bytes (int8 codes run as w + 128): false, maddubs would saturate
  static constexpr bool kOffsetCodes = false;
  // acc + each lane's 4 products of u (unsigned bytes <= 128) and s (signed bytes, |s| <= 127)
  static __m256i dot(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s),
                                                   _mm256_set1_epi16(1)));
  }
  // A 4-bit k-block's running sums: int16 pairs, widened once per block (8 adds fit, above).
  using Nibbles = __m256i;
  static Nibbles nibbles_zero() { return _mm256_setzero_si256(); }
  static void nibbles_add(Nibbles& acc, __m256i lo, __m256i x_lo, __m256i hi, __m256i x_hi) {
    const __m256i p0 = _mm256_maddubs_epi16(lo, x_lo), p1 = _mm256_maddubs_epi16(hi, x_hi);
    acc = _mm256_add_epi16(acc, _mm256_add_epi16(p0, p1));
    keep(acc);
  }
  static __m256i nibbles_sum(Nibbles acc) {
    return _mm256_madd_epi16(acc, _mm256_set1_epi16(1));
  }
};

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
template <class Dot, int R, bool HALF, bool MINS, bool SUB16>
void int8_pass(const GroupView& gv, const RowActs& a, __m256* out) {
  const uint8_t *codes = gv.codes, *scales = gv.scales, *mins = gv.mins;
  const int64_t kblocks = gv.kblocks, mul = gv.row_mul, shift = gv.row_shift;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    const uint8_t* blk = codes + kb * 256;
    prefetch_ahead<R, 256>(blk);
    __m256i d0[R], d1[R];
    for (int r = 0; r < R; ++r) d0[r] = d1[r] = _mm256_setzero_si256();
    if constexpr (Dot::kOffsetCodes && !SUB16) {
      // (w + 128) as unsigned bytes times x: one instruction per quad and row, no per-row sign;
      // the block's 128 x sum(x) comes off after the loop (exact integers either way)
#pragma GCC unroll 8
      for (int qd = 0; qd < 8; ++qd) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + qd * 32));
        const __m256i uw = _mm256_xor_si256(wv, _mm256_set1_epi8(static_cast<char>(0x80)));
        for (int r = 0; r < R; ++r) {
          d0[r] = Dot::dot(d0[r], uw, quad(a.q[r], kb * kKBlock + qd * 4));
          keep(d0[r]);
        }
      }
      for (int r = 0; r < R; ++r) {
        d0[r] = _mm256_sub_epi32(d0[r], _mm256_set1_epi32(128 * a.sum[r][kb]));
      }
    } else {
#pragma GCC unroll 8
      for (int qd = 0; qd < 8; ++qd) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + qd * 32));
        const __m256i aw = _mm256_abs_epi8(wv);
        for (int r = 0; r < R; ++r) {
          const __m256i xs = _mm256_sign_epi8(quad(a.q[r], kb * kKBlock + qd * 4), wv);
          if (SUB16 && qd >= 4) {
            d1[r] = Dot::dot(d1[r], aw, xs);
            keep(d1[r]);
          } else {
            d0[r] = Dot::dot(d0[r], aw, xs);
            keep(d0[r]);
          }
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
template <class Dot, int R, bool HALF, bool MINS>
void int4_pass(const GroupView& gv, const RowActs& a, __m256* out) {
  const uint8_t *codes = gv.codes, *scales = gv.scales, *mins = gv.mins;
  const int64_t kblocks = gv.kblocks, mul = gv.row_mul, shift = gv.row_shift;
  const __m256i low = _mm256_set1_epi8(0x0f);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    const uint8_t* blk = codes + kb * 128;
    prefetch_ahead<R, 128>(blk);
    typename Dot::Nibbles s[R];
    for (int r = 0; r < R; ++r) s[r] = Dot::nibbles_zero();
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + v * 32));
      const __m256i lo = _mm256_and_si256(b, low);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
      for (int r = 0; r < R; ++r) {
        const int64_t k = kb * kKBlock + v * 4;
        Dot::nibbles_add(s[r], lo, quad(a.q[r], k), hi, quad(a.q[r], k + 16));
      }
    }
    const int64_t row = (kb * mul) >> shift;
    const __m256 ws = load_row<HALF>(scales, row);
    for (int r = 0; r < R; ++r) {
      __m256i d = Dot::nibbles_sum(s[r]);
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
template <class Dot, int R, bool HALF>
void lut4_pass(const GroupView& gv, const __m256i table, const RowActs& a, __m256* out) {
  const uint8_t *codes = gv.codes, *scales = gv.scales;
  const int64_t kblocks = gv.kblocks, mul = gv.row_mul, shift = gv.row_shift;
  const __m256i low = _mm256_set1_epi8(0x0f);
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
        d[r] = Dot::dot(d[r], a0, _mm256_sign_epi8(quad(a.q[r], k), t0));
        d[r] = Dot::dot(d[r], a1, _mm256_sign_epi8(quad(a.q[r], k + 16), t1));
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

template <class Dot, int R, bool HALF>
void lut4_pass_of(const Matrix& w, const GroupView& gv, const RowActs& a, __m256* out) {
  const __m256i table = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.table_i8)));
  lut4_pass<Dot, R, HALF>(gv, table, a, out);
}

template <class Dot, int R, bool HALF, bool MINS, bool SUB16>
void int8_pass_of(const Matrix&, const GroupView& gv, const RowActs& a, __m256* out) {
  int8_pass<Dot, R, HALF, MINS, SUB16>(gv, a, out);
}

template <class Dot, int R, bool HALF, bool MINS>
void int4_pass_of(const Matrix&, const GroupView& gv, const RowActs& a, __m256* out) {
  int4_pass<Dot, R, HALF, MINS>(gv, a, out);
}

using PassFn = void (*)(const Matrix&, const GroupView&, const RowActs&, __m256*);

template <class Dot, int R, bool HALF>
PassFn pick_pass(const Matrix& w) {
  const bool mins = w.mins != nullptr;
  switch (w.format) {
    case kInt8:
      if (w.scale_block == 16) {
        return mins ? int8_pass_of<Dot, R, HALF, true, true>
                    : int8_pass_of<Dot, R, HALF, false, true>;
      }
      return mins ? int8_pass_of<Dot, R, HALF, true, false>
                  : int8_pass_of<Dot, R, HALF, false, false>;
    case kInt4:
      return mins ? int4_pass_of<Dot, R, HALF, true> : int4_pass_of<Dot, R, HALF, false>;
    default:
      return lut4_pass_of<Dot, R, HALF>;
  }
}

template <class Dot, int R>
PassFn pick(const Matrix& w) {
  return w.half_scales ? pick_pass<Dot, R, true>(w) : pick_pass<Dot, R, false>(w);
}

template <class Dot>
void gemm_i8_with(const Matrix& w, const Acts& a, int64_t rows, int64_t g0, int64_t g1, float* y,
             int64_t ys, const float* bias) {
  const PassFn passes[kRowsPerPass] = {pick<Dot, 1>(w), pick<Dot, 2>(w), pick<Dot, 3>(w),
                                       pick<Dot, 4>(w)};
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
}  // namespace quant
}  // namespace pytgi
