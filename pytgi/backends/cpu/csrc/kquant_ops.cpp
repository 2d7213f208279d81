// Torch-facing ops of the native K-quant kernels (kquant.h): argument checks, the table (named
// as quant_ops.cpp's select() names the quant tables, so the platform's one choice at start-up
// covers both), activation quantisation per 256-wide block, and the parallel loops:
//   int8 activations: row chunks of 64 (a group pair's blobs stay in cache while the chunk's rows
//       pass over them), pairs of groups split across threads;
//   fp32 activations: every 16-column tile dequantised exactly into a thread's fp32 panel [K, 16]
//       under the fp32 packed-tile GEMM (common.h), at every row count: one chain per row.
#include "common.h"
#include "kquant.h"
#include "quant_ops.h"

#include <ATen/Parallel.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace pytgi {
namespace kquant {
namespace {

constexpr int64_t kRowChunk = 64;

// The K-quant table of the quant table `isa` names ("auto": the best this build and CPU have).
const Kernels& select(const std::string& isa) {
  const std::string name = quant::select(isa).name;  // checks the CPU and the build
  const Kernels* kern = nullptr;
  if (name == "avx512_vnni") kern = vnni512_kernels();
  if (name == "avx2") kern = avx2_kernels();
  return kern != nullptr ? *kern : scalar_kernels();
}

Matrix make_matrix(const at::Tensor& blob, const at::Tensor& d, int64_t format, int64_t n,
                   int64_t k) {
  TORCH_CHECK(format == kQ4K || format == kQ6K, "unknown K-quant format ", format);
  TORCH_CHECK(blob.scalar_type() == at::kByte && blob.is_contiguous() && blob.dim() == 3 &&
                  blob.size(2) == blob_bytes(static_cast<int>(format)),
              "blob must be contiguous uint8 [groups, supers, blob bytes]");
  const int64_t groups = blob.size(0), supers = blob.size(1);
  TORCH_CHECK(n > 0 && k > 0 && groups % 2 == 0 && groups * kGroup >= n &&
                  groups * kGroup - n < 2 * kGroup && supers * kSuper == k,
              "blob [", groups, ", ", supers, "] does not fit a [", n, ", ", k, "] weight");
  TORCH_CHECK(d.scalar_type() == at::kFloat && d.is_contiguous() && d.dim() == 4 &&
                  d.size(0) == groups && d.size(1) == supers && d.size(2) == 2 &&
                  d.size(3) == kGroup,
              "d must be contiguous float32 [groups, supers, 2, 8]");
  return Matrix{static_cast<int>(format), n, k, groups, supers, blob.data_ptr<uint8_t>(),
                d.data_ptr<float>()};
}

const float* checked_bias(const std::optional<at::Tensor>& bias, int64_t n) {
  if (!bias.has_value()) return nullptr;
  check_f32(*bias, "bias");
  TORCH_CHECK(bias->is_contiguous() && bias->numel() == n, "bias must be [N]");
  return bias->data_ptr<float>();
}

void run_int8_acts(const Kernels& kern, const Matrix& w, const at::Tensor& x, const float* bias,
                   float* y) {
  const int64_t rows = x.size(0), xs = x.stride(0), sb = w.supers;
  // one scratch allocation, 4-byte words: q (64 per super-block), dx, bsum (16)
  auto scratch = at::empty({rows * sb * (64 + 1 + kSub16)}, x.options());
  float* base = scratch.data_ptr<float>();
  int8_t* qp = reinterpret_cast<int8_t*>(base);
  float* dxp = base + rows * sb * 64;
  int32_t* bsp = reinterpret_cast<int32_t*>(dxp + rows * sb);
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t b, int64_t e) {
    quantize_rows(xp + b * xs, xs, e - b, sb, qp + b * sb * kSuper, dxp + b * sb,
                  bsp + b * sb * kSub16);
  });
  for (int64_t r0 = 0; r0 < rows; r0 += kRowChunk) {
    const int64_t chunk = std::min(kRowChunk, rows - r0);
    const Acts a{qp + r0 * sb * kSuper, dxp + r0 * sb, bsp + r0 * sb * kSub16, sb};
    at::parallel_for(0, w.groups / 2, 1, [&](int64_t p0, int64_t p1) {
      kern.gemm_i8(w, a, chunk, 2 * p0, 2 * p1, y + r0 * w.n, w.n, bias);
    });
  }
}

