// pytgi's CPU kernels (fp32): a GEMM on packed weights that beats MKL at decode sizes, and fused
// ops that each replace a chain of small ATen calls on the decode hot path, where a batch-1 step
// was ~60 ATen calls per layer at ~2.5 us each (docs/PERFORMANCE.md, "Kernel choices"). They are
// optional: the Python callers keep the pure-torch path, which tests compare these against.
//
// Layouts (the callers' invariants, checked below):
//   activations  [T, ..., D] with the last dimension contiguous;
//   KV cache     [KVH, num_blocks * block_size, D] per layer (head-major, see attention.py): the
//                keys of block b, head h are the contiguous rows [b * block_size, (b+1) * block_size).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <optional>
#include <limits>
#include <vector>

namespace {

void check_f32(const at::Tensor& t, const char* name) {
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

}  // namespace

// x [..., D] contiguous -> weight * x / sqrt(mean(x^2) + eps), per row (transformers' formula).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_f32(x, "x");
  check_f32(weight, "weight");
  TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
  const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(d, 1);
  auto out = at::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xp + r * d;
      const float s = 1.f / std::sqrt(sum_squares(row, d) / d + static_cast<float>(eps));
      scale_into(op + r * d, row, wp, s, d);
    }
  });
  return out;
}

// The pre-norm block's "add then norm": residual += x (in place), returns rms_norm(residual).
at::Tensor add_rms_norm_(const at::Tensor& x, at::Tensor& residual, const at::Tensor& weight,
                         double eps) {
  check_f32(x, "x");
  check_f32(residual, "residual");
  check_f32(weight, "weight");
  TORCH_CHECK(x.is_contiguous() && residual.is_contiguous() && x.sizes() == residual.sizes(),
              "x and residual must be contiguous tensors of the same shape");
  const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(d, 1);
  auto out = at::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float *rp = residual.data_ptr<float>(), *op = out.data_ptr<float>();
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = rp + r * d;
      const float* add = xp + r * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) row[i] += add[i];
      const float s = 1.f / std::sqrt(sum_squares(row, d) / d + static_cast<float>(eps));
      scale_into(op + r * d, row, wp, s, d);
    }
  });
  return out;
}

// In place, rotate-half RoPE on the first rotary_dim features of every head:
// x [T, N, D] (any row/head strides), cos [T, rd] = [c | c], sin [T, rd] = [-s | s]:
// x[:rd] <- x[:rd] * cos + [x2 | x1] * sin.
void rotary_(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin) {
  check_f32(x, "x");
  check_f32(cos, "cos");
  check_f32(sin, "sin");
  TORCH_CHECK(x.dim() == 3 && cos.dim() == 2 && cos.sizes() == sin.sizes(), "bad rotary shapes");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos/sin must be contiguous");
  const int64_t tokens = x.size(0), heads = x.size(1), rd = cos.size(1), half = rd / 2;
  TORCH_CHECK(cos.size(0) == tokens && rd <= x.size(2) && rd % 2 == 0, "bad rotary shapes");
  const int64_t st = x.stride(0), sh = x.stride(1);
  float* xp = x.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *c = cp + t * rd, *s = sp + t * rd;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = xp + t * st + h * sh;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * c[i] + b * s[i];
          v[i + half] = b * c[i + half] + a * s[i + half];
        }
      }
    }
  });
}

// k, v [T, KVH, D] (any row/head strides) -> k_cache, v_cache [KVH, S, D] at slots [T] (int64).
void store_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& slots) {
  for (const at::Tensor* t : {&k, &v, static_cast<const at::Tensor*>(&k_cache),
                               static_cast<const at::Tensor*>(&v_cache)}) {
    check_f32(*t, "k/v and caches");
  }
  TORCH_CHECK(k.dim() == 3 && k.sizes() == v.sizes() && k_cache.dim() == 3, "bad K/V shapes");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == k.size(0), "bad slot mapping");
  const int64_t tokens = k.size(0), kvh = k.size(1), d = k.size(2), num_slots = k_cache.size(1);
  TORCH_CHECK(k_cache.size(0) == kvh && k_cache.size(2) == d && v_cache.sizes() == k_cache.sizes(),
              "cache shape does not match K/V");
  const int64_t* sl = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(sl[t] >= 0 && sl[t] < num_slots, "bad slot");
  const float *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  float *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>();
  const int64_t kst = k.stride(0), ksh = k.stride(1), vst = v.stride(0), vsh = v.stride(1);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < kvh; ++h) {
      std::copy_n(kp + t * kst + h * ksh, d, kc + (h * num_slots + sl[t]) * d);
      std::copy_n(vp + t * vst + h * vsh, d, vc + (h * num_slots + sl[t]) * d);
    }
  }
}

