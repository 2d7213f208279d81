// The fused decode stack's mixture-of-experts MLP (decode_stack.cpp runs it in place of a dense
// MLP on the layers that have one): per row, the router logits, the softmax top-k rule, each chosen
// expert's gated MLP on the packed fp32 tiles, and the weighted sum; optionally a shared expert
// scaled by sigmoid(its gate). Exactly what layers/moe computes on the layer-by-layer path (the
// `softmax_topk` router of layers/moe/config.py, FusedExperts on the same packed tiles):
//
//   probs = softmax(x @ router^T) [E];  (w, ids) = top-k of probs, broken as torch.topk breaks ties
//   (the same algorithm on the same (value, index) pairs, `torch_topk` below); w /= sum(w) when
//   renormalising; out = sum over the row's experts in ascending expert id of
//   w_e * down_e(act(gate_e(x)) * up_e(x))  (+ sigmoid(x . g) * shared(x) with a shared expert).
//
// Phases (each a set of independent tasks, run like every other phase of the stack):
//   0 route (rows), 1 plan (one task: the (row, expert) pairs grouped by expert, their input rows
//   gathered), 2 gate_up (active expert x 16-column tile, plus the shared expert's tiles),
//   3 activation (pairs, plus rows for the shared expert), 4 down (as 2), 5 combine (rows).
// The tile kernels are row invariant (common.h), so a row's output does not depend on which other
// rows chose its experts; at batch 1 only the k chosen experts' weights are read.
#pragma once

#include "common.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace pytgi {

constexpr int kMoePhases = 6;

// One MoE MLP's parameters: the router [tiles(E), hidden, 16], every expert's gate_up
// [E, tiles(2I), hidden, 16] (gate columns, then up columns) and down [E, tiles(hidden), I, 16];
// the shared expert's gate_up [tiles(2Is), hidden, 16] and down [tiles(hidden), Is, 16], and its
// gate [1, hidden, 16] (null: no shared expert / no gate).
struct MoeMlp {
  int64_t experts = 0, top_k = 0, inter = 0, act = 0, shared_inter = 0;
  bool renormalize = true;
  const float *router = nullptr, *gate_up = nullptr, *down = nullptr;
  const float *shared_gate_up = nullptr, *shared_down = nullptr, *shared_gate = nullptr;
  int64_t router_tiles = 0, gate_up_tiles = 0, down_tiles = 0, shared_gate_up_tiles = 0;
  bool has_shared() const { return shared_inter > 0; }
};

// `moe.config` (int64 [experts, top_k, intermediate, renormalize, activation,
// shared_intermediate]) and the tensors above, as `moe.router`, `moe.gate_up`, `moe.down`,
// `moe.shared_gate_up`, `moe.shared_down`, `moe.shared_gate`. bind(name, shape, required) checks
// and keeps a tensor (decode_stack.cpp's bind_tensor).
template <class Map, class Bind>
MoeMlp bind_moe(const Map& m, int64_t hidden, const Bind& bind) {
  const at::Tensor& config = m.at("moe.config");
  TORCH_CHECK(config.scalar_type() == at::kLong && config.numel() == 6 && config.is_contiguous(),
              "decode stack: moe.config must be int64 [6]");
  const int64_t* c = config.data_ptr<int64_t>();
  MoeMlp moe;
  moe.experts = c[0], moe.top_k = c[1], moe.inter = c[2], moe.renormalize = c[3] != 0;
  moe.act = c[4], moe.shared_inter = c[5];
  TORCH_CHECK(moe.experts > 0 && moe.top_k > 0 && moe.top_k <= moe.experts && moe.inter > 0 &&
                  moe.shared_inter >= 0 && moe.act >= kSilu && moe.act <= kGeluTanh,
              "decode stack: bad moe.config");
  auto tiles = [](int64_t n) { return (n + kTile - 1) / kTile; };
  moe.router_tiles = tiles(moe.experts);
  moe.gate_up_tiles = tiles(2 * moe.inter);
  moe.down_tiles = tiles(hidden);
  moe.router = bind("moe.router", {moe.router_tiles, hidden, kTile}, true);
  moe.gate_up = bind("moe.gate_up", {moe.experts, moe.gate_up_tiles, hidden, kTile}, true);
  moe.down = bind("moe.down", {moe.experts, moe.down_tiles, moe.inter, kTile}, true);
  if (moe.has_shared()) {
    moe.shared_gate_up_tiles = tiles(2 * moe.shared_inter);
    moe.shared_gate_up =
        bind("moe.shared_gate_up", {moe.shared_gate_up_tiles, hidden, kTile}, true);
    moe.shared_down = bind("moe.shared_down", {moe.down_tiles, moe.shared_inter, kTile}, true);
    moe.shared_gate = bind("moe.shared_gate", {1, hidden, kTile}, false);
  }
  return moe;
}

