// Torch-facing ops of the quantized linear kernels (quant.h): argument checks, the choice of the
// ISA table (the one dispatch point), activation quantisation, and the parallel loops.
//
// Two ways to multiply, chosen by the caller (pytgi/backends/cpu/quant_ops.py):
//   int8 activations: x is quantised per row and 32-wide block, then the integer kernels run over
//       row chunks of 64 (a group's codes stay in L1 while the chunk's rows pass over them), the
//       groups split across threads;
//   fp32 activations: each 16-column tile is dequantised into a thread's fp32 panel [K, 16] and
//       the fp32 packed-tile GEMM (common.h) runs every row on it: exact weights, fp32 math.
#include "common.h"
#include "quant_ops.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace pytgi {
namespace quant {

constexpr int64_t kDirectRows = 8;  // fp32 activations: registers up to here, panels above

namespace {

constexpr int64_t kRowChunk = 64;

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

const float* checked_bias(const std::optional<at::Tensor>& bias, int64_t n) {
  if (!bias.has_value()) return nullptr;
  check_f32(*bias, "bias");
  TORCH_CHECK(bias->is_contiguous() && bias->numel() == n, "bias must be [N]");
  return bias->data_ptr<float>();
}

void run_int8_acts(const Kernels& kern, const Matrix& w, const at::Tensor& x, const float* bias,
                   float* y) {
  const int64_t rows = x.size(0), xs = x.stride(0), kb = w.kblocks;
  // one scratch allocation per call, 4-byte words: q (8 per block), scale, sum, scaled sums
  auto scratch = at::empty({rows * kb * (8 + 2 + kSums)}, x.options());
  float* base = scratch.data_ptr<float>();
  int8_t* qp = reinterpret_cast<int8_t*>(base);
  float* sp = base + rows * kb * 8;
  int32_t* sump = reinterpret_cast<int32_t*>(sp + rows * kb);
  float* ssp = sp + 2 * rows * kb;
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t b, int64_t e) {
    kern.quantize_rows(xp + b * xs, xs, e - b, w.k, kb, qp + b * kb * kKBlock, sp + b * kb,
                       sump + b * kb, ssp + b * kb * kSums);
  });
  const int64_t active_groups = (w.n + kGroup - 1) / kGroup;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowChunk) {
    const int64_t chunk = std::min(kRowChunk, rows - r0);
    const Acts a{qp + r0 * kb * kKBlock, sp + r0 * kb, sump + r0 * kb, ssp + r0 * kb * kSums, kb};
    at::parallel_for(0, active_groups, 1, [&](int64_t g0, int64_t g1) {
      kern.gemm_i8(w, a, chunk, g0, g1, y + r0 * w.n, w.n, bias);
    });
  }
}

// Up to `direct_rows` rows: the weights dequantised in registers, each group streamed once.
void run_fp32_direct(const Kernels& kern, const Matrix& w, const at::Tensor& x, const float* bias,
                     float* y) {
  at::Tensor xk = x;
  if (w.k % kKBlock != 0) {  // the kernels read whole k-blocks: zero the tail
    xk = at::zeros({x.size(0), w.kblocks * kKBlock}, x.options());
    xk.narrow(1, 0, w.k).copy_(x);
  }
  const float* xp = xk.data_ptr<float>();
  const int64_t xs = xk.stride(0), rows = x.size(0);
  at::parallel_for(0, (w.n + kGroup - 1) / kGroup, 1, [&](int64_t g0, int64_t g1) {
    kern.gemm_f32(w, xp, xs, rows, g0, g1, y, w.n, bias);
  });
}

// More rows: each 16-column tile dequantised once into an fp32 panel for the packed-tile GEMM.
void run_fp32_panels(const Kernels& kern, const Matrix& w, const at::Tensor& x, const float* bias,
                     float* y) {
  const int64_t rows = x.size(0), xs = x.stride(0), tiles = (w.n + kPanelCols - 1) / kPanelCols;
  std::vector<float> bias_pad(tiles * kPanelCols, 0.f);
  if (bias) std::copy_n(bias, w.n, bias_pad.begin());
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> panel(w.kblocks * kKBlock * kPanelCols), tail;
    for (int64_t t = t0; t < t1; ++t) {
      kern.dequant_group(w, 2 * t, panel.data(), kPanelCols);
      kern.dequant_group(w, 2 * t + 1, panel.data() + kGroup, kPanelCols);
      const int64_t c0 = t * kPanelCols, width = std::min(kPanelCols, w.n - c0);
      const float* b = bias ? bias_pad.data() + c0 : nullptr;
      if (width == kPanelCols) {
        packed_tile(rows, xp, xs, panel.data(), kPanelCols, w.k, y + c0, w.n, b);
        continue;
      }
      tail.resize(rows * kPanelCols);
      packed_tile(rows, xp, xs, panel.data(), kPanelCols, w.k, tail.data(), kPanelCols, b);
      for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(tail.data() + r * kPanelCols, width, y + r * w.n + c0);
      }
    }
  });
}

}  // namespace