// ---- decode attention helpers: one query head against its row's keys (len rows of d floats) ----
namespace {

void attend_scalar(const float* q, const float* const* keys, const float* const* values,
                   int64_t len, int64_t d, float scale, float* s, float* out) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < len; ++i) m = std::max(m, s[i] = dot(q, keys[i], d) * scale);
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

// d % 8 == 0. Scores with two FMA chains and one horizontal sum per key; the weighted sum of
// values in chunks of 64 features held in 8 registers (the values are re-read per chunk from L1).
void attend_avx2(const float* q, const float* const* keys, const float* const* values,
                 int64_t len, int64_t d, float scale, float* s, float* out) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < len; ++i) {
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
  const __m256 mv = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
    _mm256_storeu_ps(s + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  float total = hsum(sum);
  for (; i < len; ++i) total += (s[i] = std::exp(s[i] - m));
  const __m256 inv = _mm256_set1_ps(1.f / total);
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
void attend_avx2(const float* q, const float* const* keys, const float* const* values,
                 int64_t len, int64_t d, float scale, float* s, float* out) {
  attend_scalar(q, keys, values, len, d, scale, s, out);
}
#endif

}  // namespace

// One query token per row, read straight from the paged cache (no gather copy):
// q [B, H, D] (any row/head strides), caches [KVH, num_blocks * block_size, D],
// block_tables [B, W] int64 (padded), first / seq_lens [B] int64: row b attends the keys at
// positions first[b] <= p < seq_lens[b]. Query head h reads KV head h / (H / KVH) (GQA, as
// transformers' repeat_kv). Returns [B, H, D]. Exact (two-pass) softmax per query head; the query
// heads of one KV head run back to back, so their K/V rows come from L2 after the first.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables,
                            const at::Tensor& first, const at::Tensor& seq_lens,
                            int64_t block_size, double scale) {
  check_f32(q, "q");
  check_f32(k_cache, "k_cache");
  check_f32(v_cache, "v_cache");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes(),
              "bad attention shapes");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  for (const at::Tensor* t : {&block_tables, &first, &seq_lens}) {
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "int64 metadata expected");
  }
  const int64_t rows = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t kvh = k_cache.size(0), num_slots = k_cache.size(1), width = block_tables.size(1);
  TORCH_CHECK(k_cache.size(2) == d && heads % kvh == 0, "head counts do not match the cache");
  TORCH_CHECK(block_tables.size(0) == rows && first.numel() == rows && seq_lens.numel() == rows,
              "one block table, first and length per row");
  const int64_t group = heads / kvh;
  const int64_t *tables = block_tables.data_ptr<int64_t>(), *fp = first.data_ptr<int64_t>(),
                *lp = seq_lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < rows; ++b) {
    TORCH_CHECK(0 <= fp[b] && fp[b] < lp[b] && lp[b] <= width * block_size, "bad key range");
    for (int64_t i = fp[b] / block_size; i < (lp[b] + block_size - 1) / block_size; ++i) {
      const int64_t blk = tables[b * width + i];
      TORCH_CHECK(blk >= 0 && (blk + 1) * block_size <= num_slots, "block id out of range");
    }
  }
  auto out = at::empty({rows, heads, d}, q.options());
  const float *qp = q.data_ptr<float>(), *kc = k_cache.data_ptr<float>(),
              *vc = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t qsr = q.stride(0), qsh = q.stride(1);
  const float sc = static_cast<float>(scale);

  const bool vectorized = kVectorized && d % 8 == 0;
  at::parallel_for(0, rows * kvh, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<const float*> keys, values;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kvh, h = task % kvh, lo = fp[b], len = lp[b] - lo;
      const int64_t* table = tables + b * width;
      keys.resize(len);
      values.resize(len);
      for (int64_t i = 0; i < len; ++i) {  // the rows of positions lo.., wherever their block is
        const int64_t slot = table[(lo + i) / block_size] * block_size + (lo + i) % block_size;
        keys[i] = kc + (h * num_slots + slot) * d;
        values[i] = vc + (h * num_slots + slot) * d;
      }
      scores.resize(len);
      for (int64_t g = 0; g < group; ++g) {  // each query head of the group, keys from L2
        const float* query = qp + b * qsr + (h * group + g) * qsh;
        float* o = op + (b * heads + h * group + g) * d;
        if (vectorized) {
          attend_avx2(query, keys.data(), values.data(), len, d, sc, scores.data(), o);
        } else {
          attend_scalar(query, keys.data(), values.data(), len, d, sc, scores.data(), o);
        }
      }
    }
  });
  return out;
}