void run_fp32_panels(const Matrix& w, const at::Tensor& x, const float* bias, float* y) {
  const int64_t rows = x.size(0), xs = x.stride(0), tiles = w.groups / 2, cols = 2 * kGroup;
  std::vector<float> bias_pad(tiles * cols, 0.f);
  if (bias) std::copy_n(bias, w.n, bias_pad.begin());
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> panel(w.k * cols), tail;
    for (int64_t t = t0; t < t1; ++t) {
      dequant_group(w, 2 * t, panel.data(), cols);
      dequant_group(w, 2 * t + 1, panel.data() + kGroup, cols);
      const int64_t c0 = t * cols, width = std::min(cols, w.n - c0);
      const float* b = bias ? bias_pad.data() + c0 : nullptr;
      if (width == cols) {
        packed_tile(rows, xp, xs, panel.data(), cols, w.k, y + c0, w.n, b);
        continue;
      }
      tail.resize(rows * cols);
      packed_tile(rows, xp, xs, panel.data(), cols, w.k, tail.data(), cols, b);
      for (int64_t r = 0; r < rows; ++r) std::copy_n(tail.data() + r * cols, width, y + r * w.n + c0);
    }
  });
}

}  // namespace

std::string kquant_isa(const std::string& isa) { return select(isa).name; }

// x [M, K] -> (q int8 [M, K], dx [M, K / 256], bsum int32 [M, K / 16]): the int8 activations.
std::tuple<at::Tensor, at::Tensor, at::Tensor> kquant_activations(const at::Tensor& x) {
  check_f32(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % kSuper == 0, "x must be [M, K], K % 256 == 0");
  const int64_t rows = x.size(0), sb = x.size(1) / kSuper;
  auto q = at::empty({rows, sb * kSuper}, x.options().dtype(at::kChar));
  auto dx = at::empty({rows, sb}, x.options());
  auto bsum = at::empty({rows, sb * kSub16}, x.options().dtype(at::kInt));
  quantize_rows(x.data_ptr<float>(), x.stride(0), rows, sb, q.data_ptr<int8_t>(),
                dx.data_ptr<float>(), bsum.data_ptr<int32_t>());
  return {q, dx, bsum};
}

// y [M, N] = x [M, K] @ W^T (+ bias) for a K-quant W (kquant.h's layout).
at::Tensor kquant_linear(const at::Tensor& x, const at::Tensor& blob, const at::Tensor& d,
                         int64_t format, int64_t n, int64_t k,
                         const std::optional<at::Tensor>& bias, bool int8_acts,
                         const std::string& isa) {
  const Kernels& kern = select(isa);
  const Matrix w = make_matrix(blob, d, format, n, k);
  check_f32(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == k, "x must be [M, ", k, "]");
  const float* b = checked_bias(bias, n);
  auto y = at::empty({x.size(0), n}, x.options());
  if (x.size(0) == 0) return y;
  if (int8_acts) {
    run_int8_acts(kern, w, x, b, y.data_ptr<float>());
  } else {
    run_fp32_panels(w, x, b, y.data_ptr<float>());
  }
  return y;
}

// Rows `ids` [T] of the dequantised weight -> [T, K] (a tied embedding's lookup).
at::Tensor kquant_rows(const at::Tensor& ids, const at::Tensor& blob, const at::Tensor& d,
                       int64_t format, int64_t n, int64_t k) {
  const Matrix w = make_matrix(blob, d, format, n, k);
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1 && ids.is_contiguous(),
              "ids must be a contiguous int64 vector");
  const int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t t = 0; t < ids.numel(); ++t) TORCH_CHECK(ip[t] >= 0 && ip[t] < n, "id out of range");
  auto out = at::empty({ids.numel(), k}, d.options());
  float* op = out.data_ptr<float>();
  at::parallel_for(0, ids.numel(), 8, [&](int64_t b, int64_t e) {
    std::vector<float> panel(k * kGroup);
    for (int64_t t = b; t < e; ++t) {
      dequant_group(w, ip[t] / kGroup, panel.data(), kGroup);
      const int64_t c = ip[t] % kGroup;
      for (int64_t i = 0; i < k; ++i) op[t * k + i] = panel[i * kGroup + c];
    }
  });
  return out;
}

}  // namespace kquant

void register_kquant(pybind11::module& m) {
  namespace py = pybind11;
  m.def("kquant_isa", &kquant::kquant_isa, "the K-quant table a quant isa name selects",
        py::arg("isa") = "auto");
  m.def("kquant_activations", &kquant::kquant_activations,
        "x [M, K] -> int8 per 256-wide block (q, dx, bsum per 16)", py::arg("x"));
  m.def("kquant_linear", &kquant::kquant_linear, "x @ W^T for a K-quant W (fp32 out)",
        py::arg("x"), py::arg("blob"), py::arg("d"), py::arg("format"), py::arg("n"),
        py::arg("k"), py::arg("bias") = py::none(), py::arg("int8_acts") = true,
        py::arg("isa") = "auto");
  m.def("kquant_rows", &kquant::kquant_rows, "rows of a K-quant W, dequantised", py::arg("ids"),
        py::arg("blob"), py::arg("d"), py::arg("format"), py::arg("n"), py::arg("k"));
}

}  // namespace pytgi
