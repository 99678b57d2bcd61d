// CUDA registration of primus_turbo_cpp::quant_tw_delayed_fp8 (delayed tensorwise cast): launch
// the kernels library's cast on torch's current stream into the caller's tensors (no
// allocation, no host sync: CUDA-graph safe). Not registered in ROCm builds.
#if !defined(USE_ROCM)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "primus_turbo/common.h"
#include "primus_turbo/quant_tw_delayed.h"
#include "quant_tw_delayed_op.h"

namespace primus_turbo::pytorch {
namespace {

void quant_tw_delayed_fp8_gpu_impl(const at::Tensor& x, const at::Tensor& scale,
                                   const at::Tensor& amax, const c10::optional<at::Tensor>& q,
                                   const c10::optional<at::Tensor>& qt,
                                   const c10::optional<at::Tensor>& sinv, bool dual,
                                   int64_t variant) {
  const auto [mn, store] = check_quant_tw_delayed(x, scale, amax, q, qt, sinv, dual, variant);
  const auto [m, n] = mn;
  PT_TWD_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0,
               "argument 'x' expected a 16-byte aligned pointer");
  if (store) {
    PT_TWD_CHECK(reinterpret_cast<uintptr_t>(q->data_ptr()) % 8 == 0 &&
                     (!dual || reinterpret_cast<uintptr_t>(qt->data_ptr()) % 8 == 0),
                 "arguments 'q' / 'qt' expected 8-byte aligned pointers");
  }
  if (m == 0 || n == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const bool e5m2 = store && q->scalar_type() == at::kFloat8_e5m2;
  const Status status = quant_tw_delayed_fp8_gpu(
      x.data_ptr(), store ? q->data_ptr() : nullptr,
      store && dual ? qt->data_ptr() : nullptr, scale.data_ptr<float>(),
      store ? sinv->data_ptr<float>() : nullptr, amax.data_ptr<float>(), m, n, dual, store, e5m2,
      static_cast<int>(variant), c10::cuda::getCurrentCUDAStream().stream());
  PT_TWD_CHECK(status == kOk, "GPU launch failed: ", status_string(status), " (status ", status,
               ")");
}

}  // namespace
}  // namespace primus_turbo::pytorch

TORCH_LIBRARY_IMPL(primus_turbo_cpp, CUDA, m) {
  m.impl("quant_tw_delayed_fp8", &primus_turbo::pytorch::quant_tw_delayed_fp8_gpu_impl);
}
#endif  // !USE_ROCM