// x [T, 2I] contiguous = [gate | up] -> silu(gate) * up [T, I] (the gated MLP's activation).
at::Tensor silu_and_mul(const at::Tensor& x) {
  check_f32(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % 2 == 0, "x must be [T, 2I]");
  const int64_t rows = x.size(0), inter = x.size(1) / 2;
  auto out = at::empty({rows, inter}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float *gate = xp + r * 2 * inter, *up = gate + inter;
      float* o = op + r * inter;
      int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
      const __m256 one = _mm256_set1_ps(1.f);
      for (; i + 8 <= inter; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp_ps(_mm256_sub_ps(
                                                                  _mm256_setzero_ps(), g))));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
      }
#endif
      for (; i < inter; ++i) o[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
    }
  });
  return out;
}

// ---- linear on packed weights: y [M, C * n] = x [M, K] @ W, W as column tiles wt [C, K, n] ------
// The layers pack W [N, K] as [N / 16, K, 16] (n = 16), so each 16-column tile is one contiguous
// stream. Each tile is streamed once per 6 rows of x and reused from L2 for the next 6 rows;
// accumulators stay in registers for the whole K loop (6 x 16 floats = 12 ymm registers), one
// broadcast of x per row and k. Against MKL sgemm on the same shapes (docs/PERFORMANCE.md): about
// 2x at 2-6 rows, 1.5x at 16, equal at prefill sizes (~95 GFLOP/s, the machine's peak).
namespace {

constexpr int64_t kRowBlock = 6;
constexpr int64_t kTile = 16;

#if defined(__AVX2__) && defined(__FMA__)
// Accumulators are named variables, not an array: GCC keeps an array's registers but also
// stores them to the stack every iteration, which made the loop store-bound (3x slower).
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

// One row (GEMV): k unrolled by 4 with separate accumulators (8 independent FMA chains).
inline void tile_1x16(const float* x, const float* w, int64_t wn, int64_t k_len, float* y,
                      const float* bias) {
  __m256 a[8];
  for (auto& r : a) r = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 3 < k_len; k += 4) {
    for (int u = 0; u < 4; ++u) {
      const __m256 xb = _mm256_broadcast_ss(x + k + u);
      a[2 * u] = _mm256_fmadd_ps(xb, _mm256_loadu_ps(w + (k + u) * wn), a[2 * u]);
      a[2 * u + 1] = _mm256_fmadd_ps(xb, _mm256_loadu_ps(w + (k + u) * wn + 8), a[2 * u + 1]);
    }
  }
  for (; k < k_len; ++k) {
    const __m256 xb = _mm256_broadcast_ss(x + k);
    a[0] = _mm256_fmadd_ps(xb, _mm256_loadu_ps(w + k * wn), a[0]);
    a[1] = _mm256_fmadd_ps(xb, _mm256_loadu_ps(w + k * wn + 8), a[1]);
  }
  __m256 lo = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[4], a[6]));
  __m256 hi = _mm256_add_ps(_mm256_add_ps(a[1], a[3]), _mm256_add_ps(a[5], a[7]));
  if (bias) {
    lo = _mm256_add_ps(lo, _mm256_loadu_ps(bias));
    hi = _mm256_add_ps(hi, _mm256_loadu_ps(bias + 8));
  }
  _mm256_storeu_ps(y, lo);
  _mm256_storeu_ps(y + 8, hi);
}

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

