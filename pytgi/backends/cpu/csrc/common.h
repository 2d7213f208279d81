// Shared building blocks of pytgi's CPU kernels (fp32): row helpers, the decode attention of one
// query head, and the 16-column register tiles of the packed GEMM. Used by ops.cpp (one op per
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

// ---- decode attention: one query head against its row's keys (len rows of d floats) ----

// Per-head score modifiers: logit soft-capping (softcap > 0: s -> softcap * tanh(s / softcap))
// and ALiBi (slope != 0: s += slope * (key position - query position)).
struct ScoreMods {
  float softcap = 0.f;
  float slope = 0.f;
  bool active() const { return softcap > 0.f || slope != 0.f; }
};

inline float apply_mods_scalar(float x, const ScoreMods& mods, float distance) {
  if (mods.softcap > 0.f) x = mods.softcap * std::tanh(x / mods.softcap);
  return x + mods.slope * distance;
}

inline float apply_mods(float* s, int64_t n, float scale, const ScoreMods& mods, int64_t origin);

inline void attend_scalar(const float* q, const float* const* keys, const float* const* values,
                          int64_t len, int64_t d, float scale, float* s, float* out,
                          const ScoreMods& mods) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < len; ++i) m = std::max(m, s[i] = dot(q, keys[i], d) * scale);
  if (mods.active()) m = apply_mods(s, len, 1.f, mods, 1 - len);  // the query is the last key
  float total = 0.f;
  for (int64_t i = 0; i < len; ++i) total += (s[i] = std::exp(s[i] - m));
  std::fill(out, out + d, 0.f);
  for (int64_t i = 0; i < len; ++i) {
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) out[c] += s[i] * values[i][c];
  }
  for (int64_t c = 0; c < d; ++c) out[c] /= total;
}

#if defined(__AVX2__) && defined(__FMA__)
constexpr bool kVectorized = true;

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

// [sum(a0), ..., sum(a7)]: eight horizontal sums in one vector (6 hadds and 2 lane permutes
// instead of 8 separate reductions).
inline __m256 hsum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                    __m256 a7) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  // u0 = [a0..a3 summed over their low 128-bit lane | the same over the high lane], u1 for a4..a7
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// s[i] = q . keys[i] * scale for 8 keys at once (d % 8 == 0): 8 independent FMA chains, one
// shared load of q per 8 features. Returns the max of the 8 scores.
inline float scores8_avx2(const float* q, const float* const* keys, int64_t d, float scale,
                          float* s) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const float *k0 = keys[0], *k1 = keys[1], *k2 = keys[2], *k3 = keys[3], *k4 = keys[4],
              *k5 = keys[5], *k6 = keys[6], *k7 = keys[7];
  for (int64_t c = 0; c < d; c += 8) {
    const __m256 qv = _mm256_loadu_ps(q + c);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + c), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + c), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + c), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + c), a3);
    a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k4 + c), a4);
    a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k5 + c), a5);
    a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k6 + c), a6);
    a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k7 + c), a7);
  }
  const __m256 v = _mm256_mul_ps(hsum8(a0, a1, a2, a3, a4, a5, a6, a7), _mm256_set1_ps(scale));
  _mm256_storeu_ps(s, v);
  return hmax(v);
}
#endif

// s[i] <- exp(s[i] * scale - shift) over n values; returns their sum (the softmax's numerators
// and denominator). exp(-inf) is 0 on the scalar tail and ~1e-38 in the vector part (exp_ps
// clamps its input).
inline float exp_shifted_sum(float* s, int64_t n, float scale, float shift) {
  float total = 0.f;
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 sv = _mm256_set1_ps(scale), mv = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_ps(_mm256_fmsub_ps(_mm256_loadu_ps(s + i), sv, mv));
    _mm256_storeu_ps(s + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  total = hsum(sum);
#endif
  for (; i < n; ++i) total += (s[i] = std::exp(s[i] * scale - shift));
  return total;
}

#if defined(__AVX2__) && defined(__FMA__)
// d % 8 == 0. Scores 8 keys at a time (then one by one); the weighted sum of values in chunks of
// 64 features held in 8 registers (the values are re-read per chunk from L1).
inline void attend_avx2(const float* q, const float* const* keys, const float* const* values,
                        int64_t len, int64_t d, float scale, float* s, float* out,
                        const ScoreMods& mods) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t first_single = 0;
  for (; first_single + 8 <= len; first_single += 8) {
    m = std::max(m, scores8_avx2(q, keys + first_single, d, scale, s + first_single));
  }
  for (int64_t i = first_single; i < len; ++i) {
    const float* k = keys[i];
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= d; c += 16) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(k + c), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c + 8), _mm256_loadu_ps(k + c + 8), a1);
    }
    if (c < d) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(k + c), a0);
    m = std::max(m, s[i] = hsum(_mm256_add_ps(a0, a1)) * scale);
  }
  if (mods.active()) m = apply_mods(s, len, 1.f, mods, 1 - len);  // the query is the last key
  const __m256 inv = _mm256_set1_ps(1.f / exp_shifted_sum(s, len, 1.f, m));
  for (int64_t c0 = 0; c0 < d; c0 += 64) {
    const int64_t nc = std::min<int64_t>(8, (d - c0) / 8);
    __m256 r0 = _mm256_setzero_ps(), r1 = r0, r2 = r0, r3 = r0, r4 = r0, r5 = r0, r6 = r0,
           r7 = r0;
    for (int64_t j = 0; j < len; ++j) {
      const __m256 w = _mm256_broadcast_ss(s + j);
      const float* v = values[j] + c0;
      r0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v), r0);
      if (nc > 1) r1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8), r1);
      if (nc > 2) r2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 16), r2);
      if (nc > 3) r3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 24), r3);
      if (nc > 4) r4 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 32), r4);
      if (nc > 5) r5 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 40), r5);
      if (nc > 6) r6 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 48), r6);
      if (nc > 7) r7 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 56), r7);
    }
    const __m256 r[8] = {r0, r1, r2, r3, r4, r5, r6, r7};
    for (int64_t j = 0; j < nc; ++j) _mm256_storeu_ps(out + c0 + 8 * j, _mm256_mul_ps(r[j], inv));
  }
}
#else
constexpr bool kVectorized = false;
inline void attend_avx2(const float* q, const float* const* keys, const float* const* values,
                        int64_t len, int64_t d, float scale, float* s, float* out,
                        const ScoreMods& mods) {
  attend_scalar(q, keys, values, len, d, scale, s, out, mods);
}
#endif

