// pytgi's CPU kernels (fp32): a GEMM on packed weights that beats MKL at decode sizes, and fused
// ops that each replace a chain of small ATen calls on the decode hot path, where a batch-1 step
// was ~60 ATen calls per layer at ~2.5 us each (docs/PERFORMANCE.md, "Kernel choices"). They are
// optional: the Python callers keep the pure-torch path, which tests compare these against.
//
// Layouts (the callers' invariants, checked below):
//   activations  [T, ..., D] with the last dimension contiguous;
//   KV cache     [KVH, num_blocks * block_size, row] per layer (head-major, see attention.py): the
//                keys of block b, head h are the contiguous rows [b * block_size, (b+1) * block_size);
//                a row is one token's head_dim values in the cache's format (attention.h).
#include "attention.h"
#include "common.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <optional>
#include <vector>

using namespace pytgi;

namespace pytgi {
void register_decode_stack(pybind11::module& m);  // decode_stack.cpp
void register_quant(pybind11::module& m);         // quant_ops.cpp
void register_kquant(pybind11::module& m);        // kquant_ops.cpp
}

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
    for (int64_t r = begin; r < end; ++r) rms_row(op + r * d, xp + r * d, wp, d, eps);
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
      add_rms_row(op + r * d, rp + r * d, xp + r * d, 1.f, wp, d, eps);
    }
  });
  return out;
}

// LayerNorm over the last dimension: x [..., D] contiguous, weight [D], bias [D] or None.
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias, double eps) {
  check_f32(x, "x");
  check_f32(weight, "weight");
  if (bias.has_value()) check_f32(*bias, "bias");
  TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
  const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(d, 1);
  auto out = at::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) layer_norm_row(op + r * d, xp + r * d, wp, bp, d, eps);
  });
  return out;
}

// residual += x (in place), returns layer_norm(residual): the pre-norm block's "add then norm".
at::Tensor add_layer_norm_(const at::Tensor& x, at::Tensor& residual, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, double eps) {
  check_f32(x, "x");
  check_f32(residual, "residual");
  TORCH_CHECK(x.is_contiguous() && residual.is_contiguous() && x.sizes() == residual.sizes(),
              "x and residual must be contiguous tensors of the same shape");
  const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(d, 1);
  const float* xp = x.data_ptr<float>();
  float* rp = residual.data_ptr<float>();
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) rp[r * d + i] += xp[r * d + i];
    }
  });
  return layer_norm(residual, weight, bias, eps);
}

// In place, RoPE on the first rotary_dim features of every head: x [T, N, D] (any row/head
// strides), cos / sin [T, rd]. Rotate-half: cos = [c | c], sin = [-s | s], x[:rd] <- x[:rd] * cos
// + [x2 | x1] * sin; interleaved: cos = [c0, c0, ...], sin = [-s0, s0, ...], pairs (2i, 2i+1).
void rotary_(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  check_f32(x, "x");
  check_f32(cos, "cos");
  check_f32(sin, "sin");
  TORCH_CHECK(x.dim() == 3 && cos.dim() == 2 && cos.sizes() == sin.sizes(), "bad rotary shapes");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos/sin must be contiguous");
  const int64_t tokens = x.size(0), heads = x.size(1), rd = cos.size(1);
  TORCH_CHECK(cos.size(0) == tokens && rd <= x.size(2) && rd % 2 == 0, "bad rotary shapes");
  const int64_t st = x.stride(0), sh = x.stride(1);
  float* xp = x.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *c = cp + t * rd, *s = sp + t * rd;
      for (int64_t h = 0; h < heads; ++h) rotate(xp + t * st + h * sh, c, s, rd, interleaved);
    }
  });
}

// The caches' checks: [KVH, S, row] contiguous, K's and V's alike, a format of attention.h.
void check_caches(const at::Tensor& k_cache, const at::Tensor& v_cache) {
  TORCH_CHECK(k_cache.device().is_cpu() && k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "K and V caches must be CPU tensors [KVH, S, row] of one shape and dtype");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  kv_format_of(k_cache.scalar_type());
}

