// Shared building blocks of pytgi's CPU kernels (fp32): row helpers, vector math, and the
// 16-column register tiles of the packed GEMM (attention: attention.h). Used by ops.cpp (one op per
// call) and decode_stack.cpp (a whole decode step's layers in one call), so both compute the same
// floats. Everything here is inline: this header is included by both translation units.
#pragma once

#include <torch/extension.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace pytgi {

inline void check_f32(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, name,
              " must be a float32 CPU tensor");
  TORCH_CHECK(t.dim() == 0 || t.stride(-1) == 1, name, " must have a contiguous last dimension");
}

inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

inline float sum_squares(const float* a, int64_t n) { return dot(a, a, n); }

inline void scale_into(float* out, const float* x, const float* w, float s, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * s);
}

// out = weight * x / sqrt(mean(x^2) + eps) over one row of d (transformers' formula).
inline void rms_row(float* out, const float* x, const float* weight, int64_t d, float eps) {
  scale_into(out, x, weight, 1.f / std::sqrt(sum_squares(x, d) / d + eps), d);
}

// The pre-norm block's "add then norm" over one row: residual += multiplier * x (in place), then
// out = rms_norm(residual).
inline void add_rms_row(float* out, float* residual, const float* x, float multiplier,
                        const float* weight, int64_t d, float eps) {
  if (multiplier == 1.f) {
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) residual[i] += x[i];
  } else {
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) residual[i] += x[i] * multiplier;
  }
  rms_row(out, residual, weight, d, eps);
}

// out = (x - mean) / sqrt(var + eps) * weight (+ bias) over one row of d (biased variance, as
// torch's layer_norm); out may be x.
inline void layer_norm_row(float* out, const float* x, const float* weight, const float* bias,
                           int64_t d, float eps) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < d; ++i) sum += x[i];
  const float mean = sum / d;
  float var = 0.f;
#pragma omp simd reduction(+ : var)
  for (int64_t i = 0; i < d; ++i) var += (x[i] - mean) * (x[i] - mean);
  const float rstd = 1.f / std::sqrt(var / d + eps);
  if (bias == nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) out[i] = (x[i] - mean) * rstd * weight[i];
  } else {
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) out[i] = (x[i] - mean) * rstd * weight[i] + bias[i];
  }
}

// One norm's parameters: RMSNorm (bias null) or LayerNorm (bias optional).
struct Norm {
  const float* weight = nullptr;
  const float* bias = nullptr;
};

inline void norm_row(float* out, const float* x, const Norm& n, int64_t d, float eps,
                     bool layer_norm) {
  if (layer_norm) {
    layer_norm_row(out, x, n.weight, n.bias, d, eps);
  } else {
    rms_row(out, x, n.weight, d, eps);
  }
}

// Rotate-half RoPE of one head in place: v[:rd] <- v[:rd] * cos + [v2 | v1] * sin, where
// cos = [c | c] and sin = [-s | s] (rd values each).
inline void rotate_head(float* v, const float* c, const float* s, int64_t rd) {
  const int64_t half = rd / 2;
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    v[i] = a * c[i] + b * s[i];
    v[i + half] = b * c[i + half] + a * s[i + half];
  }
}

// Interleaved RoPE (GPT-J, Cohere) of one head in place: the pair (v[2i], v[2i+1]) rotates by
// frequency i: v <- v * cos + [v1, v0, v3, v2, ...] * sin, where cos = [c0, c0, c1, c1, ...] and
// sin = [-s0, s0, -s1, s1, ...].
inline void rotate_head_interleaved(float* v, const float* c, const float* s, int64_t rd) {
  for (int64_t i = 0; i < rd; i += 2) {
    const float a = v[i], b = v[i + 1];
    v[i] = a * c[i] + b * s[i];
    v[i + 1] = b * c[i + 1] + a * s[i + 1];
  }
}

inline void rotate(float* v, const float* c, const float* s, int64_t rd, bool interleaved) {
  if (interleaved) {
    rotate_head_interleaved(v, c, s, rd);
  } else {
    rotate_head(v, c, s, rd);
  }
}

#if defined(__AVX2__) && defined(__FMA__)

inline float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