// s[j] <- mods(s[j] * scale) with key j at distance origin + j from the query, over n scores;
// returns their max. The soft-cap's tanh is vectorised where AVX2 is there.
inline float apply_mods(float* s, int64_t n, float scale, const ScoreMods& mods, int64_t origin) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const bool capped = mods.softcap > 0.f;
  const __m256 sv = _mm256_set1_ps(capped ? scale / mods.softcap : scale);
  const __m256 cap = _mm256_set1_ps(capped ? mods.softcap : 1.f);
  const __m256 step = _mm256_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f);
  const __m256 slope = _mm256_set1_ps(mods.slope);
  __m256 mv = _mm256_set1_ps(m);
  for (; j + 8 <= n; j += 8) {
    __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + j), sv);
    if (capped) x = _mm256_mul_ps(tanh_ps(x), cap);
    const __m256 dist = _mm256_add_ps(_mm256_set1_ps(static_cast<float>(origin + j)), step);
    const __m256 y = _mm256_fmadd_ps(slope, dist, x);
    _mm256_storeu_ps(s + j, y);
    mv = _mm256_max_ps(mv, y);
  }
  m = hmax(mv);
#endif
  for (; j < n; ++j) {
    s[j] = apply_mods_scalar(s[j] * scale, mods, static_cast<float>(origin + j));
    m = std::max(m, s[j]);
  }
  return m;
}

// The K and V rows of positions [first, first + len) of one KV head, wherever their blocks are:
// position p lives in slot table[p / block_size] * block_size + p % block_size of the head's
// [num_slots, d] rows (k_head, v_head). One division per block, not per position.
inline void paged_rows(const int64_t* table, int64_t block_size, int64_t first, int64_t len,
                       const float* k_head, const float* v_head, int64_t d, const float** keys,
                       const float** values) {
  for (int64_t i = 0, p = first; i < len;) {
    const int64_t offset = p % block_size, n = std::min(block_size - offset, len - i);
    const int64_t row = table[p / block_size] * block_size + offset;
    for (int64_t j = 0; j < n; ++j) {
      keys[i + j] = k_head + (row + j) * d;
      values[i + j] = v_head + (row + j) * d;
    }
    i += n;
    p += n;
  }
}

// Dispatches on d: the AVX2 path needs d % 8 == 0.
inline void attend(const float* q, const float* const* keys, const float* const* values,
                   int64_t len, int64_t d, float scale, float* s, float* out,
                   const ScoreMods& mods) {
  if (kVectorized && d % 8 == 0) {
    attend_avx2(q, keys, values, len, d, scale, s, out, mods);
  } else {
    attend_scalar(q, keys, values, len, d, scale, s, out, mods);
  }
}

struct AttendScratch {  // one thread's, reused across calls
  std::vector<float> scores;
  std::vector<const float*> keys, values;
};

// The `group` query heads of one KV head in one decode row (head g at q + g * q_head_stride)
// against the row's positions [first, first + len), read in place from the head's [num_slots, d]
// cache rows through the row's block table -> out + g * d. The group's heads run back to back,
// so their K/V rows come from L2 after the first. softcap > 0 caps the scores; slopes (null: no
// ALiBi) holds the group's ALiBi slopes.
inline void attend_kv_head(const float* q, int64_t q_head_stride, int64_t group,
                           const int64_t* table, int64_t block_size, int64_t first, int64_t len,
                           const float* k_head, const float* v_head, int64_t d, float scale,
                           float* out, AttendScratch& scratch, float softcap = 0.f,
                           const float* slopes = nullptr) {
  scratch.keys.resize(len);
  scratch.values.resize(len);
  scratch.scores.resize(len);
  paged_rows(table, block_size, first, len, k_head, v_head, d, scratch.keys.data(),
             scratch.values.data());
  for (int64_t g = 0; g < group; ++g) {
    const ScoreMods mods{softcap, slopes == nullptr ? 0.f : slopes[g]};
    attend(q + g * q_head_stride, scratch.keys.data(), scratch.values.data(), len, d, scale,
           scratch.scores.data(), out + g * d, mods);
  }
}

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
