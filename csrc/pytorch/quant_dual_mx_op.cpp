// Schema and Meta implementation of primus_turbo_cpp::quant_dual_mx_fp8 (every
// build); the CUDA implementation is in quant_dual_mx_gpu.cpp (CUDA builds only; ROCm
// keeps the Triton kernels).
#include <torch/library.h>

#include "quant_dual_mx_op.h"

namespace primus_turbo::pytorch {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quant_dual_mx_fp8_meta(
    const at::Tensor& x, at::ScalarType dtype) {
  check_quant_dual_mx(x, dtype);
  return alloc_quant_dual_mx(x, dtype);
}

}  // namespace
}  // namespace primus_turbo::pytorch

TORCH_LIBRARY_FRAGMENT(primus_turbo_cpp, m) {
  m.def(
      "quant_dual_mx_fp8(Tensor x, ScalarType dtype) -> "
      "(Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(primus_turbo_cpp, Meta, m) {
  m.impl("quant_dual_mx_fp8", &primus_turbo::pytorch::quant_dual_mx_fp8_meta);
}