// e^x, Cephes' expf: range reduction by ln 2, degree-5 polynomial; relative error ~2e-7. Inputs
// are clamped to [-87.3, 88.3] (below: ~1e-38 instead of less; above: ~2e38 instead of more).
inline __m256 exp_ps(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// tanh(x) = 1 - 2 / (e^(2x) + 1) (exp_ps' clamp keeps +-1 at the ends; absolute error ~3e-7).
inline __m256 tanh_ps(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 e = exp_ps(_mm256_add_ps(x, x));
  return _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.f), _mm256_add_ps(e, one)));
}

// x * sigmoid(z) = x / (1 + e^-z).
inline __m256 mul_sigmoid_ps(__m256 x, __m256 z) {
  const __m256 one = _mm256_set1_ps(1.f);
  return _mm256_div_ps(x, _mm256_add_ps(one, exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), z))));
}

// erf(x), Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7).
inline __m256 erf_ps(__m256 x) {
  const __m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.f));
  const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.f), x);
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), ax, one));
  __m256 p = _mm256_set1_ps(1.061405429f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
  p = _mm256_mul_ps(p, t);
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(ax, ax)));
  return _mm256_or_ps(_mm256_fnmadd_ps(p, e, one), sign);
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
#endif

// out[i] = silu(gate[i]) * up[i] over n values.
inline void silu_mul_row(float* out, const float* gate, const float* up, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 one = _mm256_set1_ps(1.f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 sig =
        _mm256_div_ps(one, _mm256_add_ps(one, exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

// The MLP activations by id (the fused decode stack's and the gated kernels' encoding).
enum Activation : int64_t { kSilu = 0, kGelu = 1, kGeluTanh = 2 };

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kSqrtHalf = 0.7071067811865476f;

inline float act_scalar(float x, int64_t act) {
  if (act == kSilu) return x / (1.f + std::exp(-x));
  if (act == kGeluTanh) {  // 0.5 x (1 + tanh(y)) = x sigmoid(2y), y = sqrt(2/pi) (x + 0.044715 x^3)
    return x / (1.f + std::exp(-2.f * kSqrt2OverPi * (x + 0.044715f * x * x * x)));
  }
  return 0.5f * x * (1.f + std::erf(x * kSqrtHalf));
}

// out[i] = act(x[i]) (* up[i] when up is not null) over n values; out may be x.
inline void act_row(float* out, const float* x, const float* up, int64_t n, int64_t act) {
  if (act == kSilu && up != nullptr) return silu_mul_row(out, x, up, n);
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    __m256 y;
    if (act == kSilu) {
      y = mul_sigmoid_ps(v, v);
    } else if (act == kGeluTanh) {
      const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(v, v), v);
      const __m256 inner = _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), cube, v);
      y = mul_sigmoid_ps(v, _mm256_mul_ps(_mm256_set1_ps(2.f * kSqrt2OverPi), inner));
    } else {
      const __m256 e = erf_ps(_mm256_mul_ps(v, _mm256_set1_ps(kSqrtHalf)));
      const __m256 half_x = _mm256_mul_ps(_mm256_set1_ps(0.5f), v);
      y = _mm256_mul_ps(half_x, _mm256_add_ps(_mm256_set1_ps(1.f), e));
    }
    if (up != nullptr) y = _mm256_mul_ps(y, _mm256_loadu_ps(up + i));
    _mm256_storeu_ps(out + i, y);
  }
#endif
  for (; i < n; ++i) {
    const float y = act_scalar(x[i], act);
    out[i] = up != nullptr ? y * up[i] : y;
  }
}

// ---- linear on packed weights: y [M, C * n] = x [M, K] @ W, W as column tiles wt [C, K, n] ------
// The layers pack W [N, K] as [N / 16, K, 16] (n = 16), so each 16-column tile is one contiguous
// stream. Each tile is streamed once per 6 rows of x and reused from L2 for the next 6 rows;
// accumulators stay in registers for the whole K loop (6 x 16 floats = 12 ymm registers), one
// broadcast of x per row and k. Measured against MKL sgemm in docs/PERFORMANCE.md ("Kernel
// choices").

constexpr int64_t kRowBlock = 6;
constexpr int64_t kTile = 16;