// The indices of the k largest of values[0, n), in torch.topk's order (largest=True,
// sorted=True) with its tie-breaking: ATen's CPU topk (TopKImpl.h) runs std::partial_sort when
// k * 64 <= n, else std::nth_element then std::sort of the first k - 1, over (value, index) pairs
// in index order with the comparator "a NaN first, else the larger value". Tied values thus come
// out in whatever order those std algorithms leave them, not lowest index first.
inline void torch_topk(const float* values, int64_t n, int64_t k, int64_t* ids,
                       std::vector<std::pair<double, int64_t>>& queue) {
  using Elem = std::pair<double, int64_t>;
  queue.resize(n);
  for (int64_t j = 0; j < n; ++j) queue[j] = {values[j], j};
  auto larger = [](const Elem& x, const Elem& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  if (k * 64 <= n) {
    std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), larger);
  } else {
    std::nth_element(queue.begin(), queue.begin() + k - 1, queue.end(), larger);
    std::sort(queue.begin(), queue.begin() + k - 1, larger);
  }
  for (int64_t j = 0; j < k; ++j) ids[j] = queue[j].second;
}

// A step's MoE scratch, shared by the threads (each phase writes disjoint parts of it). P pairs
// = rows * top_k.
struct MoeScratch {
  std::vector<float> logits;        // [rows, router_tiles * 16]
  std::vector<float> weights;       // [P], pair b * k + j: row b's j-th pick
  std::vector<int64_t> ids;         // [P]
  std::vector<float> shared_scale;  // [rows]: sigmoid of the shared expert's gate (1 without)
  std::vector<int64_t> offsets;     // [E + 1]: expert e's pairs are sorted rows [o[e], o[e+1])
  std::vector<int64_t> position;    // [P]: pair -> its sorted row
  std::vector<int64_t> active;      // the experts with pairs, ascending; num_active of them
  // per layer: a thread computes a phase's task count from it after the plan phase, possibly
  // late (descheduled), when a faster thread may already be planning a later layer
  std::vector<int64_t> num_active;
  std::vector<float> gathered, up, act, down;  // sorted rows: [P, hidden], [P, up_w], [P, I],
                                               // [P, down_w]
  std::vector<float> shared_up, shared_act, shared_down;  // [rows, ...] likewise
  int64_t up_w = 0, down_w = 0, shared_up_w = 0;

  MoeScratch(int64_t rows, const MoeMlp& moe, int64_t hidden, int64_t layers)
      : num_active(layers, 0) {
    const int64_t pairs = rows * moe.top_k;
    up_w = moe.gate_up_tiles * kTile, down_w = moe.down_tiles * kTile;
    shared_up_w = moe.shared_gate_up_tiles * kTile;
    logits.resize(rows * moe.router_tiles * kTile);
    weights.resize(pairs), ids.resize(pairs), position.resize(pairs);
    shared_scale.assign(rows, 1.f);
    offsets.resize(moe.experts + 1), active.resize(moe.experts);
    gathered.resize(pairs * hidden), up.resize(pairs * up_w), act.resize(pairs * moe.inter);
    down.resize(pairs * down_w);
    if (moe.has_shared()) {
      shared_up.resize(rows * shared_up_w), shared_act.resize(rows * moe.shared_inter);
      shared_down.resize(rows * down_w);
    }
  }
};

