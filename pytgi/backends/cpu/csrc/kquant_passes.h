// The SIMD passes of the K-quant kernels (kquant.h), written once over an ISA's traits T:
//   T::V, T::F      integer / float vectors of T::kCols lanes, one output column each (8: one
//                   group, ymm; 16: two neighbouring groups, zmm);
//   load(a, b)      the 32 code bytes at a (group g) and, for 16 lanes, at b (group g + 1);
//   P, pacc(p, u, s)  a partial sum: p + per lane the dot product of 4 unsigned code bytes and
//                   4 int8 activation bytes (vpdpbusd into int32; AVX2: maddubs into int16
//                   pairs, exact while at most kQ6Flush (Q6_K) or 8 (Q4_K) are summed);
//   flush(isum, p, S)  isum + the partial sum times the column scales S (AVX2: one madd by the
//                   scales as int16 pairs, as llama.cpp scales; VNNI: vpmulld);
//   scaled(S, x)    S's scale times x (|x| < 2^15) per lane;
//   and the plain lane-wise operations named below.
// The integer sums are exact, so their grouping is free; the float epilogue runs kquant.h's
// operations in kquant.h's order, so every table equals the scalar table bit for bit.
// Included after a TU's target pragma / flags, with T defined there.
#pragma once

#include "kquant.h"

