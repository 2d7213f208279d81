// The torch-facing entry points of the quantized kernels that other translation units share
// (quant_ops.cpp defines them): the one dispatch point that picks an ISA table, and the checked
// view of a packed weight's tensors as a quant::Matrix. decode_stack.cpp builds its quantized
// layers with them, so a fused decode step runs exactly the kernels quant_linear runs.
#pragma once

#include "quant.h"

#include <torch/extension.h>

#include <optional>
#include <string>

namespace pytgi {
namespace quant {

// "auto": the best table this build and CPU have (AVX-512 VNNI, else AVX2, else scalar);
// "avx512_vnni", "avx2" or "scalar" pick one (an unavailable one is an error).
const Kernels& select(const std::string& isa);

// The packed weight tensors (quant_layout.py's PackedQuantWeight.kernel_args()) as a Matrix,
// every shape and dtype checked. The Matrix points into the tensors: keep them alive.
Matrix make_matrix(const at::Tensor& codes, const at::Tensor& scales,
                   const std::optional<at::Tensor>& mins, const std::optional<at::Tensor>& table,
                   int64_t format, int64_t n, int64_t k, int64_t scale_block);

}  // namespace quant
}  // namespace pytgi