// Layer `layer`'s MoE MLP of `rows` rows of x [rows, hidden] (row stride hidden) into out (row
// stride out_w). phase(p, n, task) runs the layer's MoE phase p: tasks [0, n), then waits for
// them all.
template <class Phase>
void run_moe_mlp(const MoeMlp& moe, int64_t layer, int64_t rows, int64_t hidden, const float* x,
                 MoeScratch& s, float* out, int64_t out_w, const Phase& phase) {
  const int64_t k = moe.top_k, pairs = rows * k, inter = moe.inter;
  phase(0, rows, [&](int64_t b) {  // route row b
    const float* xb = x + b * hidden;
    float* logits = s.logits.data() + b * moe.router_tiles * kTile;
    for (int64_t t = 0; t < moe.router_tiles; ++t) {
      packed_tile(1, xb, hidden, moe.router + t * hidden * kTile, kTile, hidden,
                  logits + t * kTile, kTile, nullptr);
    }
    float max = -std::numeric_limits<float>::infinity(), total = 0.f;
    for (int64_t e = 0; e < moe.experts; ++e) max = std::max(max, logits[e]);
    for (int64_t e = 0; e < moe.experts; ++e) total += (logits[e] = std::exp(logits[e] - max));
    for (int64_t e = 0; e < moe.experts; ++e) logits[e] /= total;  // the probabilities
    std::vector<std::pair<double, int64_t>> queue;
    int64_t* ids = s.ids.data() + b * k;
    float* w = s.weights.data() + b * k;
    torch_topk(logits, moe.experts, k, ids, queue);
    float sum = 0.f;
    for (int64_t j = 0; j < k; ++j) sum += (w[j] = logits[ids[j]]);
    if (moe.renormalize) {
      for (int64_t j = 0; j < k; ++j) w[j] /= sum;
    }
    if (moe.shared_gate != nullptr) {
      float gate[kTile];
      packed_tile(1, xb, hidden, moe.shared_gate, kTile, hidden, gate, kTile, nullptr);
      s.shared_scale[b] = 1.f / (1.f + std::exp(-gate[0]));
    }
  });
  phase(1, 1, [&](int64_t) {  // group the pairs by expert (stable), gather their input rows
    std::fill(s.offsets.begin(), s.offsets.end(), 0);
    for (int64_t p = 0; p < pairs; ++p) ++s.offsets[s.ids[p] + 1];
    int64_t& num_active = s.num_active[layer];
    num_active = 0;
    for (int64_t e = 0; e < moe.experts; ++e) {
      if (s.offsets[e + 1] > 0) s.active[num_active++] = e;
      s.offsets[e + 1] += s.offsets[e];
    }
    std::vector<int64_t> next(s.offsets.begin(), s.offsets.end() - 1);
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t row = next[s.ids[p]]++;
      s.position[p] = row;
      std::copy_n(x + (p / k) * hidden, hidden, s.gathered.data() + row * hidden);
    }
  });
  const int64_t shared_up_tasks = moe.has_shared() ? moe.shared_gate_up_tiles : 0;
  const int64_t routed_up = s.num_active[layer] * moe.gate_up_tiles;
  phase(2, routed_up + shared_up_tasks, [&](int64_t t) {
    if (t >= routed_up) {  // the shared expert over every row
      const int64_t tile = t - routed_up;
      packed_tile(rows, x, hidden, moe.shared_gate_up + tile * hidden * kTile, kTile, hidden,
                  s.shared_up.data() + tile * kTile, s.shared_up_w, nullptr);
      return;
    }
    const int64_t e = s.active[t / moe.gate_up_tiles], tile = t % moe.gate_up_tiles;
    const int64_t r0 = s.offsets[e], n = s.offsets[e + 1] - r0;
    packed_tile(n, s.gathered.data() + r0 * hidden, hidden,
                moe.gate_up + (e * moe.gate_up_tiles + tile) * hidden * kTile, kTile, hidden,
                s.up.data() + r0 * s.up_w + tile * kTile, s.up_w, nullptr);
  });
  phase(3, pairs + (moe.has_shared() ? rows : 0), [&](int64_t t) {
    if (t >= pairs) {
      const int64_t b = t - pairs, si = moe.shared_inter;
      const float* u = s.shared_up.data() + b * s.shared_up_w;
      act_row(s.shared_act.data() + b * si, u, u + si, si, moe.act);
      return;
    }
    const float* u = s.up.data() + t * s.up_w;
    act_row(s.act.data() + t * inter, u, u + inter, inter, moe.act);
  });
  const int64_t routed_down = s.num_active[layer] * moe.down_tiles;
  phase(4, routed_down + (moe.has_shared() ? moe.down_tiles : 0), [&](int64_t t) {
    if (t >= routed_down) {
      const int64_t tile = t - routed_down, si = moe.shared_inter;
      packed_tile(rows, s.shared_act.data(), si, moe.shared_down + tile * si * kTile, kTile, si,
                  s.shared_down.data() + tile * kTile, s.down_w, nullptr);
      return;
    }
    const int64_t e = s.active[t / moe.down_tiles], tile = t % moe.down_tiles;
    const int64_t r0 = s.offsets[e], n = s.offsets[e + 1] - r0;
    packed_tile(n, s.act.data() + r0 * inter, inter,
                moe.down + (e * moe.down_tiles + tile) * inter * kTile, kTile, inter,
                s.down.data() + r0 * s.down_w + tile * kTile, s.down_w, nullptr);
  });
  phase(5, rows, [&](int64_t b) {  // out[b] = sum in ascending expert id (+ the shared expert)
    float* o = out + b * out_w;
    std::fill_n(o, hidden, 0.f);
    const int64_t* ids = s.ids.data() + b * k;
    std::vector<int64_t> order(k);  // the row's picks in ascending expert id
    for (int64_t j = 0; j < k; ++j) order[j] = j;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return ids[a] < ids[c]; });
    for (int64_t j : order) {
      const float w = s.weights[b * k + j];
      const float* y = s.down.data() + s.position[b * k + j] * s.down_w;
      for (int64_t i = 0; i < hidden; ++i) o[i] += y[i] * w;
    }
    if (moe.has_shared()) {
      const float scale = s.shared_scale[b];
      const float* y = s.shared_down.data() + b * s.down_w;
      for (int64_t i = 0; i < hidden; ++i) o[i] += moe.shared_gate ? scale * y[i] : y[i];
    }
  });
}

}  // namespace pytgi
