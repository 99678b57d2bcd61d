// CUDA registration of primus_turbo_cpp::quant_dual_mx_fp8 (MXFP8 dual): allocate with torch's
// caching allocator, launch the kernels library's cast-transpose on torch's current stream. Not
// registered in ROCm builds (AMD keeps the Triton kernels).
#if !defined(USE_ROCM)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "primus_turbo/common.h"
#include "primus_turbo/quant_dual_mx.h"
#include "quant_dual_mx_op.h"

namespace primus_turbo::pytorch {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quant_dual_mx_fp8_gpu_impl(
    const at::Tensor& x, at::ScalarType dtype) {
  auto [m, n] = check_quant_dual_mx(x, dtype);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0,
              "primus_turbo_cpp.quant_dual_mx_fp8: argument 'x' expected 16-byte alignment");
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = alloc_quant_dual_mx(x, dtype);
  if (m == 0 || n == 0) return out;
  auto& [q, s, qt, st] = out;
  const Status status = quant_dual_mx_fp8_gpu(
      x.data_ptr(), q.data_ptr(), s.data_ptr(), qt.data_ptr(), st.data_ptr(), m, n,
      dtype == at::kFloat8_e5m2, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(status == kOk, "primus_turbo_cpp.quant_dual_mx_fp8: GPU launch failed: ",
              status_string(status), " (status ", status, ")");
  return out;
}

}  // namespace
}  // namespace primus_turbo::pytorch

TORCH_LIBRARY_IMPL(primus_turbo_cpp, CUDA, m) {
  m.impl("quant_dual_mx_fp8", &primus_turbo::pytorch::quant_dual_mx_fp8_gpu_impl);
}
#endif  // !USE_ROCM
