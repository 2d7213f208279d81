// pytgi's CPU kernels (fp32): a GEMM on packed weights that beats MKL at decode sizes, and fused
// ops that each replace a chain of small ATen calls on the decode hot path, where a batch-1 step
// was ~60 ATen calls per layer at ~2.5 us each (docs/PERFORMANCE.md, "Kernel choices"). They are
// optional: the Python callers keep the pure-torch path, which tests compare these against.
//
// Layouts (the callers' invariants, checked below):
//   activations  [T, ..., D] with the last dimension contiguous;
//   KV cache     [KVH, num_blocks * block_size, D] per layer (head-major, see attention.py): the
//                keys of block b, head h are the contiguous rows [b * block_size, (b+1) * block_size).
#include "common.h"

#include <ATen/Parallel.h>

#include <optional>
#include <vector>

using namespace pytgi;

namespace pytgi {
void register_decode_stack(pybind11::module& m);  // decode_stack.cpp
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
      float* row = rp + r * d;
      const float* add = xp + r * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) row[i] += add[i];
      rms_row(op + r * d, row, wp, d, eps);
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
  const int64_t tokens = x.size(0), heads = x.size(1), rd = cos.size(1);
  TORCH_CHECK(cos.size(0) == tokens && rd <= x.size(2) && rd % 2 == 0, "bad rotary shapes");
  const int64_t st = x.stride(0), sh = x.stride(1);
  float* xp = x.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *c = cp + t * rd, *s = sp + t * rd;
      for (int64_t h = 0; h < heads; ++h) rotate_head(xp + t * st + h * sh, c, s, rd);
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

  at::parallel_for(0, rows * kvh, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<const float*> keys, values;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kvh, h = task % kvh, lo = fp[b], len = lp[b] - lo;
      const int64_t* table = tables + b * width;
      keys.resize(len);
      values.resize(len);
      paged_rows(table, block_size, lo, len, kc + h * num_slots * d, vc + h * num_slots * d, d,
                 keys.data(), values.data());
      scores.resize(len);
      for (int64_t g = 0; g < group; ++g) {  // each query head of the group, keys from L2
        const float* query = qp + b * qsr + (h * group + g) * qsh;
        float* o = op + (b * heads + h * group + g) * d;
        attend(query, keys.data(), values.data(), len, d, sc, scores.data(), o);
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dimension (fp32)");
  m.def("add_rms_norm_", &add_rms_norm_, "residual += x; RMSNorm(residual) (fp32)");
  m.def("rotary_", &rotary_, "in-place rotate-half RoPE (fp32)");
  m.def("store_kv", &store_kv, "write K/V rows into the head-major paged cache (fp32)");
  m.def("decode_attention", &decode_attention, "one-token attention over the paged cache (fp32)");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up of a fused [gate | up] row (fp32)");
  m.def("linear_packed", &linear_packed, "x @ W with W packed as column tiles [C, K, n] (fp32)",
        pybind11::arg("x"), pybind11::arg("wt"), pybind11::arg("bias") = pybind11::none());
  register_decode_stack(m);
}