// k, v [T, KVH, D] fp32 (any row/head strides) -> k_cache, v_cache [KVH, S, row] at slots [T]
// (int64), in the caches' format (k_scale / v_scale: the layer's; see attention.h).
void store_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& slots, double k_scale, double v_scale) {
  check_f32(k, "k");
  check_f32(v, "v");
  check_caches(k_cache, v_cache);
  TORCH_CHECK(k.dim() == 3 && k.sizes() == v.sizes(), "bad K/V shapes");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == k.size(0), "bad slot mapping");
  const int64_t tokens = k.size(0), kvh = k.size(1), d = k.size(2), num_slots = k_cache.size(1);
  TORCH_CHECK(k_cache.size(0) == kvh && kv_head_dim(k_cache) == d,
              "cache shape does not match K/V");
  const int64_t* sl = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(sl[t] >= 0 && sl[t] < num_slots, "bad slot");
  const KvFormat fmt = kv_format_of(k_cache.scalar_type());
  const int64_t head_bytes = num_slots * kv_row_bytes(fmt, d);
  const float *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  uint8_t *kc = static_cast<uint8_t*>(k_cache.data_ptr()),
          *vc = static_cast<uint8_t*>(v_cache.data_ptr());
  const int64_t kst = k.stride(0), ksh = k.stride(1), vst = v.stride(0), vsh = v.stride(1);
  const float ks = static_cast<float>(k_scale), vs = static_cast<float>(v_scale);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < kvh; ++h) {
      store_row(kc + h * head_bytes, fmt, ks, sl[t], kp + t * kst + h * ksh, d);
      store_row(vc + h * head_bytes, fmt, vs, sl[t], vp + t * vst + h * vsh, d);
    }
  }
}

// ALiBi slopes [heads] fp32 contiguous, or null when none are given.
const float* alibi_slopes(const std::optional<at::Tensor>& alibi, int64_t heads) {
  if (!alibi.has_value()) return nullptr;
  check_f32(*alibi, "alibi");
  TORCH_CHECK(alibi->is_contiguous() && alibi->numel() == heads, "one ALiBi slope per head");
  return alibi->data_ptr<float>();
}

// One query token per row, read straight from the paged cache (no gather copy):
// q [B, H, D] (any row/head strides), caches [KVH, num_blocks * block_size, row] (any format of
// attention.h; k_scale / v_scale the layer's), block_tables [B, W] int64 (padded), first /
// seq_lens [B] int64: row b attends the keys at positions first[b] <= p < seq_lens[b]. Query head
// h reads KV head h / (H / KVH) (GQA, as transformers' repeat_kv). Returns [B, H, D]. Each row
// runs the per-row routine of attention.h (the prefill kernels' arithmetic); the query heads of
// one KV head run together as the rows of its register tiles. softcap > 0: scores ->
// softcap * tanh(scores / softcap); alibi [H] (optional): scores += alibi[h] * (key position -
// query position).
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables,
                            const at::Tensor& first, const at::Tensor& seq_lens,
                            int64_t block_size, double scale, double softcap,
                            const std::optional<at::Tensor>& alibi, double k_scale,
                            double v_scale) {
  check_f32(q, "q");
  check_caches(k_cache, v_cache);
  TORCH_CHECK(q.dim() == 3, "bad attention shapes");
  for (const at::Tensor* t : {&block_tables, &first, &seq_lens}) {
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "int64 metadata expected");
  }
  const int64_t rows = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t kvh = k_cache.size(0), num_slots = k_cache.size(1), width = block_tables.size(1);
  TORCH_CHECK(kv_head_dim(k_cache) == d && heads % kvh == 0, "head counts do not match the cache");
  TORCH_CHECK(block_tables.size(0) == rows && first.numel() == rows && seq_lens.numel() == rows,
              "one block table, first and length per row");
  const int64_t group = heads / kvh;
  const float* slopes = alibi_slopes(alibi, heads);
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
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t qsr = q.stride(0), qsh = q.stride(1);
  const float sc = static_cast<float>(scale);

  at::parallel_for(0, rows * kvh, 1, [&](int64_t begin, int64_t end) {
    AttendScratch scratch;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kvh, h = task % kvh;
      attend_kv_head(qp + b * qsr + h * group * qsh, qsh, group, tables + b * width, block_size,
                     fp[b], lp[b] - fp[b], kv_head_rows(k_cache, h, static_cast<float>(k_scale)),
                     kv_head_rows(v_cache, h, static_cast<float>(v_scale)), d, sc,
                     op + (b * heads + h * group) * d, scratch, static_cast<float>(softcap),
                     slopes == nullptr ? nullptr : slopes + h * group);
    }
  });
  return out;
}

