// Schema and Meta implementation of primus_turbo_cpp::quant_dual_fp8 (every build); the CUDA
// implementation is in quant_dual_gpu.cpp (CUDA builds only; ROCm keeps the Triton kernels).
#include <torch/library.h>

#include "quant_dual_op.h"

namespace primus_turbo::pytorch {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quant_dual_fp8_meta(
    const at::Tensor& x, at::ScalarType dtype, double fmax, int64_t variant) {
  check_quant_dual(x, dtype, variant);
  return alloc_quant_dual(x, dtype);
}

}  // namespace
}  // namespace primus_turbo::pytorch

TORCH_LIBRARY_FRAGMENT(primus_turbo_cpp, m) {
  m.def(
      "quant_dual_fp8(Tensor x, ScalarType dtype, float fmax, int variant=0) -> "
      "(Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(primus_turbo_cpp, Meta, m) {
  m.impl("quant_dual_fp8", &primus_turbo::pytorch::quant_dual_fp8_meta);
}