namespace pytgi {
namespace kquant {
namespace passes {

template <class T>
inline const int8_t* row_q(const Acts& a, int64_t r) {
  return a.q + r * a.supers * kSuper;
}

// Q4_K: R rows (r0 ..) times the T::kCols columns from group g on.
template <class T, int R>
void q4k_pass(const Matrix& w, const Acts& a, int64_t r0, int64_t g, typename T::F* acc) {
  using V = typename T::V;
  const int64_t g1 = T::kCols > kGroup ? g + 1 : g;
  for (int64_t s = 0; s < w.supers; ++s) {
    const uint8_t* b0 = w.at(g, s);
    const uint8_t* b1 = w.at(g1, s);
    V isum[R], msum[R];
    for (int r = 0; r < R; ++r) isum[r] = msum[r] = T::zero();
    for (int b = 0; b < 8; ++b) {
      typename T::P dot[R];  // 8 products of nibble <= 15 and |x| <= 127 per int16: <= 30480
      for (int r = 0; r < R; ++r) dot[r] = T::zero();
      const typename T::S sc = T::scales_u8(b0 + 1024 + b * 8, b1 + 1024 + b * 8);
      const typename T::S mn = T::scales_u8(b0 + 1088 + b * 8, b1 + 1088 + b * 8);
      for (int v = 0; v < 4; ++v) {
        const V codes = T::load(b0 + b * 128 + v * 32, b1 + b * 128 + v * 32);
        const V lo = T::low4(codes), hi = T::high4(codes);
        for (int r = 0; r < R; ++r) {
          const int8_t* xr = row_q<T>(a, r0 + r) + s * kSuper + 32 * b;
          dot[r] = T::pacc(dot[r], lo, T::set1(quad_at(xr, 4 * v)));
          dot[r] = T::pacc(dot[r], hi, T::set1(quad_at(xr, 16 + 4 * v)));
        }
      }
      for (int r = 0; r < R; ++r) {
        const int32_t* bs = a.bsum + ((r0 + r) * a.supers + s) * kSub16;
        isum[r] = T::flush(isum[r], dot[r], sc);
        msum[r] = T::add(msum[r], T::scaled(mn, bs[2 * b] + bs[2 * b + 1]));
      }
    }
    const typename T::F dv = T::load_f(w.d_at(g, s), w.d_at(g1, s));
    const typename T::F mv = T::load_f(w.d_at(g, s) + kGroup, w.d_at(g1, s) + kGroup);
    for (int r = 0; r < R; ++r) {
      const typename T::F dx = T::set1_f(a.dx[(r0 + r) * a.supers + s]);
      acc[r] = T::fmadd(T::mul(dv, dx), T::cvt(isum[r]), acc[r]);
      acc[r] = T::fmadd(T::neg(T::mul(mv, dx)), T::cvt(msum[r]), acc[r]);
    }
  }
}

// Q6_K: likewise.
template <class T, int R>
void q6k_pass(const Matrix& w, const Acts& a, int64_t r0, int64_t g, typename T::F* acc) {
  using V = typename T::V;
  const int64_t g1 = T::kCols > kGroup ? g + 1 : g;
  for (int64_t s = 0; s < w.supers; ++s) {
    const uint8_t* b0 = w.at(g, s);
    const uint8_t* b1 = w.at(g1, s);
    V isum[R];
    for (int r = 0; r < R; ++r) isum[r] = T::zero();
    for (int b = 0; b < 8; ++b) {
      V low[4], high[2];
      for (int v = 0; v < 4; ++v) low[v] = T::load(b0 + b * 128 + v * 32, b1 + b * 128 + v * 32);
      for (int j = 0; j < 2; ++j) {
        high[j] = T::load(b0 + 1024 + b * 64 + j * 32, b1 + 1024 + b * 64 + j * 32);
      }
      for (int half = 0; half < 2; ++half) {
        const int h = 2 * b + half;
        const typename T::S sc = T::scales_i8(b0 + 1536 + h * 8, b1 + 1536 + h * 8);
        typename T::P dot[R];
        for (int r = 0; r < R; ++r) dot[r] = T::zero();
        for (int v = 0; v < 4; ++v) {
          const int q = 4 * half + v;  // the k-quad within the 32-wide sub-block
          const V nib = half == 0 ? T::low4(low[v]) : T::high4(low[v]);
          const V u = T::or_(nib, T::shl4(T::bits2(high[q % 2], 2 * (q / 2))));
          for (int r = 0; r < R; ++r) {
            const int8_t* xr = row_q<T>(a, r0 + r) + s * kSuper + 32 * b;
            dot[r] = T::pacc(dot[r], u, T::set1(quad_at(xr, 4 * q)));
          }
          if ((v + 1) % T::kQ6Flush == 0) {  // u <= 63: an int16 lane holds 2 k-quads' pairs
            for (int r = 0; r < R; ++r) {
              isum[r] = T::flush(isum[r], dot[r], sc);
              dot[r] = T::zero();
            }
          }
        }
        for (int r = 0; r < R; ++r) {  // sc * (dot - 32 * bsum), |bsum| <= 16 * 127
          const int32_t* bs = a.bsum + ((r0 + r) * a.supers + s) * kSub16;
          isum[r] = T::sub(isum[r], T::shl32_5(T::scaled(sc, bs[h])));
        }
      }
    }
    const typename T::F dv = T::load_f(w.d_at(g, s), w.d_at(g1, s));
    for (int r = 0; r < R; ++r) {
      const typename T::F dx = T::set1_f(a.dx[(r0 + r) * a.supers + s]);
      acc[r] = T::fmadd(T::mul(dv, dx), T::cvt(isum[r]), acc[r]);
    }
  }
}

template <class T, int R>
void rows_pass(const Matrix& w, const Acts& a, int64_t r0, int64_t g, float* y, int64_t ys,
               const float* bias) {
  typename T::F acc[R];
  for (int r = 0; r < R; ++r) acc[r] = T::zero_f();
  if (w.format == kQ4K) {
    q4k_pass<T, R>(w, a, r0, g, acc);
  } else {
    q6k_pass<T, R>(w, a, r0, g, acc);
  }
  alignas(64) float out[T::kCols];
  for (int r = 0; r < R; ++r) {
    T::store_f(out, acc[r]);
    for (int c = 0; c < T::kCols && g * kGroup + c < w.n; ++c) {
      y[(r0 + r) * ys + g * kGroup + c] = out[c] + (bias ? bias[g * kGroup + c] : 0.f);
    }
  }
}

// kquant.h's Kernels::gemm_i8 over T: groups [g0, g1) by T::kCols / 8, rows 4 at a time.
template <class T>
void gemm_i8(const Matrix& w, const Acts& a, int64_t rows, int64_t g0, int64_t g1, float* y,
             int64_t ys, const float* bias) {
  for (int64_t g = g0; g < g1; g += T::kCols / kGroup) {
    int64_t r0 = 0;
    for (; r0 + kRowsPerPass <= rows; r0 += kRowsPerPass) {
      rows_pass<T, kRowsPerPass>(w, a, r0, g, y, ys, bias);
    }
    switch (rows - r0) {
      case 1: rows_pass<T, 1>(w, a, r0, g, y, ys, bias); break;
      case 2: rows_pass<T, 2>(w, a, r0, g, y, ys, bias); break;
      case 3: rows_pass<T, 3>(w, a, r0, g, y, ys, bias); break;
      default: break;
    }
  }
}

}  // namespace passes
}  // namespace kquant
}  // namespace pytgi