#if defined(__AVX2__) && defined(__FMA__)
// Accumulators are named variables, not an array: GCC keeps an array's registers but also
// stores them to the stack every iteration, which makes the loop store-bound.
#define PYTGI_ROW(m)                                                        \
  if constexpr (MB > m) {                                                   \
    const __m256 xb = _mm256_broadcast_ss(x + m * xs + k);                  \
    c##m##0 = _mm256_fmadd_ps(xb, w0, c##m##0);                             \
    c##m##1 = _mm256_fmadd_ps(xb, w1, c##m##1);                             \
  }
#define PYTGI_STORE(m)                                                      \
  if constexpr (MB > m) {                                                   \
    _mm256_storeu_ps(y + m * ys, _mm256_add_ps(c##m##0, b0));               \
    _mm256_storeu_ps(y + m * ys + 8, _mm256_add_ps(c##m##1, b1));           \
  }

// Row invariance (docs/KERNELS.md): every row of every block size sums its products in one FMA
// chain, k = 0, 1, ..., K-1, then adds the bias, so a row's result never depends on how many
// rows share its block or its step (a single row has no faster chain order of its own).
template <int MB>
inline void tile_6x16(const float* x, int64_t xs, const float* w, int64_t wn, int64_t k_len,
                      float* y, int64_t ys, const float* bias) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t k = 0; k < k_len; ++k) {
    if constexpr (MB > 1) {  // one row streams fast enough unaided; more rows need the help
      _mm_prefetch(reinterpret_cast<const char*>(w + (k + 16) * wn), _MM_HINT_T0);
    }
    const __m256 w0 = _mm256_loadu_ps(w + k * wn), w1 = _mm256_loadu_ps(w + k * wn + 8);
    PYTGI_ROW(0) PYTGI_ROW(1) PYTGI_ROW(2) PYTGI_ROW(3) PYTGI_ROW(4) PYTGI_ROW(5)
  }
  const __m256 b0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
  const __m256 b1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
  PYTGI_STORE(0) PYTGI_STORE(1) PYTGI_STORE(2) PYTGI_STORE(3) PYTGI_STORE(4) PYTGI_STORE(5)
}
#undef PYTGI_ROW
#undef PYTGI_STORE

inline void tile_rows(int64_t rows, const float* x, int64_t xs, const float* w, int64_t wn,
               int64_t k_len, float* y, int64_t ys, const float* bias) {
  switch (rows) {
    case 6: return tile_6x16<6>(x, xs, w, wn, k_len, y, ys, bias);
    case 5: return tile_6x16<5>(x, xs, w, wn, k_len, y, ys, bias);
    case 4: return tile_6x16<4>(x, xs, w, wn, k_len, y, ys, bias);
    case 3: return tile_6x16<3>(x, xs, w, wn, k_len, y, ys, bias);
    case 2: return tile_6x16<2>(x, xs, w, wn, k_len, y, ys, bias);
    default: return tile_6x16<1>(x, xs, w, wn, k_len, y, ys, bias);
  }
}
#endif

// Columns [j0, j1) of one block for every row, without SIMD (tails and non-AVX2 builds).
inline void columns_scalar(int64_t rows, const float* x, int64_t xs, const float* w, int64_t wn,
                    int64_t k_len, int64_t j0, int64_t j1, float* y, int64_t ys,
                    const float* bias) {
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t j = j0; j < j1; ++j) {
      float acc = 0.f;
      for (int64_t k = 0; k < k_len; ++k) acc += x[m * xs + k] * w[k * wn + j];
      y[m * ys + j] = acc + (bias ? bias[j] : 0.f);
    }
  }
}

// One 16-column tile for every row: y[m, 0:16] = x[m, :] @ w[:, 0:16] (+ bias) for m < rows,
// w the tile's [k_len, wn] slab (wn >= 16). The tile streams once per 6 rows, then from L2.
inline void packed_tile(int64_t rows, const float* x, int64_t xs, const float* w, int64_t wn,
                        int64_t k_len, float* y, int64_t ys, const float* bias) {
  for (int64_t m0 = 0; m0 < rows; m0 += kRowBlock) {
    const int64_t mb = std::min(kRowBlock, rows - m0);
#if defined(__AVX2__) && defined(__FMA__)
    tile_rows(mb, x + m0 * xs, xs, w, wn, k_len, y + m0 * ys, ys, bias);
#else
    columns_scalar(mb, x + m0 * xs, xs, w, wn, k_len, 0, kTile, y + m0 * ys, ys, bias);
#endif
  }
}

}  // namespace pytgi
