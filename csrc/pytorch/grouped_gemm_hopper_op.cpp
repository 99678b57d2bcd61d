// Schema and Meta implementation of primus_turbo_cpp::grouped_gemm_bf16_nt_hopper (every build);
// the CUDA implementation is in grouped_gemm_hopper_gpu.cpp (CUDA builds with sm_90a only).
#include <torch/library.h>

#include "grouped_gemm_hopper_op.h"

namespace primus_turbo::pytorch {
namespace {

void grouped_gemm_hopper_meta(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs,
                              const at::Tensor& out, int64_t cluster, int64_t variant) {
  check_grouped_gemm_hopper(a, b, offs, out, cluster, variant);
}

}  // namespace
}  // namespace primus_turbo::pytorch

TORCH_LIBRARY_FRAGMENT(primus_turbo_cpp, m) {
  m.def(
      "grouped_gemm_bf16_nt_hopper(Tensor a, Tensor b, Tensor offs, Tensor(a!) out, "
      "int cluster=2, int variant=0) -> ()");
}

TORCH_LIBRARY_IMPL(primus_turbo_cpp, Meta, m) {
  m.impl("grouped_gemm_bf16_nt_hopper", &primus_turbo::pytorch::grouped_gemm_hopper_meta);
}
