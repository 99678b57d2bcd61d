// CUDA registration of primus_turbo_cpp::grouped_gemm_bf16_nt_hopper: launch the kernels
// library's sm_90a grouped GEMM on torch's current stream into the caller's output (no
// allocation, no host sync: CUDA-graph safe). Registered only in CUDA builds whose arch list has
// 9.0a (PRIMUS_TURBO_SM90A), so "has a CUDA kernel" means "the kernel exists".
#if !defined(USE_ROCM) && defined(PRIMUS_TURBO_SM90A)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "grouped_gemm_hopper_op.h"
#include "primus_turbo/common.h"

namespace primus_turbo::pytorch {
namespace {

void grouped_gemm_hopper_gpu_impl(const at::Tensor& a, const at::Tensor& b,
                                  const at::Tensor& offs, const at::Tensor& out,
                                  int64_t cluster, int64_t variant) {
  check_grouped_gemm_hopper(a, b, offs, out, cluster, variant);
  for (const at::Tensor* t : {&a, &b, &out}) {
    PT_GGH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0,
                 "expected 16-byte aligned a, b and out");
  }
  if (a.size(0) == 0) return;
  const c10::cuda::CUDAGuard guard(a.device());
  const Status status = grouped_gemm_bf16_nt_hopper(
      a.data_ptr(), b.data_ptr(), out.data_ptr(), offs.data_ptr<int64_t>(), a.size(0),
      b.size(1), a.size(1), b.size(0), static_cast<int>(cluster), static_cast<int>(variant),
      c10::cuda::getCurrentCUDAStream().stream());
  PT_GGH_CHECK(status == kOk, "GPU launch failed: ", status_string(status), " (status ", status,
               ")");
}

}  // namespace
}  // namespace primus_turbo::pytorch

TORCH_LIBRARY_IMPL(primus_turbo_cpp, CUDA, m) {
  m.impl("grouped_gemm_bf16_nt_hopper", &primus_turbo::pytorch::grouped_gemm_hopper_gpu_impl);
}
#endif  // !USE_ROCM && PRIMUS_TURBO_SM90A