namespace {

bool cpu_has_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  return cpu_has_avx2() && __builtin_cpu_supports("avx512vnni") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
#else
  return false;
#endif
}

const Kernels* available(const std::string& isa) {
  if (isa == "scalar") return &scalar_kernels();
  if (isa == "avx2") return cpu_has_avx2() ? avx2_kernels() : nullptr;
  if (isa == "avx512_vnni") return cpu_has_vnni() ? vnni_kernels() : nullptr;
  TORCH_CHECK(false, "unknown isa '", isa, "' (auto, avx512_vnni, avx2, scalar)");
  return nullptr;
}

}  // namespace

// Every table this build and CPU can run, best first.
std::vector<std::string> available_isas() {
  std::vector<std::string> out;
  for (const char* isa : {"avx512_vnni", "avx2", "scalar"}) {
    if (available(isa) != nullptr) out.emplace_back(isa);
  }
  return out;
}

// The dispatch point: "auto" takes the best table this build and CPU have; a named one must be
// available. The platform names its table once at start-up (DeviceConfig.quant_isa) and passes
// it to every call. Arm tables go here once they exist.
const Kernels& select(const std::string& isa) {
  if (isa == "auto") return select(available_isas().front());
  const Kernels* kern = available(isa);
  TORCH_CHECK(kern != nullptr, "the ", isa, " quant kernels are not available on this build/CPU");
  return *kern;
}

static int64_t expected_scale_rows(int64_t scale_block, int64_t kblocks) {
  switch (scale_block) {
    case 16: return 2 * kblocks;
    case 32: return kblocks;
    case 64: return (kblocks + 1) / 2;
    case 0: return 1;
    default: TORCH_CHECK(false, "scale_block must be 16, 32, 64 or 0 (per column)");
  }
  return 0;
}

Matrix make_matrix(const at::Tensor& codes, const at::Tensor& scales,
                   const std::optional<at::Tensor>& mins, const std::optional<at::Tensor>& table,
                   int64_t format, int64_t n, int64_t k, int64_t scale_block) {
  TORCH_CHECK(format >= kInt8 && format <= kFp8, "unknown quant format ", format);
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 3 &&
                  codes.size(2) == block_bytes(static_cast<int>(format)),
              "codes must be contiguous uint8 [groups, kblocks, block bytes]");
  const int64_t groups = codes.size(0), kblocks = codes.size(1);
  TORCH_CHECK(n > 0 && k > 0 && groups % 2 == 0 && groups * kGroup >= n &&
                  groups * kGroup - n < kPanelCols && kblocks * kKBlock >= k &&
                  kblocks * kKBlock - k < kKBlock,
              "codes [", groups, ", ", kblocks, "] do not fit a [", n, ", ", k, "] weight");
  TORCH_CHECK(scale_block != 16 || format == kInt8 || format == kFp8,
              "16-wide scale blocks need 8-bit codes");
  const bool half = scales.scalar_type() == at::kHalf;
  TORCH_CHECK((half || scales.scalar_type() == at::kFloat) && scales.is_contiguous() &&
                  scales.dim() == 3 && scales.size(0) == groups &&
                  scales.size(1) == expected_scale_rows(scale_block, kblocks) &&
                  scales.size(2) == kGroup,
              "scales must be contiguous float32/float16 [groups, scale rows, 8]");
  Matrix w{};
  w.format = static_cast<int>(format);
  w.n = n;
  w.k = k;
  w.groups = groups;
  w.kblocks = kblocks;
  w.codes = codes.data_ptr<uint8_t>();
  w.scales = scales.data_ptr();
  w.half_scales = half;
  w.scale_block = scale_block;
  w.scale_rows = scales.size(1);
  if (mins.has_value()) {
    TORCH_CHECK(format == kInt8 || format == kInt4, "mins need int8 or int4 codes");
    TORCH_CHECK(mins->sizes() == scales.sizes() && mins->scalar_type() == scales.scalar_type() &&
                    mins->is_contiguous(),
                "mins must match the scales");
    w.mins = mins->data_ptr();
  }
  if (format == kLut4) {
    TORCH_CHECK(table.has_value() && table->scalar_type() == at::kFloat && table->numel() == 16 &&
                    table->is_contiguous(),
                "4-bit table codes need a float32 table of 16 values");
    const float* t = table->data_ptr<float>();
    for (int i = 0; i < 16; ++i) {
      TORCH_CHECK(std::fabs(t[i]) <= 1.f, "table values must lie in [-1, 1]");
      w.table[i] = t[i];
      w.table_i8[i] = static_cast<int8_t>(std::nearbyint(t[i] * 127.f));
    }
  }
  return w;
}

std::string quant_isa() { return select("auto").name; }