// x [T, 2I] contiguous = [gate | up] -> gelu(gate) * up [T, I] (exact, or the tanh form).
at::Tensor gelu_and_mul(const at::Tensor& x, bool tanh_approximation) {
  check_f32(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % 2 == 0, "x must be [T, 2I]");
  const int64_t rows = x.size(0), inter = x.size(1) / 2;
  const int64_t act = tanh_approximation ? kGeluTanh : kGelu;
  auto out = at::empty({rows, inter}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = xp + r * 2 * inter;
      act_row(op + r * inter, gate, gate + inter, inter, act);
    }
  });
  return out;
}

// x [..., n] contiguous -> gelu(x) (exact, or the tanh form): a plain MLP's activation.
at::Tensor gelu(const at::Tensor& x, bool tanh_approximation) {
  check_f32(x, "x");
  TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(n, 1);
  const int64_t act = tanh_approximation ? kGeluTanh : kGelu;
  auto out = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) act_row(op + r * n, xp + r * n, nullptr, n, act);
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
      const float* gate = xp + r * 2 * inter;
      silu_mul_row(op + r * inter, gate, gate + inter, inter);
    }
  });
  return out;
}

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
      packed_tile(rows, xp, xs, wp + c * k_len * n + j, n, k_len, yp + c * n + j, cols,
                  bp ? bp + c * n + j : nullptr);
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

// ---- prefill attention: causal (optionally windowed), GQA, flash-style -------------------------
// Queries at positions start.. attend keys s with t - window < s <= t (window 0: all s <= t),
// taken from this step's K/V (a fresh prompt) or from the paged cache (a later chunk, a prefix
// hit: the step's own K/V are already stored there). Per KV head the visible keys are first
// gathered once (converted to fp32 from the cache's format): K^T as 64-key tiles [d, 64], V as
// contiguous rows. Each task is then one query head and a block of kQueryBlock queries walking
// the key blocks up to its last query with the per-row routine of attention.h (so each query's
// bits are a decode row's), no [queries, keys] matrix formed and nothing above the diagonal
// computed.
namespace {

constexpr int64_t kQueryBlock = 48;  // 8 register row-blocks of 6

// q [n, H, D] at positions start..start + n - 1 -> [n, H, D]; k_rows(h) / v_rows(h) are KV head
// h's rows and slot(p) the row of position p (every p < start + n the queries may see); softcap
// and slopes (null: no ALiBi) as in decode_attention.
template <class Slot>
at::Tensor flash_attention(const at::Tensor& q, int64_t kvh, int64_t start, double scale,
                           int64_t window, float softcap, const float* slopes,
                           const std::vector<KvRows>& k_rows, const std::vector<KvRows>& v_rows,
                           const Slot& slot) {
  const int64_t n = q.size(0), heads = q.size(1), d = q.size(2);
  TORCH_CHECK(kvh > 0 && heads % kvh == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(d % kTile == 0, "head_dim must be a multiple of 16");
  TORCH_CHECK(window >= 0 && start >= 0, "window and start must be >= 0");
  auto out = at::empty({n, heads, d}, q.options());
  if (n == 0) return out;
  const int64_t first_needed = window > 0 ? std::max<int64_t>(0, start - window + 1) : 0;
  const int64_t key_base = first_needed - first_needed % kKeyBlock, key_end = start + n;
  const int64_t key_blocks = (key_end - key_base + kKeyBlock - 1) / kKeyBlock;
  auto kt = at::empty({kvh, key_blocks, d, kKeyBlock}, q.options());
  auto vc = at::empty({kvh, key_blocks * kKeyBlock, d}, q.options());
  float *ktp = kt.data_ptr<float>(), *vcp = vc.data_ptr<float>();
  at::parallel_for(0, kvh * key_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task / key_blocks, i = task % key_blocks, k0 = key_base + i * kKeyBlock;
      gather_key_block(k_rows[h], v_rows[h], slot, k0, first_needed,
                       std::min(kKeyBlock, key_end - k0), d, ktp + task * d * kKeyBlock,
                       vcp + task * kKeyBlock * d);
    }
  });
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t group = heads / kvh, blocks = (n + kQueryBlock - 1) / kQueryBlock;
  const float sc = static_cast<float>(scale);
  // Tasks are claimed one at a time, the largest blocks (most keys) first, so the threads end
  // together: a static split of the range would hand one thread all the long rows.
  std::atomic<int64_t> next_task{0};
  const int64_t num_tasks = heads * blocks;
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    AttendScratch scratch;
    for (int64_t task = next_task++; task < num_tasks; task = next_task++) {
      const int64_t h = task % heads, block = blocks - 1 - task / heads;
      const int64_t q0 = block * kQueryBlock, nq = std::min(kQueryBlock, n - q0);
      const int64_t first_pos = start + q0, last = first_pos + nq - 1;  // last query = last key
      const QueryRows rows{qp + h * q.stride(1) + q0 * q.stride(0), q.stride(0), nq, first_pos, 1,
                           window > 0 ? first_pos - window + 1 : 0, window > 0 ? 1 : 0, softcap,
                           slopes == nullptr ? nullptr : slopes + h, 0};
      const int64_t lo = std::max<int64_t>(0, rows.lo0);
      const float* kth = ktp + (h / group) * key_blocks * d * kKeyBlock;
      const float* vh = vcp + (h / group) * key_blocks * kKeyBlock * d;
      scratch.start(nq, d);
      for (int64_t k0 = std::max(key_base, lo - lo % kKeyBlock); k0 <= last; k0 += kKeyBlock) {
        const int64_t i = (k0 - key_base) / kKeyBlock;
        attend_key_block(rows, kth + i * d * kKeyBlock, vh + i * kKeyBlock * d, k0,
                         std::min(kKeyBlock, last + 1 - k0), d, sc, scratch);
      }
      finish_rows(rows, d, scratch, op + q0 * heads * d + h * d, heads * d);
    }
  });
  return out;
}

}  // namespace

