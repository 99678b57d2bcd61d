// CUDA (HIP after hipify) registrations of primus_turbo_cpp::rmsnorm_*: allocate with torch's
// caching allocator, launch on torch's current stream, run the kernels library.
#if defined(USE_ROCM)
// hipify maps this header and at::cuda::getCurrentCUDAStream to their HIP (masquerading) forms.
#include <ATen/cuda/CUDAContext.h>
#define PT_CURRENT_STREAM() at::cuda::getCurrentCUDAStream().stream()
#else
// c10's stream header needs none of the cuBLAS/cuSPARSE headers that ATen/cuda/CUDAContext.h
// pulls in (a minimal CUDA toolkit may lack them).
#include <c10/cuda/CUDAStream.h>
#define PT_CURRENT_STREAM() c10::cuda::getCurrentCUDAStream().stream()
#endif
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "primus_turbo/rmsnorm.h"
#include "rmsnorm_op.h"

namespace primus_turbo::pytorch {
namespace {

std::tuple<at::Tensor, at::Tensor> rmsnorm_fwd_gpu_impl(const at::Tensor& x, const at::Tensor& w,
                                                        double eps) {
  auto [rows, hidden] = check_fwd(x, w);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  check_status(rmsnorm_fwd_gpu(x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr<float>(),
                               rows, hidden, static_cast<float>(eps), to_dtype(x, "x"),
                               PT_CURRENT_STREAM()),
               "GPU forward");
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor> rmsnorm_bwd_gpu_impl(const at::Tensor& dy, const at::Tensor& x,
                                                        const at::Tensor& w,
                                                        const at::Tensor& rstd) {
  check_bwd(dy, x, w, rstd);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), hidden = x.size(1);
  at::Tensor dx = at::empty_like(x);
  at::Tensor dw = at::empty_like(w);
  const DType dt = to_dtype(x, "x");
  int64_t nparts = 1;
  check_status(rmsnorm_bwd_gpu_partials(rows, hidden, dt, &nparts), "GPU backward plan");
  at::Tensor part = at::empty({nparts, hidden}, x.options().dtype(at::kFloat));
  check_status(rmsnorm_bwd_gpu(dy.data_ptr(), x.data_ptr(), w.data_ptr(), rstd.data_ptr<float>(),
                               dx.data_ptr(), dw.data_ptr(), part.data_ptr<float>(), rows, hidden,
                               dt, PT_CURRENT_STREAM()),
               "GPU backward");
  return {dx, dw};
}

}  // namespace
}  // namespace primus_turbo::pytorch

TORCH_LIBRARY_IMPL(primus_turbo_cpp, CUDA, m) {
  m.impl("rmsnorm_fwd", &primus_turbo::pytorch::rmsnorm_fwd_gpu_impl);
  m.impl("rmsnorm_bwd", &primus_turbo::pytorch::rmsnorm_bwd_gpu_impl);
}
