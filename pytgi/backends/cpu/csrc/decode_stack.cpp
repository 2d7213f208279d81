// A decode step's decoder layers in one call: Llama-family blocks (pre-norm, gated SiLU MLP, RoPE,
// GQA over the paged cache; q/k/v/o and MLP biases, per-head q/k norm, residual multiplier and
// per-layer sliding window as options), fp32 activations, one process (no tensor parallelism).
// Each linear layer is either fp32 packed tiles or a quantized weight (quant.h's layouts) run
// with int8 activations: exactly the kernels of the layer-by-layer path (quant_linear).
//
// Why: run op by op, a batch-1 step of a 30-layer model is ~300 kernel calls. Each costs Python
// and dispatch time, and each parallel op wakes the worker threads, which sleep between regions
// under OMP_WAIT_POLICY=PASSIVE (docs/PERFORMANCE.md has the measurements).
//
// How: the step is a fixed list of phases, per layer: input norm, qkv, q/k norm + RoPE + KV store,
// attention, (the attention rows' int8 quantisation, when it could not run inside attention),
// o_proj, post norm, gate_up, SiLU * up, down. A phase is a set of independent tasks: rows,
// 16-column weight tiles (two 8-column groups of a quantized weight), or (row, KV head) pairs.
// A quantized linear's input rows are quantised to int8 by the row tasks that produce them (the
// norms, SiLU * up, and each (row, KV head) attention task for its 32-aligned slice of the row). Every thread of one parallel region runs
// the same program: it claims the phase's tasks from an atomic counter, then waits until all of
// them are done, then goes on to the next phase. Nothing is assigned in advance, so a thread that
// wakes late or is descheduled only leaves its unclaimed tiles to the others (who then wait only
// for tasks already in progress). Every task runs the op-by-op kernels' own helpers (common.h),
// so the results do not depend on which thread ran what, nor on the number of threads.
#include "common.h"
#include "quant_ops.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace pytgi {
namespace {

struct alignas(64) PhaseCounter {
  std::atomic<int64_t> next{0};  // the next task to claim
  std::atomic<int64_t> done{0};  // tasks finished
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Runs tasks [0, n) of one phase together with the other threads, then waits for all of them.
// done's release increments and the acquire load that reads n order every task's writes before
// anything any thread does in the next phase.
template <class Task>
void run_phase(PhaseCounter& counter, int64_t n, const Task& task) {
  for (int64_t i = counter.next.fetch_add(1, std::memory_order_relaxed); i < n;
       i = counter.next.fetch_add(1, std::memory_order_relaxed)) {
    task(i);
    counter.done.fetch_add(1, std::memory_order_release);
  }
  for (int spins = 0; counter.done.load(std::memory_order_acquire) < n; ++spins) {
    if (spins < 4096) {
      cpu_relax();
    } else {
      std::this_thread::yield();  // the thread we wait for may need this core
    }
  }
}

using TensorMap = std::unordered_map<std::string, at::Tensor>;

// One linear layer of the stack: fp32 packed tiles [C, K, 16] (tiles != null), or a quantized
// weight (quant.h) multiplied with int8 activations; bias [>= N] or null.
struct Linear {
  const float* tiles = nullptr;
  const float* bias = nullptr;
  bool quantized = false;
  quant::Matrix matrix{};
};

// One decoder layer's parameters, as the layers hold them after loading; optional entries are
// null.
struct Layer {
  const float *input_norm, *post_norm, *q_norm, *k_norm;
  Linear qkv, o, gate_up, down;
  int64_t window;  // a query at position p sees keys p - window < pos <= p; 0 = all keys
};

// A linear input's rows quantised to int8 per 32-wide block (quant.h's Acts), [B, kblocks * 32]
// codes and the per-block scale, sum and scaled sums, in one scratch tensor.
struct QuantRows {
  int8_t* q = nullptr;
  float* scale = nullptr;
  int32_t* sum = nullptr;
  float* scaled_sum = nullptr;
  int64_t kblocks = 0;

  static QuantRows allocate(int64_t rows, int64_t k, at::Tensor& storage) {
    QuantRows r;
    r.kblocks = (k + quant::kKBlock - 1) / quant::kKBlock;
    const int64_t kb = r.kblocks;  // 4-byte words: q (8 per block), scale, sum, scaled sums
    storage = at::empty({std::max<int64_t>(1, rows * kb * (8 + 2 + quant::kSums))}, at::kFloat);
    float* base = storage.data_ptr<float>();
    r.q = reinterpret_cast<int8_t*>(base);
    r.scale = base + rows * kb * 8;
    r.sum = reinterpret_cast<int32_t*>(r.scale + rows * kb);
    r.scaled_sum = r.scale + 2 * rows * kb;
    return r;
  }

