// Attention of pytgi's CPU kernels: the KV cache formats (how a key or value row is stored and
// read back), and the one per-row attention routine every phase runs (decode rows, verify rows,
// short chunks as decode rows, the flash-style prefill of a first chunk and its paged twin for
// later chunks), so a query row's output has the same bits whichever kernel computes it
// (docs/KERNELS.md, "Row invariance"). Used by ops.cpp and decode_stack.cpp.
//
// The routine, per query row at position t seeing keys lo <= p <= t: the keys are walked in
// 64-key blocks aligned to absolute positions (block k0 = 64 * i holds positions k0 .. k0 + 63);
// per block S = q . K^T as one FMA chain per key over the features (the packed-GEMM register
// tiles, `packed_tile`), the soft-cap / ALiBi modifiers, -inf where a key is not visible, an
// online-softmax update (running max and sum, the row's output rescaled when the max grows), and
// O += P V as one chain per feature over the block's keys. A key that is not visible gets a
// probability of exactly 0, so blocks or keys a row cannot see (a longer chunk's later queries,
// a window's start) leave its numbers untouched: the result depends on t, lo and the keys only.
#pragma once

#include "common.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include <array>
#include <cstring>

namespace pytgi {

// ---- KV cache formats ----------------------------------------------------------------------
// The caches are [KVH, slots, row] per layer; a row holds one token's head_dim values:
//   f32 / bf16 / f16 / fp8 (e4m3fn, e5m2): head_dim elements, read as element * the layer's
//     scale (fp8_e4m3fn's checkpoint k_scale / v_scale; 1.0 otherwise), written as
//     x / scale clamped to the format's finite range, rounded to nearest even (torch's `.to()`);
//   int8: head_dim int8 values, then the row's own fp32 scale (4 bytes): written as
//     round(x / s) with s = max|x| / 127 over the row (0 when the row is 0), read as q * s.
enum KvFormat : int64_t { kKvF32 = 0, kKvBF16 = 1, kKvF16 = 2, kKvE4M3 = 3, kKvE5M2 = 4, kKvI8 = 5 };

inline int64_t kv_row_bytes(KvFormat fmt, int64_t d) {
  switch (fmt) {
    case kKvF32: return 4 * d;
    case kKvBF16:
    case kKvF16: return 2 * d;
    case kKvI8: return d + 4;
    default: return d;
  }
}

inline KvFormat kv_format_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return kKvF32;
    case at::kBFloat16: return kKvBF16;
    case at::kHalf: return kKvF16;
    case at::kFloat8_e4m3fn: return kKvE4M3;
    case at::kFloat8_e5m2: return kKvE5M2;
    case at::kChar: return kKvI8;
    default: TORCH_CHECK(false, "unsupported KV cache dtype ", t);
  }
}

// Every fp8 byte's value (exact; the same conversion torch uses).
template <class F8>
inline const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) {
      t[i] = static_cast<float>(F8(static_cast<uint8_t>(i), F8::from_bits()));
    }
    return t;
  }();
  return table;
}

// One KV head's K (or V) rows in a cache: row `slot` at base + slot * row_bytes.
struct KvRows {
  const uint8_t* base = nullptr;
  int64_t row_bytes = 0;
  KvFormat fmt = kKvF32;
  float scale = 1.f;  // the layer's (fp8_e4m3fn's checkpoint scale), 1.0 otherwise

  // Row `slot`'s d values, read back as floats: dst[c * stride], c < d. Every conversion is
  // exact; times the scale is one rounding (as torch's `stored.float() * scale`).
  void load(int64_t slot, int64_t d, float* dst, int64_t stride) const {
    const uint8_t* row = base + slot * row_bytes;
    switch (fmt) {
      case kKvF32: {
        const float* x = reinterpret_cast<const float*>(row);
        if (scale == 1.f) {
          for (int64_t c = 0; c < d; ++c) dst[c * stride] = x[c];
        } else {
          for (int64_t c = 0; c < d; ++c) dst[c * stride] = x[c] * scale;
        }
        return;
      }
      case kKvBF16: {
        const uint16_t* x = reinterpret_cast<const uint16_t*>(row);
        for (int64_t c = 0; c < d; ++c) {
          const uint32_t bits = static_cast<uint32_t>(x[c]) << 16;
          float f;
          std::memcpy(&f, &bits, 4);
          dst[c * stride] = f * scale;
        }
        return;
      }
      case kKvF16: {
        const c10::Half* x = reinterpret_cast<const c10::Half*>(row);
        for (int64_t c = 0; c < d; ++c) dst[c * stride] = static_cast<float>(x[c]) * scale;
        return;
      }
      case kKvE4M3:
      case kKvE5M2: {
        const auto& t = fmt == kKvE4M3 ? fp8_table<c10::Float8_e4m3fn>()
                                       : fp8_table<c10::Float8_e5m2>();
        for (int64_t c = 0; c < d; ++c) dst[c * stride] = t[row[c]] * scale;
        return;
      }
      case kKvI8: {
        const int8_t* x = reinterpret_cast<const int8_t*>(row);
        float s;
        std::memcpy(&s, row + d, 4);
        for (int64_t c = 0; c < d; ++c) dst[c * stride] = static_cast<float>(x[c]) * s;
        return;
      }
    }
  }
};

