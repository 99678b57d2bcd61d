// Torch glue shared by the GPU and Meta registrations of primus_turbo_cpp::quant_dual_mx_fp8 (the
// CUDA MXFP8 cast-transpose of primus_turbo/quant_dual_mx.h): argument checks and the output
// tensors, in the layouts of the Triton launcher (quant_launch.quant_mx with dual=True).
#pragma once

#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

namespace primus_turbo::pytorch {

// x: contiguous bf16 [M, N], M % 32 == 0, N % 32 == 0; dtype: fp8 e4m3fn or e5m2. Returns (M, N).
inline std::pair<int64_t, int64_t> check_quant_dual_mx(
    const at::Tensor& x, at::ScalarType dtype,
    const char* op = "primus_turbo_cpp.quant_dual_mx_fp8") {
  TORCH_CHECK(x.dim() == 2, op, ": argument 'x' expected a 2-D tensor, got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, op, ": argument 'x' expected dtype bfloat16, got ",
              x.scalar_type());
  TORCH_CHECK(x.is_contiguous(), op, ": argument 'x' expected contiguous");
  TORCH_CHECK(dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2, op,
              ": argument 'dtype' expected float8_e4m3fn or float8_e5m2, got ", dtype);
  const int64_t m = x.size(0), n = x.size(1);
  TORCH_CHECK(m % 32 == 0 && n % 32 == 0, op,
              ": argument 'x' expected both dims multiples of 32, got ", x.sizes());
  return {m, n};
}

// (q [M, N], s [M, N/32] uint8, qt [N, M], st [N, M/32] uint8): q and qt contiguous, s and st
// outer-dim-major (strides (1, M) / (1, N)).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> alloc_quant_dual_mx(
    const at::Tensor& x, at::ScalarType dtype) {
  const int64_t m = x.size(0), n = x.size(1);
  const auto opts = x.options();
  const auto bytes = opts.dtype(at::kByte);
  return {at::empty({m, n}, opts.dtype(dtype)), at::empty({n / 32, m}, bytes).t(),
          at::empty({n, m}, opts.dtype(dtype)), at::empty({m / 32, n}, bytes).t()};
}

}  // namespace primus_turbo::pytorch