// x [M, K] -> (q int8 [M, KB * 32], scale [M, KB], sum int32 [M, KB], scaled_sum [M, 3 KB]).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_activations(
    const at::Tensor& x, const std::string& isa) {
  check_f32(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [M, K]");
  const Kernels& kern = select(isa);
  const int64_t rows = x.size(0), k = x.size(1), kb = (k + kKBlock - 1) / kKBlock;
  auto q = at::empty({rows, kb * kKBlock}, x.options().dtype(at::kChar));
  auto scale = at::empty({rows, kb}, x.options());
  auto sum = at::empty({rows, kb}, x.options().dtype(at::kInt));
  auto scaled_sum = at::empty({rows, kSums * kb}, x.options());
  kern.quantize_rows(x.data_ptr<float>(), x.stride(0), rows, k, kb, q.data_ptr<int8_t>(),
                     scale.data_ptr<float>(), sum.data_ptr<int32_t>(),
                     scaled_sum.data_ptr<float>());
  return {q, scale, sum, scaled_sum};
}

// y [M, N] = x [M, K] @ W^T (+ bias) for a packed quantized W (quant.h's layout). fp32
// activations dequantise in registers up to direct_rows rows, into panels above.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                        const std::optional<at::Tensor>& mins,
                        const std::optional<at::Tensor>& table, int64_t format, int64_t n,
                        int64_t k, int64_t scale_block, const std::optional<at::Tensor>& bias,
                        bool int8_acts, const std::string& isa, int64_t direct_rows) {
  const Kernels& kern = select(isa);
  const Matrix w = make_matrix(codes, scales, mins, table, format, n, k, scale_block);
  check_f32(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == k, "x must be [M, ", k, "]");
  TORCH_CHECK(!int8_acts || format != kFp8, "fp8 weights run with fp32 activations");
  const float* b = checked_bias(bias, n);
  auto y = at::empty({x.size(0), n}, x.options());
  if (x.size(0) == 0) return y;
  if (int8_acts) {
    run_int8_acts(kern, w, x, b, y.data_ptr<float>());
  } else if (x.size(0) <= direct_rows) {
    run_fp32_direct(kern, w, x, b, y.data_ptr<float>());
  } else {
    run_fp32_panels(kern, w, x, b, y.data_ptr<float>());
  }
  return y;
}

// Rows `ids` [T] (int64, each < N) of the dequantised weight -> [T, K]: the tied embedding's
// lookup. Each row dequantises its group of 8 and keeps one column.
at::Tensor quant_rows(const at::Tensor& ids, const at::Tensor& codes, const at::Tensor& scales,
                      const std::optional<at::Tensor>& mins,
                      const std::optional<at::Tensor>& table, int64_t format, int64_t n,
                      int64_t k, int64_t scale_block, const std::string& isa) {
  const Kernels& kern = select(isa);
  const Matrix w = make_matrix(codes, scales, mins, table, format, n, k, scale_block);
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1 && ids.is_contiguous(),
              "ids must be a contiguous int64 vector");
  const int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t t = 0; t < ids.numel(); ++t) TORCH_CHECK(ip[t] >= 0 && ip[t] < n, "id out of range");
  auto out = at::empty({ids.numel(), k}, scales.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  at::parallel_for(0, ids.numel(), 8, [&](int64_t b, int64_t e) {
    std::vector<float> panel(w.kblocks * kKBlock * kGroup);
    for (int64_t t = b; t < e; ++t) {
      kern.dequant_group(w, ip[t] / kGroup, panel.data(), kGroup);
      const int64_t c = ip[t] % kGroup;
      for (int64_t i = 0; i < k; ++i) op[t * k + i] = panel[i * kGroup + c];
    }
  });
  return out;
}

}  // namespace quant

void register_quant(pybind11::module& m) {
  namespace py = pybind11;
  m.def("quant_isa", &quant::quant_isa, "the quant kernel table 'auto' picks on this CPU");
  m.def("quant_isas", &quant::available_isas, "the quant kernel tables this build/CPU has");
  m.def("quantize_activations", &quant::quantize_activations,
        "x [M, K] -> int8 per 32-wide block (q, scale, sum, scaled_sum)", py::arg("x"),
        py::arg("isa") = "auto");
  m.def("quant_linear", &quant::quant_linear, "x @ W^T for a packed quantized W (fp32 out)",
        py::arg("x"), py::arg("codes"), py::arg("scales"), py::arg("mins"), py::arg("table"),
        py::arg("format"), py::arg("n"), py::arg("k"), py::arg("scale_block"),
        py::arg("bias") = py::none(), py::arg("int8_acts") = true, py::arg("isa") = "auto",
        py::arg("direct_rows") = quant::kDirectRows);
  m.def("quant_rows", &quant::quant_rows, "rows of a packed quantized W, dequantised",
        py::arg("ids"), py::arg("codes"), py::arg("scales"), py::arg("mins"), py::arg("table"),
        py::arg("format"), py::arg("n"), py::arg("k"), py::arg("scale_block"),
        py::arg("isa") = "auto");
}

}  // namespace pytgi