template <class T>
inline void encode_row(const float* x, int64_t d, float scale, float limit, T* out) {
  for (int64_t c = 0; c < d; ++c) {
    const float v = scale == 1.f ? x[c] : x[c] / scale;
    out[c] = T(std::min(std::max(v, -limit), limit));
  }
}

// x [d] -> row `slot` of a cache of format fmt (see above; scale: the layer's).
inline void store_row(uint8_t* base, KvFormat fmt, float scale, int64_t slot, const float* x,
                      int64_t d) {
  uint8_t* row = base + slot * kv_row_bytes(fmt, d);
  switch (fmt) {
    case kKvF32:
      if (scale == 1.f) {
        std::memcpy(row, x, 4 * d);
      } else {
        float* y = reinterpret_cast<float*>(row);
        for (int64_t c = 0; c < d; ++c) y[c] = x[c] / scale;
      }
      return;
    case kKvBF16:
      return encode_row(x, d, scale, static_cast<float>(std::numeric_limits<c10::BFloat16>::max()),
                        reinterpret_cast<c10::BFloat16*>(row));
    case kKvF16:
      return encode_row(x, d, scale, 65504.f, reinterpret_cast<c10::Half*>(row));
    case kKvE4M3:
      return encode_row(x, d, scale, 448.f, reinterpret_cast<c10::Float8_e4m3fn*>(row));
    case kKvE5M2:
      return encode_row(x, d, scale, 57344.f, reinterpret_cast<c10::Float8_e5m2*>(row));
    case kKvI8: {
      float amax = 0.f;
      for (int64_t c = 0; c < d; ++c) amax = std::max(amax, std::fabs(x[c]));
      const float s = amax / 127.f;
      int8_t* y = reinterpret_cast<int8_t*>(row);
      for (int64_t c = 0; c < d; ++c) {
        const float q = s > 0.f ? std::nearbyint(x[c] / s) : 0.f;
        y[c] = static_cast<int8_t>(std::min(std::max(q, -127.f), 127.f));
      }
      std::memcpy(row + d, &s, 4);
      return;
    }
  }
}

// A layer's K or V cache [KVH, slots, row bytes] as rows of one KV head.
inline KvRows kv_head_rows(const at::Tensor& cache, int64_t head, float scale) {
  const KvFormat fmt = kv_format_of(cache.scalar_type());
  const int64_t row_bytes = cache.size(2) * cache.element_size();
  return {static_cast<const uint8_t*>(cache.data_ptr()) + head * cache.size(1) * row_bytes,
          row_bytes, fmt, scale};
}

// One layer's K or V cache [KVH, num_slots, row] (the fused decode stack's view): its format, the
// layer's scale, and the rows of each head.
struct KvCache {
  uint8_t* data = nullptr;
  KvFormat fmt = kKvF32;
  float scale = 1.f;
  int64_t num_slots = 0, d = 0;

  KvRows head(int64_t h) const {
    const int64_t rb = kv_row_bytes(fmt, d);
    return {data + h * num_slots * rb, rb, fmt, scale};
  }
  // x [d] -> head h's row at `slot`.
  void store(int64_t h, int64_t slot, const float* x) const {
    store_row(data + h * num_slots * kv_row_bytes(fmt, d), fmt, scale, slot, x, d);
  }
};

// A cache's head_dim: its rows' width, less int8's 4 scale bytes.
inline int64_t kv_head_dim(const at::Tensor& cache) {
  return cache.scalar_type() == at::kChar ? cache.size(2) - 4 : cache.size(2);
}

inline KvCache kv_cache_of(const at::Tensor& cache, float scale) {
  return {static_cast<uint8_t*>(cache.data_ptr()), kv_format_of(cache.scalar_type()), scale,
          cache.size(1), kv_head_dim(cache)};
}

