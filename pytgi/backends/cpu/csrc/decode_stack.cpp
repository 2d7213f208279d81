// A decode step's decoder layers in one call, fp32, one process (no tensor parallelism): the shared
// blocks of models/blocks.py with their options: RMS or Layer norms (with biases), q/k/v, output
// and MLP biases, per-head q/k norms, rotary (rotate-half or interleaved, partial, one of several
// tables per layer, or none), ALiBi, logit soft-capping, per-layer sliding windows, a gated or
// plain MLP (SiLU, GELU, tanh-GELU), the residual multiplier, and the four ways a layer composes
// attention and MLP (sequential, parallel with one or two norms, sandwiched by post-norms). Each
// linear layer is either fp32 packed tiles or a quantized weight (quant.h's layouts) run with
// int8 activations: exactly the kernels of the layer-by-layer path (quant_linear).
//
// Why: run op by op, a batch-1 step of a 30-layer model is ~300 kernel calls. Each costs Python
// and dispatch time, and each parallel op wakes the worker threads, which sleep between regions
// under OMP_WAIT_POLICY=PASSIVE (docs/PERFORMANCE.md has the measurements).
//
// How: the step is a fixed list of phases, per layer: residual add + norm(s), qkv, q/k norm + RoPE
// + KV store, attention, (the attention rows' int8 quantisation, when it could not run inside
// attention), o_proj, the MLP's norm, gate_up (or up), activation, down. A phase is a set of
// independent tasks: rows, 16-column weight tiles (two 8-column groups of a quantized weight), or
// (row, KV head) pairs. A quantized linear's input rows are quantised to int8 by the row tasks
// that produce them (the norms, the activation, and each (row, KV head) attention task for its
// 32-aligned slice of the row). Every thread
// of one parallel region runs the same program: it claims the phase's tasks from an atomic
// counter, then waits until all of them are done, then goes on to the next phase. Nothing is
// assigned in advance, so a thread that wakes late or is descheduled only leaves its unclaimed
// tiles to the others (who then wait only for tasks already in progress). Every task runs the
// op-by-op kernels' own helpers (common.h), so the results do not depend on which thread ran
// what, nor on the number of threads.
//
// LoRA rows: each adapted linear carries, per adapter slot, A [r, K] and B's column tiles
// [C, r, 16]. A row whose adapter adapts the linear gets its shrink x A^T in the task that
// produces its input row (the norms, the activation; o_proj's as one partial per KV head from
// the attention tasks, added in head order) and its expand in each 16-column task, after the
// base tile: y += (x A^T) B^T for that row alone, in a fixed order, so rows stay independent.
//
// Rows are tokens: a decode row, or one query of a verify step (its own slot, block table row
// and visible length: the keys up to its position, its step's earlier queries' K/V stored by
// the RoPE phase before attention runs).
//
// The residual stream: layer l's "branch" (what it adds to the stream) is down * multiplier
// (sequential), o + down (parallel), or mlp_out_norm(down) (sandwich); the next layer's first
// phase adds it, and the last phase writes the last layer's branch to `out`, so (out, residual)
// are what the op-by-op layers hand to the final norm(out + residual).
//
// A layer whose tensors include `moe.config` runs a mixture-of-experts MLP (moe_stack.h, its own
// phases) in place of the dense MLP's gate_up, activation and down; its output is the layer's
// "down" all the same.
#include "attention.h"
#include "common.h"
#include "moe_stack.h"
#include "quant_ops.h"

#include <ATen/Parallel.h>

#include <algorithm>
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

// How layers compose attention and MLP (models/config.py BLOCKS, in that order).
enum Block : int64_t { kSequential = 0, kParallel = 1, kParallelTwoNorms = 2, kSandwich = 3 };

// One adapter's LoRA on one linear [N, K]: A [r, K] and its scaled B packed as column tiles
// [C, r, 16] (zero past N); r = 0: the adapter does not adapt this linear.
struct LoraPair {
  const float* a = nullptr;
  const float* b = nullptr;
  int64_t r = 0;
};

// One linear layer of the stack: fp32 packed tiles [C, K, 16] with bias [C * 16] (tiles != null),
// or a quantized weight (quant.h) multiplied with int8 activations, bias [N]; bias may be null.
// `lora` holds each adapter slot's pair (index 0, the base model, and unadapted slots: r = 0).
struct Linear {
  const float* tiles = nullptr;
  const float* bias = nullptr;
  bool quantized = false;
  quant::Matrix matrix{};
  int64_t n = 0;  // output columns
  std::vector<LoraPair> lora;

  const LoraPair* adapter(const int64_t* slots, int64_t b) const {
    const int64_t a = slots == nullptr ? 0 : slots[b];  // past lora's end: adapts no linear
    if (a == 0 || a >= static_cast<int64_t>(lora.size()) || lora[a].r == 0) return nullptr;
    return &lora[slots[b]];
  }
};

// LoRA's shrink for one row: xa[j] = x . A[j, c0:c0+len] for j < r (a slice of the input when
// several tasks each own part of the row: their partial sums are added in the expand).
inline void lora_shrink(const LoraPair& p, const float* x, int64_t k, int64_t c0, int64_t len,
                        float* xa) {
  for (int64_t j = 0; j < p.r; ++j) xa[j] = dot(x + c0, p.a + j * k + c0, len);
}