// A fresh prompt: q [T, H, D], k / v [T, KVH, D] fp32 (any row/head strides, last dim
// contiguous), attended as they are (an fp32 cache's values; a narrower cache's prompt reads the
// stored rows through prefill_attention_paged instead).
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             double scale, int64_t window, double softcap,
                             const std::optional<at::Tensor>& alibi) {
  check_f32(q, "q");
  check_f32(k, "k");
  check_f32(v, "v");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && k.sizes() == v.sizes() && q.size(0) == k.size(0) &&
                  q.size(2) == k.size(2),
              "q [T, H, D], k and v [T, KVH, D] expected");
  const int64_t kvh = k.size(1);
  std::vector<KvRows> k_rows, v_rows;
  for (int64_t h = 0; h < kvh; ++h) {  // token p of head h is "slot" p of rows of stride(0)
    k_rows.push_back({reinterpret_cast<const uint8_t*>(k.data_ptr<float>() + h * k.stride(1)),
                      4 * k.stride(0), kKvF32, 1.f});
    v_rows.push_back({reinterpret_cast<const uint8_t*>(v.data_ptr<float>() + h * v.stride(1)),
                      4 * v.stride(0), kKvF32, 1.f});
  }
  return flash_attention(q, kvh, 0, scale, window, static_cast<float>(softcap),
                         alibi_slopes(alibi, q.size(1)), k_rows, v_rows,
                         [](int64_t p) { return p; });
}