// ---- score modifiers ------------------------------------------------------------------------

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

// s[j] <- mods(s[j] * scale) with key j at distance origin + j from the query, over n scores.
// The soft-cap's tanh is vectorised where AVX2 is there.
inline void apply_mods(float* s, int64_t n, float scale, const ScoreMods& mods, int64_t origin) {
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const bool capped = mods.softcap > 0.f;
  const __m256 sv = _mm256_set1_ps(capped ? scale / mods.softcap : scale);
  const __m256 cap = _mm256_set1_ps(capped ? mods.softcap : 1.f);
  const __m256 step = _mm256_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f);
  const __m256 slope = _mm256_set1_ps(mods.slope);
  for (; j + 8 <= n; j += 8) {
    __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + j), sv);
    if (capped) x = _mm256_mul_ps(tanh_ps(x), cap);
    const __m256 dist = _mm256_add_ps(_mm256_set1_ps(static_cast<float>(origin + j)), step);
    _mm256_storeu_ps(s + j, _mm256_fmadd_ps(slope, dist, x));
  }
#endif
  for (; j < n; ++j) s[j] = apply_mods_scalar(s[j] * scale, mods, static_cast<float>(origin + j));
}

// s[i] <- exp(s[i] * scale - shift) over n values (exactly 0 where s[i] is -inf); returns their
// sum (the softmax's numerators and denominator).
inline float exp_shifted_sum(float* s, int64_t n, float scale, float shift) {
  float total = 0.f;
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 sv = _mm256_set1_ps(scale), mv = _mm256_set1_ps(shift);
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 sum = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(s + i);
    const __m256 hidden = _mm256_cmp_ps(x, ninf, _CMP_EQ_OQ);  // exp_ps clamps: ~1e-38, not 0
    const __m256 e = _mm256_andnot_ps(hidden, exp_ps(_mm256_fmsub_ps(x, sv, mv)));
    _mm256_storeu_ps(s + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  total = hsum(sum);
#endif
  for (; i < n; ++i) total += (s[i] = std::exp(s[i] * scale - shift));
  return total;
}

// ---- the per-row routine ----------------------------------------------------------------------

constexpr int64_t kKeyBlock = 64;  // 4 column tiles of 16

// y [rows, cols] (row stride ys) = x [rows, k_len] (row stride xs) @ w [k_len, cols] (row stride
// wn): the packed-GEMM register tiles for each 16 columns, the scalar chain for the rest. Each
// (row, column) is one chain over k whatever `rows` is (docs/KERNELS.md).
inline void tiles_gemm(int64_t rows, const float* x, int64_t xs, const float* w, int64_t wn,
                       int64_t k_len, int64_t cols, float* y, int64_t ys) {
  const int64_t full = cols / kTile * kTile;
  for (int64_t j = 0; j < full; j += kTile) {
    packed_tile(rows, x, xs, w + j, wn, k_len, y + j, ys, nullptr);
  }
  if (full < cols) columns_scalar(rows, x, xs, w, wn, k_len, full, cols, y, ys, nullptr);
}

// One row's online-softmax update with this key block's scores s[0, n) (-inf where hidden):
// returns the factor the row's running output must be multiplied by; s becomes the
// probabilities exp(s * scale - new max) (0 where hidden); max and sum are in scaled units.
inline float softmax_update(float* s, int64_t n, float scale, float& max, float& sum) {
  float block_max = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 mv8 = _mm256_set1_ps(block_max);
  for (; i + 8 <= n; i += 8) mv8 = _mm256_max_ps(mv8, _mm256_loadu_ps(s + i));
  block_max = hmax(mv8);
#endif
  for (; i < n; ++i) block_max = std::max(block_max, s[i]);
  block_max *= scale;
  if (block_max == -std::numeric_limits<float>::infinity()) {  // nothing visible here
    std::fill(s, s + n, 0.f);
    return 1.f;
  }
  const float new_max = std::max(max, block_max);
  const float correction =
      max == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(max - new_max);
  sum = sum * correction + exp_shifted_sum(s, n, scale, new_max);
  max = new_max;
  return correction;
}

// Query rows that share one KV head: row r at q + r * qs, at position pos0 + r * pos_step,
// seeing keys from lo0 + r * lo_step up to its position; its ALiBi slope slopes[r * slope_step]
// (slopes null: none).
struct QueryRows {
  const float* q;
  int64_t qs, n;
  int64_t pos0, pos_step, lo0, lo_step;
  float softcap;
  const float* slopes;
  int64_t slope_step;
};

struct AttendScratch {  // one thread's, reused across calls
  std::vector<float> kt, v, scores, pv, out, max, sum;

  void start(int64_t rows, int64_t d) {
    kt.resize(d * kKeyBlock);
    v.resize(kKeyBlock * d);
    scores.resize(rows * kKeyBlock);
    pv.resize(rows * d);
    out.assign(rows * d, 0.f);
    max.assign(rows, -std::numeric_limits<float>::infinity());
    sum.assign(rows, 0.f);
  }
};

// The key block at k0 (K^T tile kt [d, 64], V rows v [nk, d] of keys k0 .. k0 + nk - 1; nk
// covers every key the rows may see in it) for every row of `rows`.
inline void attend_key_block(const QueryRows& rows, const float* kt, const float* v, int64_t k0,
                             int64_t nk, int64_t d, float scale, AttendScratch& w) {
  tiles_gemm(rows.n, rows.q, rows.qs, kt, kKeyBlock, d, kKeyBlock, w.scores.data(), kKeyBlock);
  for (int64_t r = 0; r < rows.n; ++r) {
    const int64_t t = rows.pos0 + r * rows.pos_step, lo = rows.lo0 + r * rows.lo_step;
    float* s = w.scores.data() + r * kKeyBlock;
    const ScoreMods mods{rows.softcap, rows.slopes == nullptr ? 0.f : rows.slopes[r * rows.slope_step]};
    float row_scale = scale;
    if (mods.active()) {  // scaled and modified now; the mask below overwrites what is hidden
      apply_mods(s, kKeyBlock, scale, mods, k0 - t);
      row_scale = 1.f;
    }
    if (k0 < lo || k0 + kKeyBlock - 1 > t) {  // some key of the block is hidden from the row
      for (int64_t j = 0; j < kKeyBlock; ++j) {
        const int64_t pos = k0 + j;
        if (pos > t || pos < lo) s[j] = -std::numeric_limits<float>::infinity();
      }
    }
    const float correction = softmax_update(s, kKeyBlock, row_scale, w.max[r], w.sum[r]);
    if (correction != 1.f) {
      float* o = w.out.data() + r * d;
      for (int64_t c = 0; c < d; ++c) o[c] *= correction;
    }
  }
  tiles_gemm(rows.n, w.scores.data(), kKeyBlock, v, d, nk, d, w.pv.data(), d);
  for (int64_t i = 0; i < rows.n * d; ++i) w.out[i] += w.pv[i];
}

// out row r (stride os) = the rows' normalised outputs.
inline void finish_rows(const QueryRows& rows, int64_t d, const AttendScratch& w, float* out,
                        int64_t os) {
  for (int64_t r = 0; r < rows.n; ++r) {
    const float inv = 1.f / w.sum[r];
    const float* o = w.out.data() + r * d;
    float* y = out + r * os;
    for (int64_t c = 0; c < d; ++c) y[c] = o[c] * inv;
  }
}

// The keys k0 .. k0 + nk - 1 of one KV head as a K^T tile kt [d, 64] and V rows v [nk, d],
// read through slot(p) from the K and V rows (converted to fp32 as they are read); keys below lo
// and the tile's columns from nk on are zeros (no row sees them: their probabilities are 0).
#if defined(__AVX2__) && defined(__FMA__)
// dst[i * kKeyBlock + r] = rows[r][c + i] for r, i < 8: an 8x8 transpose (data movement only).
inline void transpose8(const float* const* rows, int64_t c, float* dst) {
  const __m256 r0 = _mm256_loadu_ps(rows[0] + c), r1 = _mm256_loadu_ps(rows[1] + c),
               r2 = _mm256_loadu_ps(rows[2] + c), r3 = _mm256_loadu_ps(rows[3] + c),
               r4 = _mm256_loadu_ps(rows[4] + c), r5 = _mm256_loadu_ps(rows[5] + c),
               r6 = _mm256_loadu_ps(rows[6] + c), r7 = _mm256_loadu_ps(rows[7] + c);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
               t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
               t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
               t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)),
               s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)),
               s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)),
               s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2)),
               s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)),
               s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2)),
               s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)),
               s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  _mm256_storeu_ps(dst + 0 * kKeyBlock, _mm256_permute2f128_ps(s0, s4, 0x20));
  _mm256_storeu_ps(dst + 1 * kKeyBlock, _mm256_permute2f128_ps(s1, s5, 0x20));
  _mm256_storeu_ps(dst + 2 * kKeyBlock, _mm256_permute2f128_ps(s2, s6, 0x20));
  _mm256_storeu_ps(dst + 3 * kKeyBlock, _mm256_permute2f128_ps(s3, s7, 0x20));
  _mm256_storeu_ps(dst + 4 * kKeyBlock, _mm256_permute2f128_ps(s0, s4, 0x31));
  _mm256_storeu_ps(dst + 5 * kKeyBlock, _mm256_permute2f128_ps(s1, s5, 0x31));
  _mm256_storeu_ps(dst + 6 * kKeyBlock, _mm256_permute2f128_ps(s2, s6, 0x31));
  _mm256_storeu_ps(dst + 7 * kKeyBlock, _mm256_permute2f128_ps(s3, s7, 0x31));
}
#endif

