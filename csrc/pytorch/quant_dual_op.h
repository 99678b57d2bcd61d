// Torch glue shared by the GPU and Meta registrations of primus_turbo_cpp::quant_dual_fp8 (the
// CUDA 1x128 cast-transpose of primus_turbo/quant_dual.h): argument checks and the output
// tensors, in the layouts of the Triton launcher (primus_turbo/triton/quantization/quant_launch.py).
#pragma once

#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

namespace primus_turbo::pytorch {

// x: contiguous bf16 [M, N], N % 8 == 0; dtype: fp8 e4m3fn or e5m2; variant: 0 (p, persistent:
// any size; the op's default) or 1 (t, one tile per block, 3 per SM: the Python default); t needs
// M, N <= 0x7fffff00 (the launch refuses larger). Returns (M, N).
inline std::pair<int64_t, int64_t> check_quant_dual(const at::Tensor& x, at::ScalarType dtype,
                                                    int64_t variant = 0) {
  TORCH_CHECK(variant == 0 || variant == 1,
              "primus_turbo_cpp.quant_dual_fp8: argument 'variant' expected 0 or 1, got ", variant);
  TORCH_CHECK(x.dim() == 2,
              "primus_turbo_cpp.quant_dual_fp8: argument 'x' expected a 2-D tensor, got ",
              x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kBFloat16,
              "primus_turbo_cpp.quant_dual_fp8: argument 'x' expected dtype bfloat16, got ",
              x.scalar_type());
  TORCH_CHECK(x.is_contiguous(),
              "primus_turbo_cpp.quant_dual_fp8: argument 'x' expected contiguous");
  TORCH_CHECK(dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2,
              "primus_turbo_cpp.quant_dual_fp8: argument 'dtype' expected float8_e4m3fn or "
              "float8_e5m2, got ", dtype);
  const int64_t m = x.size(0), n = x.size(1);
  TORCH_CHECK(n % 8 == 0, "primus_turbo_cpp.quant_dual_fp8: argument 'x' expected a column count "
              "that is a multiple of 8, got ", n);
  return {m, n};
}

// (q [M, N], s [M, ceil(N/128)] fp32 strides (1, M), qt [N, M], st [N, ceil(M/128)] fp32
// strides (1, N)).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> alloc_quant_dual(
    const at::Tensor& x, at::ScalarType dtype) {
  const int64_t m = x.size(0), n = x.size(1);
  const auto opts = x.options();
  at::Tensor q = at::empty({m, n}, opts.dtype(dtype));
  at::Tensor qt = at::empty({n, m}, opts.dtype(dtype));
  const int64_t nb = (n + 127) / 128, mb = (m + 127) / 128;
  at::Tensor s = at::empty({nb, m}, opts.dtype(at::kFloat)).t();
  at::Tensor st = at::empty({mb, n}, opts.dtype(at::kFloat)).t();
  return {q, s, qt, st};
}

}  // namespace primus_turbo::pytorch