  // Columns [c0, c0 + len) of row b of x (row stride xs): c0 and len multiples of 32, or the
  // whole row (c0 = 0, len = k). Blocks are quantised independently, so slices agree with
  // quantising the whole row at once.
  void quantize(const quant::Kernels& kern, const float* x, int64_t xs, int64_t b, int64_t c0,
                int64_t len) const {
    const int64_t b0 = c0 / quant::kKBlock, nb = (len + quant::kKBlock - 1) / quant::kKBlock;
    const int64_t block = b * kblocks + b0;
    kern.quantize_rows(x + b * xs + c0, xs, 1, len, nb, q + block * quant::kKBlock, scale + block,
                       sum + block, scaled_sum + block * quant::kSums);
  }

  quant::Acts rows_from(int64_t r0) const {
    return {q + r0 * kblocks * quant::kKBlock, scale + r0 * kblocks, sum + r0 * kblocks,
            scaled_sum + r0 * kblocks * quant::kSums, kblocks};
  }
};

constexpr int kPhasesPerLayer = 10;
constexpr int64_t kQuantRowChunk = 64;  // rows per pass over a task's codes, as quant_linear

}  // namespace

class DecodeStack {
 public:
  DecodeStack(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
              int64_t intermediate, double eps, double scale, double residual_multiplier,
              const std::vector<TensorMap>& layers, const std::vector<int64_t>& windows)
      : hidden_(hidden), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim),
        inter_(intermediate), eps_(static_cast<float>(eps)), scale_(static_cast<float>(scale)),
        multiplier_(static_cast<float>(residual_multiplier)), kern_(&quant::select("auto")) {
    TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "bad head counts");
    TORCH_CHECK(layers.size() == windows.size() && !layers.empty(), "one window per layer");
    qkv_tiles_ = tiles_for((heads + 2 * kv_heads) * head_dim);
    o_tiles_ = tiles_for(hidden);
    gate_up_tiles_ = tiles_for(2 * intermediate);
    down_tiles_ = tiles_for(hidden);
    for (size_t i = 0; i < layers.size(); ++i) layers_.push_back(bind(layers[i], windows[i]));
    for (const Layer& l : layers_) {
      quant_normed_ |= l.qkv.quantized || l.gate_up.quantized;
      quant_attn_ |= l.o.quantized;
      quant_act_ |= l.down.quantized;
    }
    const int64_t group_width = heads / kv_heads * head_dim;
    attn_quant_in_task_ = group_width % quant::kKBlock == 0;
  }

  // The kernel table the quantized layers run on (quant_ops.cpp's select("auto")).
  std::string isa() const { return kern_->name; }

  // hidden [B, hidden] (the embeddings), cos / sin [B, rd], slots [B] (int64: where each row's
  // new K/V goes), block_tables [B, W] and seq_lens [B] (int64: row b's keys are positions
  // 0 <= p < seq_lens[b], its new token the last), each layer's K and V cache [KVH, S, D]
  // (passed per call: their owner frees and reallocates them). Returns (hidden, residual)
  // [B, hidden] each, as the op-by-op layers leave them for the final norm(hidden + residual).
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& hidden, const at::Tensor& cos,
                                             const at::Tensor& sin, const at::Tensor& slots,
                                             const at::Tensor& block_tables,
                                             const at::Tensor& seq_lens, int64_t block_size,
                                             const std::vector<at::Tensor>& k_caches,
                                             const std::vector<at::Tensor>& v_caches) const {
    const int64_t num_slots = check_caches(k_caches, v_caches);
    check_inputs(hidden, cos, sin, slots, block_tables, seq_lens, block_size, num_slots);
    const int64_t rows = hidden.size(0);
    std::vector<float*> k_ptrs, v_ptrs;
    for (size_t i = 0; i < layers_.size(); ++i) {
      k_ptrs.push_back(k_caches[i].data_ptr<float>());
      v_ptrs.push_back(v_caches[i].data_ptr<float>());
    }
    auto f32 = hidden.options();
    at::Tensor residual = hidden.clone();
    at::Tensor out = at::empty({rows, hidden_}, f32);
    Buffers buf{at::empty({rows, hidden_}, f32),
                at::empty({rows, qkv_tiles_ * kTile}, f32),
                at::empty({rows, heads_ * head_dim_}, f32),
                at::empty({rows, o_tiles_ * kTile}, f32),
                at::empty({rows, gate_up_tiles_ * kTile}, f32),
                at::empty({rows, inter_}, f32),
                at::empty({rows, down_tiles_ * kTile}, f32)};
    at::Tensor normed_q, attn_q, act_q;  // storage of the int8 rows, when a layer needs them
    if (quant_normed_) buf.normed_q = QuantRows::allocate(rows, hidden_, normed_q);
    if (quant_attn_) buf.attn_q = QuantRows::allocate(rows, heads_ * head_dim_, attn_q);
    if (quant_act_) buf.act_q = QuantRows::allocate(rows, inter_, act_q);
    Step step{rows,
              cos.size(1),
              cos.data_ptr<float>(),
              sin.data_ptr<float>(),
              slots.data_ptr<int64_t>(),
              block_tables.data_ptr<int64_t>(),
              block_tables.size(1),
              seq_lens.data_ptr<int64_t>(),
              block_size,
              k_ptrs.data(),
              v_ptrs.data(),
              num_slots,
              residual.data_ptr<float>(),
              out.data_ptr<float>()};
    const size_t num_phases = layers_.size() * kPhasesPerLayer + 1;
    std::unique_ptr<PhaseCounter[]> counters(new PhaseCounter[num_phases]);
    // One index per thread: each runs the whole program (a thread the region did not start, or
    // a serial run, is simply never there to claim tasks).
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
      run_program(step, buf, counters.get());
    });
    return {out, residual};
  }

 private:
  struct Buffers {  // [B, width] each; tile outputs are padded to a multiple of 16 columns
    at::Tensor normed, qkv, attn, o, gate_up, act, down;
    QuantRows normed_q, attn_q, act_q;  // int8 copies of normed, attn and act rows
  };
  struct Step {
    int64_t rows, rotary_dim;
    const float *cos, *sin;
    const int64_t *slots, *tables;
    int64_t table_width;
    const int64_t* seq_lens;
    int64_t block_size;
    float *const *k_caches, *const *v_caches;  // per layer, [KVH, num_slots, D]
    int64_t num_slots;
    float *residual, *out;
  };

  static int64_t tiles_for(int64_t columns) { return (columns + kTile - 1) / kTile; }

  // Tensor `name` of m: exactly `shape`, or (shape empty) a vector of `numel` values.
  const float* bind_tensor(const TensorMap& m, const char* name, std::vector<int64_t> shape,
                           bool required, int64_t numel = 0) {
    auto it = m.find(name);
    if (it == m.end()) {
      TORCH_CHECK(!required, "decode stack: missing ", name);
      return nullptr;
    }
    const at::Tensor& t = it->second;
    check_f32(t, name);
    if (shape.empty()) shape = {numel};
    TORCH_CHECK(t.is_contiguous() && t.sizes() == at::IntArrayRef(shape), "decode stack: ", name,
                " has shape ", t.sizes(), ", expected ", at::IntArrayRef(shape));
    kept_.push_back(t);
    return t.data_ptr<float>();
  }

  // Linear `name` of a layer: fp32 tiles `name` [tiles, k, 16], or a quantized weight given as
  // `name.codes`, `name.scales`, optional `name.mins` / `name.table` and `name.layout` (int64
  // [format, n, k, scale_block]); optional bias `name_bias` (fp32, at least n values).
  Linear bind_linear(const TensorMap& m, const std::string& name, int64_t n, int64_t k) {
    Linear lin;
    const int64_t tiles = tiles_for(n);
    if (m.count(name)) {
      lin.tiles = bind_tensor(m, name.c_str(), {tiles, k, kTile}, true);
      lin.bias = bind_tensor(m, (name + "_bias").c_str(), {}, false, tiles * kTile);
      return lin;
    }
    lin.bias = bind_tensor(m, (name + "_bias").c_str(), {}, false, n);
    auto tensor = [&](const std::string& key, bool required) -> std::optional<at::Tensor> {
      auto it = m.find(name + "." + key);
      TORCH_CHECK(it != m.end() || !required, "decode stack: missing ", name, " (or ", name,
                  ".", key, ")");
      if (it == m.end()) return std::nullopt;
      kept_.push_back(it->second);
      return it->second;
    };
    const at::Tensor layout = *tensor("layout", true);
    TORCH_CHECK(layout.scalar_type() == at::kLong && layout.numel() == 4 && layout.is_contiguous(),
                "decode stack: ", name, ".layout must be int64 [format, n, k, scale_block]");
    const int64_t* f = layout.data_ptr<int64_t>();
    TORCH_CHECK(f[1] == n && f[2] == k, "decode stack: ", name, " is [", f[1], ", ", f[2],
                "], expected [", n, ", ", k, "]");
    TORCH_CHECK(f[0] != quant::kFp8, "decode stack: ", name,
                " is fp8, which runs with fp32 activations only");
    lin.matrix = quant::make_matrix(*tensor("codes", true), *tensor("scales", true),
                                    tensor("mins", false), tensor("table", false), f[0], n, k, f[3]);
    lin.quantized = true;
    return lin;
  }

  Layer bind(const TensorMap& m, int64_t window) {
    const int64_t d = head_dim_;
    Layer l{};
    l.input_norm = bind_tensor(m, "input_norm", {hidden_}, true);
    l.post_norm = bind_tensor(m, "post_norm", {hidden_}, true);
    l.q_norm = bind_tensor(m, "q_norm", {d}, false);
    l.k_norm = bind_tensor(m, "k_norm", {d}, false);
    TORCH_CHECK(!l.q_norm == !l.k_norm, "decode stack: q_norm and k_norm come together");
    l.qkv = bind_linear(m, "qkv", (heads_ + 2 * kv_heads_) * d, hidden_);
    l.o = bind_linear(m, "o", hidden_, heads_ * d);
    l.gate_up = bind_linear(m, "gate_up", 2 * inter_, hidden_);
    l.down = bind_linear(m, "down", hidden_, inter_);
    TORCH_CHECK(window >= 0, "decode stack: negative window");
    l.window = window;
    return l;
  }

  // The number of slots of the caches, which every layer's K and V share.
  int64_t check_caches(const std::vector<at::Tensor>& k_caches,
                       const std::vector<at::Tensor>& v_caches) const {
    TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(),
                "one K and one V cache per layer");
    const int64_t num_slots = k_caches[0].dim() == 3 ? k_caches[0].size(1) : -1;
    for (size_t i = 0; i < layers_.size(); ++i) {
      for (const at::Tensor* t : {&k_caches[i], &v_caches[i]}) {
        check_f32(*t, "KV cache");
        TORCH_CHECK(t->is_contiguous() && t->dim() == 3 && t->size(0) == kv_heads_ &&
                        t->size(1) == num_slots && t->size(2) == head_dim_,
                    "KV caches must be [kv_heads, slots, head_dim], the same for every layer");
      }
    }
    return num_slots;
  }

  void check_inputs(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                    const at::Tensor& slots, const at::Tensor& tables,
                    const at::Tensor& seq_lens, int64_t block_size, int64_t num_slots) const {
    check_f32(hidden, "hidden");
    check_f32(cos, "cos");
    check_f32(sin, "sin");
    TORCH_CHECK(hidden.dim() == 2 && hidden.size(1) == hidden_ && hidden.is_contiguous(),
                "hidden must be [B, hidden]");
    const int64_t rows = hidden.size(0);
    TORCH_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.size(0) == rows &&
                    cos.is_contiguous() && sin.is_contiguous() && cos.size(1) <= head_dim_ &&
                    cos.size(1) % 2 == 0,
                "cos / sin must be [B, rotary_dim]");
    for (const at::Tensor* t : {&slots, &tables, &seq_lens}) {
      TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "int64 metadata expected");
    }
    TORCH_CHECK(slots.numel() == rows && seq_lens.numel() == rows && tables.dim() == 2 &&
                    tables.size(0) == rows,
                "one slot, block table and length per row");
    TORCH_CHECK(block_size > 0, "bad block size");
    const int64_t width = tables.size(1);
    const int64_t *sl = slots.data_ptr<int64_t>(), *lp = seq_lens.data_ptr<int64_t>(),
                  *tp = tables.data_ptr<int64_t>();
    for (int64_t b = 0; b < rows; ++b) {
      TORCH_CHECK(0 <= sl[b] && sl[b] < num_slots, "bad slot");
      TORCH_CHECK(0 < lp[b] && lp[b] <= width * block_size, "bad sequence length");
      for (int64_t i = 0; i < (lp[b] + block_size - 1) / block_size; ++i) {
        const int64_t blk = tp[b * width + i];
        TORCH_CHECK(blk >= 0 && (blk + 1) * block_size <= num_slots, "block id out of range");
      }
    }
  }

  void run_program(const Step& s, const Buffers& buf, PhaseCounter* counter) const {
    const int64_t hd = hidden_, d = head_dim_, rows = s.rows, group = heads_ / kv_heads_;
    const int64_t qkv_w = qkv_tiles_ * kTile, o_w = o_tiles_ * kTile;
    const int64_t gu_w = gate_up_tiles_ * kTile, down_w = down_tiles_ * kTile;
    float *normed = buf.normed.data_ptr<float>(), *qkv = buf.qkv.data_ptr<float>(),
          *attn = buf.attn.data_ptr<float>(), *o = buf.o.data_ptr<float>(),
          *gu = buf.gate_up.data_ptr<float>(), *act = buf.act.data_ptr<float>(),
          *down = buf.down.data_ptr<float>();
    AttendScratch scratch;  // this thread's

    // residual[b] += multiplier * branch[b] (the branch's first `hidden` columns), then
    // normed[b] = rms_norm(residual[b]); no branch (the first layer): just the norm. Then the
    // int8 copy of normed[b] when the consumer is quantized.
    auto add_norm = [&](const float* branch, int64_t branch_w, const float* weight, bool quant) {
      return [=, &buf](int64_t b) {
        float* r = s.residual + b * hd;
        if (branch == nullptr) {
          rms_row(normed + b * hd, r, weight, hd, eps_);
        } else {
          add_rms_row(normed + b * hd, r, branch + b * branch_w, multiplier_, weight, hd, eps_);
        }
        if (quant) buf.normed_q.quantize(*kern_, normed, hd, b, 0, hd);
      };
    };
    // Task t of a linear: output columns [16 t, 16 t + 16) for every row.
    auto linear = [&](const Linear& lin, const float* x, int64_t k, const QuantRows& xq, float* y,
                      int64_t ys) {
      return [&, x, k, y, ys](int64_t t) {
        if (!lin.quantized) {
          packed_tile(rows, x, k, lin.tiles + t * k * kTile, kTile, k, y + t * kTile, ys,
                      lin.bias ? lin.bias + t * kTile : nullptr);
          return;
        }
        const int64_t g0 = 2 * t, g1 = std::min(g0 + 2, (lin.matrix.n + 7) / quant::kGroup);
        for (int64_t r0 = 0; r0 < rows; r0 += kQuantRowChunk) {
          const int64_t chunk = std::min(kQuantRowChunk, rows - r0);
          kern_->gemm_i8(lin.matrix, xq.rows_from(r0), chunk, g0, g1, y + r0 * ys, ys, lin.bias);
        }
      };
    };

    for (size_t li = 0; li < layers_.size(); ++li) {
      const Layer& l = layers_[li];
      float *k_cache = s.k_caches[li], *v_cache = s.v_caches[li];
      PhaseCounter* c = counter + li * kPhasesPerLayer;
      const bool attn_q_in_task = l.o.quantized && attn_quant_in_task_;
      run_phase(c[0], rows,
                add_norm(li == 0 ? nullptr : down, down_w, l.input_norm, l.qkv.quantized));
      run_phase(c[1], qkv_tiles_, linear(l.qkv, normed, hd, buf.normed_q, qkv, qkv_w));
      run_phase(c[2], rows, [&](int64_t b) {
        rope_and_store(l, s, qkv + b * qkv_w, b, k_cache, v_cache);
      });
      run_phase(c[3], rows * kv_heads_, [&](int64_t task) {
        const int64_t b = task / kv_heads_, h = task % kv_heads_;
        attend_group(l, s, qkv + b * qkv_w, b, h, k_cache, v_cache, attn, scratch);
        if (attn_q_in_task) {
          buf.attn_q.quantize(*kern_, attn, heads_ * d, b, h * group * d, group * d);
        }
      });
      run_phase(c[4], l.o.quantized && !attn_q_in_task ? rows : 0, [&](int64_t b) {
        buf.attn_q.quantize(*kern_, attn, heads_ * d, b, 0, heads_ * d);
      });
      run_phase(c[5], o_tiles_, linear(l.o, attn, heads_ * d, buf.attn_q, o, o_w));
      run_phase(c[6], rows, add_norm(o, o_w, l.post_norm, l.gate_up.quantized));
      run_phase(c[7], gate_up_tiles_, linear(l.gate_up, normed, hd, buf.normed_q, gu, gu_w));
      run_phase(c[8], rows, [&](int64_t b) {
        silu_mul_row(act + b * inter_, gu + b * gu_w, gu + b * gu_w + inter_, inter_);
        if (l.down.quantized) buf.act_q.quantize(*kern_, act, inter_, b, 0, inter_);
      });
      run_phase(c[9], down_tiles_, linear(l.down, act, inter_, buf.act_q, down, down_w));
    }
    run_phase(counter[layers_.size() * kPhasesPerLayer], rows, [&](int64_t b) {
      const float* x = down + b * down_w;
      float* y = s.out + b * hd;
      for (int64_t i = 0; i < hd; ++i) y[i] = multiplier_ == 1.f ? x[i] : x[i] * multiplier_;
    });
  }

  // Row b's q and k heads (in its qkv row [q heads | k heads | v heads]): per-head RMSNorm when
  // the model has one, RoPE at the row's position; then its K and V go to the cache slot.
  void rope_and_store(const Layer& l, const Step& s, float* qkv_row, int64_t b, float* k_cache,
                      float* v_cache) const {
    const int64_t d = head_dim_, rd = s.rotary_dim;
    const float *c = s.cos + b * rd, *sn = s.sin + b * rd;
    for (int64_t h = 0; h < heads_ + kv_heads_; ++h) {
      float* v = qkv_row + h * d;
      if (l.q_norm != nullptr) rms_row(v, v, h < heads_ ? l.q_norm : l.k_norm, d, eps_);
      rotate_head(v, c, sn, rd);
    }
    const int64_t slot = s.slots[b];
    for (int64_t h = 0; h < kv_heads_; ++h) {
      std::copy_n(qkv_row + (heads_ + h) * d, d, k_cache + (h * s.num_slots + slot) * d);
      std::copy_n(qkv_row + (heads_ + kv_heads_ + h) * d, d,
                  v_cache + (h * s.num_slots + slot) * d);
    }
  }

  // The query heads of KV head h in row b against the row's visible keys, read in place.
  void attend_group(const Layer& l, const Step& s, const float* qkv_row, int64_t b, int64_t h,
                    const float* k_cache, const float* v_cache, float* attn,
                    AttendScratch& scratch) const {
    const int64_t d = head_dim_, group = heads_ / kv_heads_, seq_len = s.seq_lens[b];
    const int64_t first = l.window > 0 ? std::max<int64_t>(0, seq_len - l.window) : 0;
    attend_kv_head(qkv_row + h * group * d, d, group, s.tables + b * s.table_width, s.block_size,
                   first, seq_len - first, k_cache + h * s.num_slots * d,
                   v_cache + h * s.num_slots * d, d, scale_, attn + (b * heads_ + h * group) * d,
                   scratch);
  }

  int64_t hidden_, heads_, kv_heads_, head_dim_, inter_;
  float eps_, scale_, multiplier_;
  const quant::Kernels* kern_;  // the quantized layers' kernel table, chosen once
  bool quant_normed_ = false, quant_attn_ = false, quant_act_ = false;  // int8 rows needed
  bool attn_quant_in_task_ = false;  // a KV head's query heads span whole 32-wide blocks
  int64_t qkv_tiles_, o_tiles_, gate_up_tiles_, down_tiles_;
  std::vector<Layer> layers_;
  std::vector<at::Tensor> kept_;  // the tensors layers_ points into
};

void register_decode_stack(pybind11::module& m) {
  pybind11::class_<DecodeStack>(m, "DecodeStack")
      .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, double, double,
                          const std::vector<TensorMap>&, const std::vector<int64_t>&>(),
           pybind11::arg("hidden_size"), pybind11::arg("num_heads"),
           pybind11::arg("num_kv_heads"), pybind11::arg("head_dim"),
           pybind11::arg("intermediate_size"), pybind11::arg("eps"), pybind11::arg("scale"),
           pybind11::arg("residual_multiplier"), pybind11::arg("layers"),
           pybind11::arg("windows"))
      .def("forward", &DecodeStack::forward, pybind11::arg("hidden"), pybind11::arg("cos"),
           pybind11::arg("sin"), pybind11::arg("slots"), pybind11::arg("block_tables"),
           pybind11::arg("seq_lens"), pybind11::arg("block_size"), pybind11::arg("k_caches"),
           pybind11::arg("v_caches"),
           pybind11::call_guard<pybind11::gil_scoped_release>())
      .def_property_readonly("isa", &DecodeStack::isa);
}

}  // namespace pytgi