template <class Slot>
inline void gather_key_block(const KvRows& k, const KvRows& v, const Slot& slot, int64_t k0,
                             int64_t lo, int64_t nk, int64_t d, float* kt, float* vt) {
  std::fill(kt, kt + d * kKeyBlock, 0.f);
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (k.fmt == kKvF32 && k.scale == 1.f && d % 8 == 0) {  // fp32 keys: 8 at a time
    for (j = std::max<int64_t>(0, lo - k0); j + 8 <= nk; j += 8) {
      const float* rows[8];
      for (int64_t r = 0; r < 8; ++r) {
        const int64_t s = slot(k0 + j + r);
        rows[r] = reinterpret_cast<const float*>(k.base + s * k.row_bytes);
        v.load(s, d, vt + (j + r) * d, 1);
      }
      for (int64_t c = 0; c < d; c += 8) transpose8(rows, c, kt + c * kKeyBlock + j);
    }
    for (int64_t i = 0; i < std::min(nk, std::max<int64_t>(0, lo - k0)); ++i) {
      std::fill(vt + i * d, vt + (i + 1) * d, 0.f);  // the keys below lo
    }
  }
#endif
  for (; j < nk; ++j) {
    const int64_t p = k0 + j;
    if (p < lo) {
      std::fill(vt + j * d, vt + (j + 1) * d, 0.f);
      continue;
    }
    const int64_t s = slot(p);
    k.load(s, d, kt + j, kKeyBlock);
    v.load(s, d, vt + j * d, 1);
  }
}