// A row whose earlier keys are cached (a later prefill chunk, a prefix-cache hit, or a narrow
// cache's fresh prompt): q [n, H, D] at positions start.., every key p < start + n already in the
// caches [KVH, S, row] (any format; k_scale / v_scale the layer's) at slot
// block_table[p / block_size] * block_size + p % block_size (block_table [W] int64).
at::Tensor prefill_attention_paged(const at::Tensor& q, const at::Tensor& k_cache,
                                   const at::Tensor& v_cache, const at::Tensor& block_table,
                                   int64_t start, int64_t block_size, double scale,
                                   int64_t window, double softcap,
                                   const std::optional<at::Tensor>& alibi, double k_scale,
                                   double v_scale) {
  check_f32(q, "q");
  check_caches(k_cache, v_cache);
  TORCH_CHECK(q.dim() == 3 && kv_head_dim(k_cache) == q.size(2),
              "q [n, H, D] and caches [KVH, S, row] of head_dim D expected");
  TORCH_CHECK(block_table.scalar_type() == at::kLong && block_table.dim() == 1 &&
                  block_table.is_contiguous() && block_size > 0 && start >= 0,
              "bad block table");
  const int64_t num_slots = k_cache.size(1), end = start + q.size(0);
  const int64_t* table = block_table.data_ptr<int64_t>();
  TORCH_CHECK(end <= block_table.numel() * block_size, "the block table does not cover the row");
  const int64_t first_needed = window > 0 ? std::max<int64_t>(0, start - window + 1) : 0;
  for (int64_t i = first_needed / block_size; i < (end + block_size - 1) / block_size; ++i) {
    TORCH_CHECK(table[i] >= 0 && (table[i] + 1) * block_size <= num_slots,
                "block id out of range");
  }
  std::vector<KvRows> k_rows, v_rows;
  for (int64_t h = 0; h < k_cache.size(0); ++h) {
    k_rows.push_back(kv_head_rows(k_cache, h, static_cast<float>(k_scale)));
    v_rows.push_back(kv_head_rows(v_cache, h, static_cast<float>(v_scale)));
  }
  return flash_attention(
      q, k_cache.size(0), start, scale, window, static_cast<float>(softcap),
      alibi_slopes(alibi, q.size(1)), k_rows, v_rows,
      [=](int64_t p) { return table[p / block_size] * block_size + p % block_size; });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dimension (fp32)");
  m.def("add_rms_norm_", &add_rms_norm_, "residual += x; RMSNorm(residual) (fp32)");
  m.def("layer_norm", &layer_norm, "LayerNorm over the last dimension (fp32)");
  m.def("add_layer_norm_", &add_layer_norm_, "residual += x; LayerNorm(residual) (fp32)");
  m.def("rotary_", &rotary_, "in-place RoPE, rotate-half or interleaved (fp32)", py::arg("x"),
        py::arg("cos"), py::arg("sin"), py::arg("interleaved") = false);
  m.def("store_kv", &store_kv, "write K/V rows into the head-major paged cache (any format)",
        py::arg("k"), py::arg("v"), py::arg("k_cache"), py::arg("v_cache"), py::arg("slots"),
        py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0);
  m.def("decode_attention", &decode_attention, "one-token attention over the paged cache",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"),
        py::arg("first"), py::arg("seq_lens"), py::arg("block_size"), py::arg("scale"),
        py::arg("softcap") = 0.0, py::arg("alibi") = py::none(), py::arg("k_scale") = 1.0,
        py::arg("v_scale") = 1.0);
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up of a fused [gate | up] row (fp32)");
  m.def("gelu_and_mul", &gelu_and_mul, "gelu(gate) * up of a fused [gate | up] row (fp32)");
  m.def("gelu", &gelu, "gelu(x), exact or tanh (fp32)");
  m.def("linear_packed", &linear_packed, "x @ W with W packed as column tiles [C, K, n] (fp32)",
        pybind11::arg("x"), pybind11::arg("wt"), pybind11::arg("bias") = pybind11::none());
  m.def("prefill_attention", &prefill_attention,
        "causal (windowed) GQA attention of a fresh prompt, flash-style (fp32)", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("scale"), py::arg("window"),
        py::arg("softcap") = 0.0, py::arg("alibi") = py::none());
  m.def("prefill_attention_paged", &prefill_attention_paged,
        "causal (windowed) GQA attention of prefill rows over the paged cache",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_table"),
        py::arg("start"), py::arg("block_size"), py::arg("scale"), py::arg("window"),
        py::arg("softcap") = 0.0, py::arg("alibi") = py::none(), py::arg("k_scale") = 1.0,
        py::arg("v_scale") = 1.0);
  register_decode_stack(m);
  register_quant(m);
  register_kquant(m);
}