// LoRA's expand for one row and one 16-column tile t: y[0:16] += sum_j xa_j B[j, tile], with
// xa_j the sum of `parts` partial shrinks (stride `part_stride`), added in part order. The delta
// is summed apart from y, then added once: y = base + delta, as the layer-by-layer path adds it.
// Only the tile's first `width` columns (those of the linear's N) are written.
inline void lora_expand(const LoraPair& p, const float* xa, int64_t parts, int64_t part_stride,
                        int64_t t, int64_t width, float* y) {
  float delta[kTile] = {};
  const float* b = p.b + t * p.r * kTile;
  for (int64_t j = 0; j < p.r; ++j) {
    float x = xa[j];
    for (int64_t h = 1; h < parts; ++h) x += xa[h * part_stride + j];
#pragma omp simd
    for (int64_t c = 0; c < kTile; ++c) delta[c] += x * b[j * kTile + c];
  }
  for (int64_t c = 0; c < width; ++c) y[c] += delta[c];
}

// One decoder layer's parameters, as the layers hold them after loading; optional entries are
// null.
struct Layer {
  Norm input_norm, mlp_norm, attn_out_norm, mlp_out_norm, q_norm, k_norm;
  Linear qkv, o, up, down;
  const float* alibi;  // [heads] or null
  int64_t window;      // a query at position p sees keys p - window < pos <= p; 0 = all keys
  int64_t rope_table;  // which of the step's rotary tables this layer rotates with
  int64_t moe = -1;    // index into moes_ of the MoE MLP replacing up / down; -1: dense
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
              bool layer_norm, int64_t block, int64_t activation, bool gated,
              bool rotary_interleaved, double softcap, const std::vector<TensorMap>& layers,
              const std::vector<int64_t>& windows, const std::vector<int64_t>& rope_tables,
              const std::string& isa, int64_t num_adapters)
      : hidden_(hidden), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim),
        inter_(intermediate), eps_(static_cast<float>(eps)), scale_(static_cast<float>(scale)),
        multiplier_(static_cast<float>(residual_multiplier)), layer_norm_(layer_norm),
        block_(block), act_(activation), gated_(gated), interleaved_(rotary_interleaved),
        softcap_(static_cast<float>(softcap)), kern_(&quant::select(isa)),
        num_adapters_(num_adapters) {
    TORCH_CHECK(num_adapters >= 0, "decode stack: negative adapter count");
    TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "bad head counts");
    TORCH_CHECK(layers.size() == windows.size() && layers.size() == rope_tables.size() &&
                    !layers.empty(),
                "one window and one rotary table per layer");
    TORCH_CHECK(block >= kSequential && block <= kSandwich, "decode stack: unknown block");
    TORCH_CHECK(activation >= kSilu && activation <= kGeluTanh, "decode stack: unknown act");
    TORCH_CHECK(softcap >= 0, "decode stack: negative softcap");
    qkv_tiles_ = tiles_for((heads + 2 * kv_heads) * head_dim);
    o_tiles_ = tiles_for(hidden);
    up_tiles_ = tiles_for((gated ? 2 : 1) * intermediate);
    down_tiles_ = tiles_for(hidden);
    for (size_t i = 0; i < layers.size(); ++i) {
      layers_.push_back(bind(layers[i], windows[i], rope_tables[i]));
      num_tables_ = std::max(num_tables_, rope_tables[i] + 1);
    }
    const bool two_norms = block_ == kParallelTwoNorms;
    for (const Layer& l : layers_) {
      quant_normed_ |= l.qkv.quantized || (!two_norms && l.up.quantized);
      quant_mlp_normed_ |= two_norms && l.up.quantized;
      quant_attn_ |= l.o.quantized;
      quant_act_ |= l.down.quantized;
      for (int64_t a = 1; a <= num_adapters_; ++a) {
        rank_qkv_ = std::max(rank_qkv_, l.qkv.lora[a].r);
        rank_o_ = std::max(rank_o_, l.o.lora[a].r);
        rank_up_ = std::max(rank_up_, l.up.lora[a].r);
        rank_down_ = std::max(rank_down_, l.down.lora[a].r);
      }
    }
    attn_quant_in_task_ = heads / kv_heads * head_dim % quant::kKBlock == 0;
  }

  // The kernel table the quantized layers run on (quant_ops.cpp's select(isa)).
  std::string isa() const { return kern_->name; }

  // hidden [B, hidden] (the embeddings), cos / sin [R, B, rd] (R rotary tables, rd may be 0),
  // slots [B] (int64: where each row's new K/V goes), block_tables [B, W] and seq_lens [B]
  // (int64: row b's keys are positions 0 <= p < seq_lens[b], its new token the last), each
  // layer's K and V cache [KVH, S, D] (passed per call: their owner frees and reallocates them).
  // `slots` and `block_tables` hold one tensor for every layer, or one per layer (a model whose
  // layers keep their K/V in separate block tables, one per KV group; S may then differ).
  // `adapters` [B] (int64, optional): each row's LoRA adapter slot (0: the base model; a slot
  // past num_adapters adapts none of the stack's linears); a row's delta on each linear its
  // adapter adapts, (x A^T) B^T, is computed from that row alone, in a fixed order.
  // Returns (hidden, residual) [B, hidden] each, as the op-by-op layers leave them for the final
  // norm(hidden + residual).
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& hidden, const at::Tensor& cos,
                                             const at::Tensor& sin,
                                             const std::vector<at::Tensor>& slots,
                                             const std::vector<at::Tensor>& block_tables,
                                             const at::Tensor& seq_lens, int64_t block_size,
                                             const std::vector<at::Tensor>& k_caches,
                                             const std::vector<at::Tensor>& v_caches,
                                             const std::optional<at::Tensor>& adapters,
                                             const std::vector<double>& k_scales = {},
                                             const std::vector<double>& v_scales = {}) const {
    const size_t n = layers_.size();
    TORCH_CHECK((slots.size() == 1 || slots.size() == n) && block_tables.size() == slots.size(),
                "one slot tensor and block table for every layer, or one each per layer");
    check_caches(k_caches, v_caches);
    const int64_t rows = hidden.size(0);
    TORCH_CHECK(k_scales.size() == v_scales.size() && (k_scales.empty() || k_scales.size() == n),
                "no KV scales, or one K and one V scale per layer");
    std::vector<KvCache> k_ptrs, v_ptrs;  // any format of attention.h, with the layer's scales
    std::vector<const int64_t*> slot_ptrs, table_ptrs;
    std::vector<int64_t> widths, layer_slots;
    std::vector<std::tuple<const void*, const void*, int64_t>> checked;
    for (size_t i = 0; i < n; ++i) {
      const size_t t = slots.size() == 1 ? 0 : i;
      const int64_t num_slots = k_caches[i].size(1);
      const std::tuple<const void*, const void*, int64_t> key{
          slots[t].data_ptr(), block_tables[t].data_ptr(), num_slots};
      if (std::find(checked.begin(), checked.end(), key) == checked.end()) {  // once per table
        check_inputs(hidden, cos, sin, slots[t], block_tables[t], seq_lens, block_size, num_slots);
        checked.push_back(key);
      }
      k_ptrs.push_back(kv_cache_of(k_caches[i], k_scales.empty() ? 1.f : k_scales[i]));
      v_ptrs.push_back(kv_cache_of(v_caches[i], v_scales.empty() ? 1.f : v_scales[i]));
      slot_ptrs.push_back(slots[t].data_ptr<int64_t>());
      table_ptrs.push_back(block_tables[t].data_ptr<int64_t>());
      widths.push_back(block_tables[t].size(1));
      layer_slots.push_back(num_slots);
    }
    auto f32 = hidden.options();
    at::Tensor residual = hidden.clone();
    at::Tensor out = at::empty({rows, hidden_}, f32);
    const bool two_norms = block_ == kParallelTwoNorms;
    Buffers buf{at::empty({rows, hidden_}, f32),
                at::empty({two_norms ? rows : 0, hidden_}, f32),
                at::empty({rows, qkv_tiles_ * kTile}, f32),
                at::empty({rows, heads_ * head_dim_}, f32),
                at::empty({rows, o_tiles_ * kTile}, f32),
                at::empty({rows, up_tiles_ * kTile}, f32),
                at::empty({rows, inter_}, f32),
                at::empty({rows, down_tiles_ * kTile}, f32)};
    at::Tensor normed_q, mlp_q, attn_q, act_q;  // storage of the int8 rows a layer needs
    if (quant_normed_) buf.normed_q = QuantRows::allocate(rows, hidden_, normed_q);
    if (quant_mlp_normed_) buf.mlp_q = QuantRows::allocate(rows, hidden_, mlp_q);
    if (quant_attn_) buf.attn_q = QuantRows::allocate(rows, heads_ * head_dim_, attn_q);
    if (quant_act_) buf.act_q = QuantRows::allocate(rows, inter_, act_q);
    std::optional<MoeScratch> moe;
    if (!moes_.empty()) buf.moe = &moe.emplace(rows, moes_.front(), hidden_, layers_.size());
    const int64_t* adapter_slots = checked_adapters(adapters, rows);
    if (adapter_slots != nullptr) {  // each row's shrink (o's: one partial per KV head task)
      buf.xa_qkv = at::empty({rows, rank_qkv_}, f32);
      buf.xa_o = at::empty({rows, kv_heads_, rank_o_}, f32);
      buf.xa_up = at::empty({rows, rank_up_}, f32);
      buf.xa_down = at::empty({rows, rank_down_}, f32);
    }
    Step step{rows,
              cos.size(2),
              cos.size(1) * cos.size(2),
              cos.data_ptr<float>(),
              sin.data_ptr<float>(),
              slot_ptrs.data(),
              table_ptrs.data(),
              widths.data(),
              seq_lens.data_ptr<int64_t>(),
              block_size,
              k_ptrs.data(),
              v_ptrs.data(),
              layer_slots.data(),
              residual.data_ptr<float>(),
              out.data_ptr<float>(),
              adapter_slots};
    // the layers' phases, the last branch's, then each layer's MoE phases
    const size_t num_phases = layers_.size() * (kPhasesPerLayer + kMoePhases) + 1;
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
    at::Tensor normed, mlp_normed, qkv, attn, o, up, act, down;
    // int8 copies of rows of normed (the qkv input, and the MLP's except with two norms),
    // mlp_normed, attn and act, for the quantized layers that read them
    QuantRows normed_q, mlp_q, attn_q, act_q;
    MoeScratch* moe = nullptr;  // the MoE layers' scratch (null without MoE layers)
    // LoRA shrinks x A^T of the adapter rows, [B, max rank] (o's [B, KVH, max rank]: partials)
    at::Tensor xa_qkv, xa_o, xa_up, xa_down;
  };
  struct Step {
    int64_t rows, rotary_dim, table_stride;  // table t, row b: cos + t * table_stride + b * rd
    const float *cos, *sin;
    const int64_t *const *slots, *const *tables;  // per layer: [B], [B, table_width]
    const int64_t* table_width;                    // per layer
    const int64_t* seq_lens;
    int64_t block_size;
    const KvCache *k_caches, *v_caches;  // per layer, [KVH, num_slots, row]
    const int64_t* num_slots;                  // per layer
    float *residual, *out;
    const int64_t* adapters;  // [B] each row's adapter slot, or null: no adapter row
  };
  // One layer's view of the step's cache metadata.
  struct LayerCache {
    const int64_t *slots, *tables;
    int64_t table_width, num_slots;
    KvCache k, v;
  };
  // The buffers' rows as raw pointers, with their widths.
  struct Rows {
    float *normed, *mlp_normed, *qkv, *attn, *o, *up, *act, *down;
    int64_t qkv_w, o_w, up_w, down_w;
    float *xa_qkv, *xa_o, *xa_up, *xa_down;  // null without adapter rows
  };

  static int64_t tiles_for(int64_t columns) { return (columns + kTile - 1) / kTile; }
  static float* data_or_null(const at::Tensor& t) {
    return t.defined() ? t.data_ptr<float>() : nullptr;
  }

  const float* bind_tensor(const TensorMap& m, const std::string& name,
                           std::vector<int64_t> shape, bool required) {
    auto it = m.find(name);
    if (it == m.end()) {
      TORCH_CHECK(!required, "decode stack: missing ", name);
      return nullptr;
    }
    const at::Tensor& t = it->second;
    check_f32(t, name.c_str());
    TORCH_CHECK(t.is_contiguous() && t.sizes() == at::IntArrayRef(shape), "decode stack: ", name,
                " has shape ", t.sizes(), ", expected ", at::IntArrayRef(shape));
    kept_.push_back(t);
    return t.data_ptr<float>();
  }

  Norm bind_norm(const TensorMap& m, const std::string& name, int64_t size, bool required) {
    Norm n{bind_tensor(m, name, {size}, required), bind_tensor(m, name + "_bias", {size}, false)};
    TORCH_CHECK(n.bias == nullptr || layer_norm_, "decode stack: an RMSNorm has no bias");
    return n;
  }

  // Linear `name` of a layer [n, k]: fp32 tiles `name` [tiles, k, 16] and bias `name_bias`
  // [tiles * 16], or a quantized weight given as `name.codes`, `name.scales`, optional
  // `name.mins` / `name.table` and `name.layout` (int64 [format, n, k, scale_block]), bias
  // `name_bias` [n]; the bias is optional. Adapter slot a's LoRA, when it adapts the linear:
  // `name.lora{a}.a` [r, k] and `name.lora{a}.b` [tiles, r, 16] (fp32, B scaled, whatever the
  // base weight's format).
  Linear bind_linear(const TensorMap& m, const std::string& name, int64_t n, int64_t k) {
    Linear lin = bind_base_linear(m, name, n, k);
    lin.n = n;
    lin.lora.resize(num_adapters_ + 1);
    for (int64_t a = 1; a <= num_adapters_; ++a) {
      const std::string key = name + ".lora" + std::to_string(a);
      auto it = m.find(key + ".a");
      if (it == m.end()) continue;  // this adapter leaves the linear alone
      const int64_t r = it->second.dim() == 2 ? it->second.size(0) : -1;
      TORCH_CHECK(r > 0, "decode stack: ", key, ".a must be [r, ", k, "]");
      lin.lora[a] = {bind_tensor(m, key + ".a", {r, k}, true),
                     bind_tensor(m, key + ".b", {tiles_for(n), r, kTile}, true), r};
    }
    return lin;
  }

  // The base weight of linear `name` (see bind_linear).
  Linear bind_base_linear(const TensorMap& m, const std::string& name, int64_t n, int64_t k) {
    Linear lin;
    const int64_t tiles = tiles_for(n);
    if (m.count(name)) {
      lin.tiles = bind_tensor(m, name, {tiles, k, kTile}, true);
      lin.bias = bind_tensor(m, name + "_bias", {tiles * kTile}, false);
      return lin;
    }
    lin.bias = bind_tensor(m, name + "_bias", {n}, false);
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

  Layer bind(const TensorMap& m, int64_t window, int64_t rope_table) {
    const int64_t d = head_dim_;
    Layer l{};
    l.input_norm = bind_norm(m, "input_norm", hidden_, true);
    const bool separate_mlp_norm = block_ != kParallel;
    l.mlp_norm = bind_norm(m, "mlp_norm", hidden_, separate_mlp_norm);
    TORCH_CHECK(separate_mlp_norm || l.mlp_norm.weight == nullptr,
                "decode stack: a parallel block has one norm");
    l.attn_out_norm = bind_norm(m, "attn_out_norm", hidden_, block_ == kSandwich);
    l.mlp_out_norm = bind_norm(m, "mlp_out_norm", hidden_, block_ == kSandwich);
    l.q_norm = bind_norm(m, "q_norm", d, false);
    l.k_norm = bind_norm(m, "k_norm", d, false);
    TORCH_CHECK(!l.q_norm.weight == !l.k_norm.weight,
                "decode stack: q_norm and k_norm come together");
    l.qkv = bind_linear(m, "qkv", (heads_ + 2 * kv_heads_) * d, hidden_);
    l.o = bind_linear(m, "o", hidden_, heads_ * d);
    if (m.count("moe.config")) {
      moes_.push_back(bind_moe(m, hidden_, [&](const std::string& name,
                                               std::vector<int64_t> shape, bool required) {
        return bind_tensor(m, name, std::move(shape), required);
      }));
      const MoeMlp &first = moes_.front(), &last = moes_.back();
      TORCH_CHECK(first.experts == last.experts && first.top_k == last.top_k &&
                      first.inter == last.inter && first.shared_inter == last.shared_inter,
                  "decode stack: every MoE layer has the same experts");  // one scratch
      l.moe = static_cast<int64_t>(moes_.size()) - 1;
    } else {
      l.up = bind_linear(m, gated_ ? "gate_up" : "up", (gated_ ? 2 : 1) * inter_, hidden_);
      l.down = bind_linear(m, "down", hidden_, inter_);
    }
    l.alibi = bind_tensor(m, "alibi_slopes", {heads_}, false);
    TORCH_CHECK(window >= 0 && rope_table >= 0, "decode stack: negative window or table");
    l.window = window;
    l.rope_table = rope_table;
    return l;
  }

  // The step's adapter slots [B] once checked, or null when no row uses an adapter.
  const int64_t* checked_adapters(const std::optional<at::Tensor>& adapters, int64_t rows) const {
    if (!adapters.has_value() || !adapters->defined()) return nullptr;
    const at::Tensor& t = *adapters;
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.is_contiguous() &&
                    t.dim() == 1 && t.numel() == rows,
                "adapters must be an int64 CPU tensor [B]");
    const int64_t* slots = t.data_ptr<int64_t>();
    bool any = false;
    for (int64_t b = 0; b < rows; ++b) {  // a slot past num_adapters_ adapts none of our linears
      TORCH_CHECK(slots[b] >= 0, "decode stack: negative adapter slot");
      any |= slots[b] != 0 && slots[b] <= num_adapters_;
    }
    return any ? slots : nullptr;
  }

  // Every layer's K and V caches: [kv_heads, slots, row] of one format of attention.h, K's and
  // V's alike (the number of slots may differ between layers of different KV groups).
  void check_caches(const std::vector<at::Tensor>& k_caches,
                    const std::vector<at::Tensor>& v_caches) const {
    TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(),
                "one K and one V cache per layer");
    for (size_t i = 0; i < layers_.size(); ++i) {
      const int64_t num_slots = k_caches[i].dim() == 3 ? k_caches[i].size(1) : -1;
      for (const at::Tensor* t : {&k_caches[i], &v_caches[i]}) {
        TORCH_CHECK(t->is_contiguous() && t->dim() == 3 && t->size(0) == kv_heads_ &&
                        t->size(1) == num_slots && kv_head_dim(*t) == head_dim_ &&
                        t->scalar_type() == k_caches[i].scalar_type(),
                    "KV caches must be [kv_heads, slots, row] of head_dim, K's and V's alike");
      }
    }
  }

  void check_inputs(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                    const at::Tensor& slots, const at::Tensor& tables,
                    const at::Tensor& seq_lens, int64_t block_size, int64_t num_slots) const {
    check_f32(hidden, "hidden");
    TORCH_CHECK(hidden.dim() == 2 && hidden.size(1) == hidden_ && hidden.is_contiguous(),
                "hidden must be [B, hidden]");
    const int64_t rows = hidden.size(0);
    TORCH_CHECK(cos.dim() == 3 && cos.sizes() == sin.sizes() && cos.size(0) >= num_tables_ &&
                    cos.size(1) == rows && cos.size(2) <= head_dim_ && cos.size(2) % 2 == 0,
                "cos / sin must be [tables, B, rotary_dim]");
    if (cos.numel() > 0) {
      check_f32(cos, "cos");
      check_f32(sin, "sin");
      TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos / sin must be contiguous");
    }
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

  // Layer `prev`'s branch of row b (what it adds to the residual stream) into `dst`.
  void branch_row(const Layer& prev, const Rows& r, int64_t b, float* dst) const {
    const float* down = r.down + b * r.down_w;
    if (block_ == kSandwich) {
      norm_row(dst, down, prev.mlp_out_norm, hidden_, eps_, layer_norm_);
    } else if (block_ == kSequential) {
      for (int64_t i = 0; i < hidden_; ++i) dst[i] = down[i] * multiplier_;
    } else {
      const float* o = r.o + b * r.o_w;
      for (int64_t i = 0; i < hidden_; ++i) dst[i] = o[i] + down[i];
    }
  }

  // residual[b] += branch (none for the first layer), then the attention's (and, with two
  // parallel norms, the MLP's) normed input.
  void pre_attention_row(const Layer& l, const Layer* prev, const Step& s, const Rows& r,
                         const Buffers& buf, int64_t b, std::vector<float>& branch) const {
    float* res = s.residual + b * hidden_;
    if (prev != nullptr) {
      branch_row(*prev, r, b, branch.data());
#pragma omp simd
      for (int64_t i = 0; i < hidden_; ++i) res[i] += branch[i];
    }
    norm_row(r.normed + b * hidden_, res, l.input_norm, hidden_, eps_, layer_norm_);
    // a parallel block's MLP reads this norm too
    if (l.qkv.quantized || (block_ == kParallel && l.up.quantized)) {
      buf.normed_q.quantize(*kern_, r.normed, hidden_, b, 0, hidden_);
    }
    if (const LoraPair* p = l.qkv.adapter(s.adapters, b)) {
      lora_shrink(*p, r.normed + b * hidden_, hidden_, 0, hidden_, r.xa_qkv + b * rank_qkv_);
    }
    if (block_ == kParallelTwoNorms) {
      norm_row(r.mlp_normed + b * hidden_, res, l.mlp_norm, hidden_, eps_, layer_norm_);
      if (l.up.quantized) buf.mlp_q.quantize(*kern_, r.mlp_normed, hidden_, b, 0, hidden_);
    }
    if (block_ == kParallel || block_ == kParallelTwoNorms) {  // the MLP's input is ready too
      if (const LoraPair* p = l.up.adapter(s.adapters, b)) {
        const float* x = (block_ == kParallel ? r.normed : r.mlp_normed) + b * hidden_;
        lora_shrink(*p, x, hidden_, 0, hidden_, r.xa_up + b * rank_up_);
      }
    }
  }

  // After o_proj: sequential adds o * multiplier to the stream, a sandwich its post-normed o;
  // both then norm the stream for the MLP (parallel blocks have nothing to do here).
  void pre_mlp_row(const Layer& l, const Step& s, const Rows& r, const Buffers& buf, int64_t b,
                   std::vector<float>& branch) const {
    float* res = s.residual + b * hidden_;
    const float* o = r.o + b * r.o_w;
    if (block_ == kSandwich) {
      norm_row(branch.data(), o, l.attn_out_norm, hidden_, eps_, layer_norm_);
    } else {
      for (int64_t i = 0; i < hidden_; ++i) branch[i] = o[i] * multiplier_;
    }
#pragma omp simd
    for (int64_t i = 0; i < hidden_; ++i) res[i] += branch[i];
    norm_row(r.normed + b * hidden_, res, l.mlp_norm, hidden_, eps_, layer_norm_);
    if (l.up.quantized) buf.normed_q.quantize(*kern_, r.normed, hidden_, b, 0, hidden_);
    if (const LoraPair* p = l.up.adapter(s.adapters, b)) {
      lora_shrink(*p, r.normed + b * hidden_, hidden_, 0, hidden_, r.xa_up + b * rank_up_);
    }
  }

  void run_program(const Step& s, const Buffers& buf, PhaseCounter* counter) const {
    const int64_t hd = hidden_, d = head_dim_, rows = s.rows;
    const Rows r{buf.normed.data_ptr<float>(),
                 buf.mlp_normed.data_ptr<float>(),
                 buf.qkv.data_ptr<float>(),
                 buf.attn.data_ptr<float>(),
                 buf.o.data_ptr<float>(),
                 buf.up.data_ptr<float>(),
                 buf.act.data_ptr<float>(),
                 buf.down.data_ptr<float>(),
                 qkv_tiles_ * kTile,
                 o_tiles_ * kTile,
                 up_tiles_ * kTile,
                 down_tiles_ * kTile,
                 data_or_null(buf.xa_qkv),
                 data_or_null(buf.xa_o),
                 data_or_null(buf.xa_up),
                 data_or_null(buf.xa_down)};
    AttendScratch scratch;  // this thread's
    std::vector<float> branch(hd);
    const bool mlp_after_o = block_ == kSequential || block_ == kSandwich;
    // the MLP reads the pre-MLP norm (sequential, sandwich), its own parallel norm, or the input's
    const bool two_norms = block_ == kParallelTwoNorms;
    const float* mlp_in = two_norms ? r.mlp_normed : r.normed;
    const QuantRows& mlp_in_q = two_norms ? buf.mlp_q : buf.normed_q;
    const int64_t group = heads_ / kv_heads_;
    // Task t of a linear [n, k]: output columns [16 t, 16 t + 16) of every row, from x (fp32
    // tiles) or its int8 copy xq (a quantized weight: 8-column groups 2 t and 2 t + 1); then the
    // LoRA expand of each adapter row from its shrink xa (row stride xa_s, in `parts` partials).
    auto linear = [&](const Linear& lin, const float* x, int64_t k, const QuantRows& xq, float* y,
                      int64_t ys, const float* xa, int64_t xa_s, int64_t parts = 1) {
      return [&, x, k, y, ys, xa, xa_s, parts](int64_t t) {
        if (!lin.quantized) {
          packed_tile(rows, x, k, lin.tiles + t * k * kTile, kTile, k, y + t * kTile, ys,
                      lin.bias ? lin.bias + t * kTile : nullptr);
        } else {
          const int64_t g0 = 2 * t, g1 = std::min(g0 + 2, (lin.matrix.n + 7) / quant::kGroup);
          for (int64_t r0 = 0; r0 < rows; r0 += kQuantRowChunk) {
            const int64_t chunk = std::min(kQuantRowChunk, rows - r0);
            kern_->gemm_i8(lin.matrix, xq.rows_from(r0), chunk, g0, g1, y + r0 * ys, ys,
                           lin.bias);
          }
        }
        if (s.adapters == nullptr) return;
        const int64_t width = std::min(kTile, lin.n - t * kTile);
        for (int64_t b = 0; b < rows; ++b) {
          if (const LoraPair* p = lin.adapter(s.adapters, b)) {
            lora_expand(*p, xa + b * xa_s, parts, xa_s / parts, t, width, y + b * ys + t * kTile);
          }
        }
      };
    };

    for (size_t li = 0; li < layers_.size(); ++li) {
      const Layer& l = layers_[li];
      const Layer* prev = li == 0 ? nullptr : &layers_[li - 1];
      const LayerCache lc{s.slots[li],       s.tables[li],     s.table_width[li],
                          s.num_slots[li],   s.k_caches[li],   s.v_caches[li]};
      PhaseCounter* c = counter + li * kPhasesPerLayer;
      const bool attn_q_in_task = l.o.quantized && attn_quant_in_task_;
      run_phase(c[0], rows, [&](int64_t b) { pre_attention_row(l, prev, s, r, buf, b, branch); });
      run_phase(c[1], qkv_tiles_,
                linear(l.qkv, r.normed, hd, buf.normed_q, r.qkv, r.qkv_w, r.xa_qkv, rank_qkv_));
      run_phase(c[2], rows, [&](int64_t b) {
        rope_and_store(l, s, lc, r.qkv + b * r.qkv_w, b);
      });
      run_phase(c[3], rows * kv_heads_, [&](int64_t task) {
        const int64_t b = task / kv_heads_, h = task % kv_heads_;
        attend_group(l, s, lc, r.qkv + b * r.qkv_w, b, h, r.attn, scratch);
        if (attn_q_in_task) {
          buf.attn_q.quantize(*kern_, r.attn, heads_ * d, b, h * group * d, group * d);
        }
        if (const LoraPair* p = l.o.adapter(s.adapters, b)) {  // this task's slice of o's shrink
          lora_shrink(*p, r.attn + b * heads_ * d, heads_ * d, h * group * d, group * d,
                      r.xa_o + (b * kv_heads_ + h) * rank_o_);
        }
      });
      run_phase(c[4], l.o.quantized && !attn_q_in_task ? rows : 0, [&](int64_t b) {
        buf.attn_q.quantize(*kern_, r.attn, heads_ * d, b, 0, heads_ * d);
      });
      run_phase(c[5], o_tiles_, linear(l.o, r.attn, heads_ * d, buf.attn_q, r.o, r.o_w, r.xa_o,
                                       kv_heads_ * rank_o_, kv_heads_));
      run_phase(c[6], mlp_after_o ? rows : 0,
                [&](int64_t b) { pre_mlp_row(l, s, r, buf, b, branch); });
      if (l.moe >= 0) {
        PhaseCounter* mc = counter + layers_.size() * kPhasesPerLayer + 1 + li * kMoePhases;
        run_moe_mlp(moes_[l.moe], li, rows, hd, mlp_in, *buf.moe, r.down, r.down_w,
                    [&](int p, int64_t n, const auto& task) { run_phase(mc[p], n, task); });
        continue;
      }
      run_phase(c[7], up_tiles_,
                linear(l.up, mlp_in, hd, mlp_in_q, r.up, r.up_w, r.xa_up, rank_up_));
      run_phase(c[8], rows, [&](int64_t b) {
        const float* x = r.up + b * r.up_w;
        act_row(r.act + b * inter_, x, gated_ ? x + inter_ : nullptr, inter_, act_);
        if (l.down.quantized) buf.act_q.quantize(*kern_, r.act, inter_, b, 0, inter_);
        if (const LoraPair* p = l.down.adapter(s.adapters, b)) {
          lora_shrink(*p, r.act + b * inter_, inter_, 0, inter_, r.xa_down + b * rank_down_);
        }
      });
      run_phase(c[9], down_tiles_, linear(l.down, r.act, inter_, buf.act_q, r.down, r.down_w,
                                          r.xa_down, rank_down_));
    }
    run_phase(counter[layers_.size() * kPhasesPerLayer], rows, [&](int64_t b) {
      branch_row(layers_.back(), r, b, s.out + b * hd);
    });
  }

  // Row b's q and k heads (in its qkv row [q heads | k heads | v heads]): per-head norm when
  // the model has one, RoPE at the row's position with the layer's table; then its K and V go
  // to the cache slot.
  void rope_and_store(const Layer& l, const Step& s, const LayerCache& lc, float* qkv_row,
                      int64_t b) const {
    const int64_t d = head_dim_, rd = s.rotary_dim;
    const int64_t offset = l.rope_table * s.table_stride + b * rd;
    const float *c = s.cos + offset, *sn = s.sin + offset;
    for (int64_t h = 0; h < heads_ + kv_heads_; ++h) {
      float* v = qkv_row + h * d;
      if (l.q_norm.weight != nullptr) {
        norm_row(v, v, h < heads_ ? l.q_norm : l.k_norm, d, eps_, layer_norm_);
      }
      if (rd > 0) rotate(v, c, sn, rd, interleaved_);
    }
    const int64_t slot = lc.slots[b];
    for (int64_t h = 0; h < kv_heads_; ++h) {
      lc.k.store(h, slot, qkv_row + (heads_ + h) * d);
      lc.v.store(h, slot, qkv_row + (heads_ + kv_heads_ + h) * d);
    }
  }

  // The query heads of KV head h in row b against the row's visible keys, read in place.
  void attend_group(const Layer& l, const Step& s, const LayerCache& lc, const float* qkv_row,
                    int64_t b, int64_t h, float* attn, AttendScratch& scratch) const {
    const int64_t d = head_dim_, group = heads_ / kv_heads_, seq_len = s.seq_lens[b];
    const int64_t first = l.window > 0 ? std::max<int64_t>(0, seq_len - l.window) : 0;
    attend_kv_head(qkv_row + h * group * d, d, group, lc.tables + b * lc.table_width,
                   s.block_size, first, seq_len - first, lc.k.head(h), lc.v.head(h), d, scale_,
                   attn + (b * heads_ + h * group) * d, scratch, softcap_, l.alibi == nullptr ? nullptr : l.alibi + h * group);
  }

  int64_t hidden_, heads_, kv_heads_, head_dim_, inter_;
  float eps_, scale_, multiplier_;
  bool layer_norm_;
  int64_t block_, act_;
  bool gated_, interleaved_;
  float softcap_;
  const quant::Kernels* kern_;  // the quantized layers' kernel table, chosen once
  int64_t num_adapters_;         // LoRA adapter slots 1..num_adapters_ (0: the base model)
  // the largest LoRA rank on each linear, over layers and adapters (shrink buffer widths)
  int64_t rank_qkv_ = 0, rank_o_ = 0, rank_up_ = 0, rank_down_ = 0;
  // which int8 row copies some layer needs
  bool quant_normed_ = false, quant_mlp_normed_ = false, quant_attn_ = false, quant_act_ = false;
  bool attn_quant_in_task_ = false;  // a KV head's query heads span whole 32-wide blocks
  int64_t qkv_tiles_, o_tiles_, up_tiles_, down_tiles_;
  int64_t num_tables_ = 1;
  std::vector<Layer> layers_;
  std::vector<MoeMlp> moes_;  // the MoE layers' MLPs
  std::vector<at::Tensor> kept_;  // the tensors layers_ points into
};

