// CUDA registration of primus_turbo_cpp::quant_tw_hold_fp8 / quant_tw_hold_dual_fp8 (one-launch
// tensorwise FP8, plain / with the transposed copy) and quant_tw_hold_blocks (their co-resident
// grids): allocate with torch's caching allocator (outputs and the per-block partial maxima),
// launch the kernels library's cooperative kernels on torch's current stream. Not registered in
// ROCm builds (AMD keeps the Triton kernels).
#if !defined(USE_ROCM)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "primus_turbo/common.h"
#include "primus_turbo/quant_tw_hold.h"
#include "quant_tw_hold_op.h"

namespace primus_turbo::pytorch {
namespace {

int blocks_of(at::ScalarType dtype, int64_t variant) {
  int blocks = 0;
  const bool e5m2 = dtype == at::kFloat8_e5m2;
  const int v = static_cast<int>(variant);
  const Status status = v >= kQuantTwHoldDualVariant
                            ? quant_tw_hold_dual_blocks(v - kQuantTwHoldDualVariant, e5m2, &blocks)
                            : quant_tw_hold_blocks(v, e5m2, &blocks);
  TORCH_CHECK(status == kOk, "primus_turbo_cpp.quant_tw_hold_blocks: ", status_string(status),
              " (status ", status, ")");
  return blocks;
}

int64_t quant_tw_hold_blocks_gpu_impl(const at::Tensor& x, at::ScalarType dtype,
                                      int64_t variant) {
  check_quant_tw_hold_blocks_variant(variant);
  check_quant_tw_hold_dtype(dtype);
  const c10::cuda::CUDAGuard guard(x.device());
  return blocks_of(dtype, variant);
}

std::tuple<at::Tensor, at::Tensor> quant_tw_hold_fp8_gpu_impl(const at::Tensor& x,
                                                              at::ScalarType dtype, double fmax,
                                                              int64_t variant, int64_t flags) {
  check_quant_tw_hold(x, dtype, variant, flags);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0,
              "primus_turbo_cpp.quant_tw_hold_fp8: argument 'x' expected 16-byte alignment");
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = alloc_quant_tw_hold(x, dtype);
  auto& [q, s] = out;
  const int64_t numel = x.numel();
  if (numel == 0) {  // as the Triton launcher: 1 / (fmax / 1e-12) in double
    s.fill_(1.0 / (fmax / 1e-12));
    return out;
  }
  const int blocks = blocks_of(dtype, variant);
  TORCH_CHECK(blocks > 0,
              "primus_turbo_cpp.quant_tw_hold_fp8: the kernel cannot be made co-resident on this "
              "device (needs sm_90+ with cooperative launch)");
  TORCH_CHECK(numel / 8 / blocks < (int64_t{1} << 31) - 4096,
              "primus_turbo_cpp.quant_tw_hold_fp8: argument 'x' expected fewer than 2**31 16-byte "
              "vectors per block, got ", numel, " elements over ", blocks, " blocks");
  at::Tensor parts = at::empty({blocks}, x.options().dtype(at::kInt));
  const Status status = quant_tw_hold_fp8_gpu(
      x.data_ptr(), q.data_ptr(), s.data_ptr(), parts.data_ptr(), numel,
      dtype == at::kFloat8_e5m2, static_cast<float>(fmax), static_cast<int>(variant),
      static_cast<int>(flags), blocks, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(status == kOk, "primus_turbo_cpp.quant_tw_hold_fp8: GPU launch failed: ",
              status_string(status), " (status ", status, ")");
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quant_tw_hold_dual_fp8_gpu_impl(
    const at::Tensor& x, at::ScalarType dtype, double fmax, int64_t variant, int64_t flags) {
  auto [m, n] = check_quant_tw_hold_dual(x, dtype, variant, flags);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0,
              "primus_turbo_cpp.quant_tw_hold_dual_fp8: argument 'x' expected 16-byte alignment");
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = alloc_quant_tw_hold_dual(x, dtype);
  auto& [q, s, qt] = out;
  if (m == 0 || n == 0) {  // as the Triton launcher: 1 / (fmax / 1e-12) in double
    s.fill_(1.0 / (fmax / 1e-12));
    return out;
  }
  const int blocks = blocks_of(dtype, kQuantTwHoldDualVariant + variant);
  TORCH_CHECK(blocks > 0,
              "primus_turbo_cpp.quant_tw_hold_dual_fp8: the kernel cannot be made co-resident on "
              "this device (needs sm_90+ with cooperative launch)");
  TORCH_CHECK((m / 64) * (n / 64) / blocks < (int64_t{1} << 31) - 1,
              "primus_turbo_cpp.quant_tw_hold_dual_fp8: argument 'x' expected fewer than 2**31 "
              "tiles per block, got ", x.sizes());
  at::Tensor parts = at::empty({blocks}, x.options().dtype(at::kInt));
  const Status status = quant_tw_hold_dual_fp8_gpu(
      x.data_ptr(), q.data_ptr(), qt.data_ptr(), s.data_ptr(), parts.data_ptr(), m, n,
      dtype == at::kFloat8_e5m2, static_cast<float>(fmax), static_cast<int>(variant),
      static_cast<int>(flags), blocks, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(status == kOk, "primus_turbo_cpp.quant_tw_hold_dual_fp8: GPU launch failed: ",
              status_string(status), " (status ", status, ")");
  return out;
}

}  // namespace
}  // namespace primus_turbo::pytorch

TORCH_LIBRARY_IMPL(primus_turbo_cpp, CUDA, m) {
  m.impl("quant_tw_hold_fp8", &primus_turbo::pytorch::quant_tw_hold_fp8_gpu_impl);
  m.impl("quant_tw_hold_dual_fp8", &primus_turbo::pytorch::quant_tw_hold_dual_fp8_gpu_impl);
  m.impl("quant_tw_hold_blocks", &primus_turbo::pytorch::quant_tw_hold_blocks_gpu_impl);
}
#endif  // !USE_ROCM