// The `group` query heads of one KV head in one decode row (head g at q + g * q_head_stride)
// against the row's positions [first, first + len), read in place from the head's cache rows
// through the row's block table -> out + g * d. softcap > 0 caps the scores; slopes (null: no
// ALiBi) holds the group's ALiBi slopes.
inline void attend_kv_head(const float* q, int64_t q_head_stride, int64_t group,
                           const int64_t* table, int64_t block_size, int64_t first, int64_t len,
                           const KvRows& k, const KvRows& v, int64_t d, float scale, float* out,
                           AttendScratch& scratch, float softcap = 0.f,
                           const float* slopes = nullptr) {
  const int64_t t = first + len - 1;
  const QueryRows rows{q, q_head_stride, group, t, 0, first, 0, softcap, slopes, 1};
  scratch.start(group, d);
  const auto slot = [&](int64_t p) { return table[p / block_size] * block_size + p % block_size; };
  for (int64_t k0 = first - first % kKeyBlock; k0 <= t; k0 += kKeyBlock) {
    const int64_t nk = std::min(kKeyBlock, t + 1 - k0);
    gather_key_block(k, v, slot, k0, first, nk, d, scratch.kt.data(), scratch.v.data());
    attend_key_block(rows, scratch.kt.data(), scratch.v.data(), k0, nk, d, scale, scratch);
  }
  finish_rows(rows, d, scratch, out, d);
}

// The same over fp32 caches given as one head's [slots, d] rows (the fused decode stack's).
inline void attend_kv_head(const float* q, int64_t q_head_stride, int64_t group,
                           const int64_t* table, int64_t block_size, int64_t first, int64_t len,
                           const float* k_head, const float* v_head, int64_t d, float scale,
                           float* out, AttendScratch& scratch, float softcap = 0.f,
                           const float* slopes = nullptr) {
  const KvRows k{reinterpret_cast<const uint8_t*>(k_head), 4 * d, kKvF32, 1.f};
  const KvRows v{reinterpret_cast<const uint8_t*>(v_head), 4 * d, kKvF32, 1.f};
  attend_kv_head(q, q_head_stride, group, table, block_size, first, len, k, v, d, scale, out,
                 scratch, softcap, slopes);
}

}  // namespace pytgi