void register_decode_stack(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<DecodeStack>(m, "DecodeStack")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, double, double, bool,
                    int64_t, int64_t, bool, bool, double, const std::vector<TensorMap>&,
                    const std::vector<int64_t>&, const std::vector<int64_t>&,
                    const std::string&, int64_t>(),
           py::arg("hidden_size"), py::arg("num_heads"), py::arg("num_kv_heads"),
           py::arg("head_dim"), py::arg("intermediate_size"), py::arg("eps"), py::arg("scale"),
           py::arg("residual_multiplier"), py::arg("layer_norm"), py::arg("block"),
           py::arg("activation"), py::arg("gated"), py::arg("rotary_interleaved"),
           py::arg("softcap"), py::arg("layers"), py::arg("windows"), py::arg("rope_tables"),
           py::arg("isa") = "auto", py::arg("num_adapters") = 0)
      .def("forward", &DecodeStack::forward, py::arg("hidden"), py::arg("cos"), py::arg("sin"),
           py::arg("slots"), py::arg("block_tables"), py::arg("seq_lens"), py::arg("block_size"),
           py::arg("k_caches"), py::arg("v_caches"), py::arg("adapters") = py::none(),
           py::arg("k_scales") = std::vector<double>{}, py::arg("v_scales") = std::vector<double>{},
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("isa", &DecodeStack::isa);
}

}  // namespace pytgi
