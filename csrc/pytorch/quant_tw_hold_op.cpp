// Schemas and Meta implementations of primus_turbo_cpp::quant_tw_hold_fp8,
// quant_tw_hold_dual_fp8 and quant_tw_hold_blocks (every build); the CUDA implementations are in
// quant_tw_hold_gpu.cpp (CUDA builds only; ROCm keeps the Triton kernels).
#include <torch/library.h>

#include "quant_tw_hold_op.h"

namespace primus_turbo::pytorch {
namespace {

std::tuple<at::Tensor, at::Tensor> quant_tw_hold_fp8_meta(const at::Tensor& x,
                                                          at::ScalarType dtype, double fmax,
                                                          int64_t variant, int64_t flags) {
  check_quant_tw_hold(x, dtype, variant, flags);
  return alloc_quant_tw_hold(x, dtype);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quant_tw_hold_dual_fp8_meta(
    const at::Tensor& x, at::ScalarType dtype, double fmax, int64_t variant, int64_t flags) {
  check_quant_tw_hold_dual(x, dtype, variant, flags);
  return alloc_quant_tw_hold_dual(x, dtype);
}

int64_t quant_tw_hold_blocks_meta(const at::Tensor&, at::ScalarType dtype, int64_t variant) {
  check_quant_tw_hold_blocks_variant(variant);
  check_quant_tw_hold_dtype(dtype);
  return 0;
}

}  // namespace
}  // namespace primus_turbo::pytorch

TORCH_LIBRARY_FRAGMENT(primus_turbo_cpp, m) {
  m.def(
      "quant_tw_hold_fp8(Tensor x, ScalarType dtype, float fmax, int variant=0, int flags=3) -> "
      "(Tensor, Tensor)");
  m.def(
      "quant_tw_hold_dual_fp8(Tensor x, ScalarType dtype, float fmax, int variant=0, int flags=3) "
      "-> "
      "(Tensor, Tensor, Tensor)");
  m.def("quant_tw_hold_blocks(Tensor x, ScalarType dtype, int variant=0) -> int");
}

TORCH_LIBRARY_IMPL(primus_turbo_cpp, Meta, m) {
  m.impl("quant_tw_hold_fp8", &primus_turbo::pytorch::quant_tw_hold_fp8_meta);
  m.impl("quant_tw_hold_dual_fp8", &primus_turbo::pytorch::quant_tw_hold_dual_fp8_meta);
  m.impl("quant_tw_hold_blocks", &primus_turbo::pytorch::quant_tw_hold_blocks_meta);
}