void tile_rows(int64_t rows, const float* x, int64_t xs, const float* w, int64_t wn,
               int64_t k_len, float* y, int64_t ys, const float* bias) {
  switch (rows) {
    case 6: return tile_6x16<6>(x, xs, w, wn, k_len, y, ys, bias);
    case 5: return tile_6x16<5>(x, xs, w, wn, k_len, y, ys, bias);
    case 4: return tile_6x16<4>(x, xs, w, wn, k_len, y, ys, bias);
    case 3: return tile_6x16<3>(x, xs, w, wn, k_len, y, ys, bias);
    case 2: return tile_6x16<2>(x, xs, w, wn, k_len, y, ys, bias);
    default: return tile_1x16(x, w, wn, k_len, y, bias);
  }
}
#endif

// Columns [j0, j1) of one block for every row, without SIMD (tails and non-AVX2 builds).
void columns_scalar(int64_t rows, const float* x, int64_t xs, const float* w, int64_t wn,
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

}  // namespace

at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& wt,
                          const std::optional<at::Tensor>& bias) {
  check_f32(x, "x");
  check_f32(wt, "wt");
  TORCH_CHECK(x.dim() == 2, "x must be [M, K]");
  TORCH_CHECK(wt.is_contiguous() && (wt.dim() == 2 || wt.dim() == 3), "wt must be [C, K, n]");
  const auto w3 = wt.dim() == 3 ? wt : wt.unsqueeze(0);
  const int64_t rows = x.size(0), k_len = x.size(1);
  const int64_t blocks = w3.size(0), n = w3.size(2), cols = blocks * n;
  TORCH_CHECK(w3.size(1) == k_len, "x and wt disagree on K");
  const float* bp = nullptr;
  if (bias.has_value()) {
    check_f32(*bias, "bias");
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == cols, "bias must be [C * n]");
    bp = bias->data_ptr<float>();
  }
  auto y = at::empty({rows, cols}, x.options());
  const float *xp = x.data_ptr<float>(), *wp = w3.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t xs = x.stride(0), tiles_per_block = n / kTile, full = tiles_per_block * kTile;
  at::parallel_for(0, blocks * tiles_per_block, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t c = t / tiles_per_block, j = (t % tiles_per_block) * kTile;
      const float* w = wp + c * k_len * n + j;
      for (int64_t m0 = 0; m0 < rows; m0 += kRowBlock) {
        const int64_t mb = std::min(kRowBlock, rows - m0);
        float* out = yp + m0 * cols + c * n + j;
        const float* b = bp ? bp + c * n + j : nullptr;
#if defined(__AVX2__) && defined(__FMA__)
        tile_rows(mb, xp + m0 * xs, xs, w, n, k_len, out, cols, b);
#else
        columns_scalar(mb, xp + m0 * xs, xs, w, n, k_len, 0, kTile, out, cols, b);
#endif
      }
    }
  });
  if (full < n) {  // the last n % 16 columns of every block
    for (int64_t c = 0; c < blocks; ++c) {
      columns_scalar(rows, xp, xs, wp + c * k_len * n, n, k_len, full, n, yp + c * n, cols,
                     bp ? bp + c * n : nullptr);
    }
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dimension (fp32)");
  m.def("add_rms_norm_", &add_rms_norm_, "residual += x; RMSNorm(residual) (fp32)");
  m.def("rotary_", &rotary_, "in-place rotate-half RoPE (fp32)");
  m.def("store_kv", &store_kv, "write K/V rows into the head-major paged cache (fp32)");
  m.def("decode_attention", &decode_attention, "one-token attention over the paged cache (fp32)");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up of a fused [gate | up] row (fp32)");
  m.def("linear_packed", &linear_packed, "x @ W with W packed as column tiles [C, K, n] (fp32)",
        pybind11::arg("x"), pybind11::arg("wt"), pybind11::arg("bias") = pybind11::none());
}
