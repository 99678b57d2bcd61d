// Schema and Meta implementation of primus_turbo_cpp::quant_tw_delayed_fp8 (every build); the
// CUDA implementation is in quant_tw_delayed_gpu.cpp (CUDA builds only; ROCm keeps Triton).
#include <torch/library.h>

#include "quant_tw_delayed_op.h"

namespace primus_turbo::pytorch {
namespace {

void quant_tw_delayed_fp8_meta(const at::Tensor& x, const at::Tensor& scale,
                               const at::Tensor& amax, const c10::optional<at::Tensor>& q,
                               const c10::optional<at::Tensor>& qt,
                               const c10::optional<at::Tensor>& sinv, bool dual,
                               int64_t variant) {
  check_quant_tw_delayed(x, scale, amax, q, qt, sinv, dual, variant);
}

}  // namespace
}  // namespace primus_turbo::pytorch

TORCH_LIBRARY_FRAGMENT(primus_turbo_cpp, m) {
  m.def(
      "quant_tw_delayed_fp8(Tensor x, Tensor scale, Tensor(a!) amax, Tensor(b!)? q, "
      "Tensor(c!)? qt, Tensor(d!)? sinv, bool dual, int variant=1) -> ()");
}

TORCH_LIBRARY_IMPL(primus_turbo_cpp, Meta, m) {
  m.impl("quant_tw_delayed_fp8", &primus_turbo::pytorch::quant_tw_delayed_fp8_meta);
}
