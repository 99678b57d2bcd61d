// Torch glue shared by the GPU and Meta registrations of primus_turbo_cpp::quant_tw_hold_fp8 (the
// CUDA one-launch tensorwise quantization of primus_turbo/quant_tw_hold.h): argument checks and
// the outputs, in the layouts of the Triton launcher (quant_tw_launch.quant_tensorwise_tw).
#pragma once

#include <tuple>
#include <utility>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "primus_turbo/quant_tw_hold.h"

namespace primus_turbo::pytorch {

inline void check_quant_tw_hold_variant(int64_t variant) {
  TORCH_CHECK(variant >= 0 && variant < kQuantTwHoldVariants,
              "primus_turbo_cpp.quant_tw_hold_fp8: argument 'variant' expected 0..",
              kQuantTwHoldVariants - 1, ", got ", variant);
}

// quant_tw_hold_blocks: the plain variants, then kQuantTwHoldDualVariant + the dual variants.
inline void check_quant_tw_hold_blocks_variant(int64_t variant) {
  TORCH_CHECK(variant >= 0 && variant < kQuantTwHoldDualVariant + kQuantTwHoldDualVariants,
              "primus_turbo_cpp.quant_tw_hold_blocks: argument 'variant' expected 0..",
              kQuantTwHoldDualVariant + kQuantTwHoldDualVariants - 1, ", got ", variant);
}

inline void check_quant_tw_hold_dtype(at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2,
              "primus_turbo_cpp.quant_tw_hold_fp8: argument 'dtype' expected float8_e4m3fn or "
              "float8_e5m2, got ", dtype);
}

// x: contiguous bf16 (any shape); dtype: fp8 e4m3fn or e5m2; variant: 0..kQuantTwHoldVariants-1;
// flags: 0..3 (kQuantTwHoldEvict | kQuantTwHoldStreamStores).
inline void check_quant_tw_hold(const at::Tensor& x, at::ScalarType dtype, int64_t variant,
                                int64_t flags) {
  check_quant_tw_hold_variant(variant);
  TORCH_CHECK(flags >= 0 && flags <= 3,
              "primus_turbo_cpp.quant_tw_hold_fp8: argument 'flags' expected 0..3, got ", flags);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16,
              "primus_turbo_cpp.quant_tw_hold_fp8: argument 'x' expected dtype bfloat16, got ",
              x.scalar_type());
  TORCH_CHECK(x.is_contiguous(),
              "primus_turbo_cpp.quant_tw_hold_fp8: argument 'x' expected contiguous");
  check_quant_tw_hold_dtype(dtype);
}

// (q: x's shape in `dtype`, s: a 0-d fp32 scale_inv).
inline std::tuple<at::Tensor, at::Tensor> alloc_quant_tw_hold(const at::Tensor& x,
                                                              at::ScalarType dtype) {
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(dtype));
  at::Tensor s = at::empty({}, x.options().dtype(at::kFloat));
  return {q, s};
}

// Dual: x contiguous bf16 [M, N], M and N multiples of 64; variant: 0..kQuantTwHoldDualVariants-1;
// returns (M, N).
inline std::pair<int64_t, int64_t> check_quant_tw_hold_dual(const at::Tensor& x,
                                                            at::ScalarType dtype, int64_t variant,
                                                            int64_t flags) {
  TORCH_CHECK(variant >= 0 && variant < kQuantTwHoldDualVariants,
              "primus_turbo_cpp.quant_tw_hold_dual_fp8: argument 'variant' expected 0..",
              kQuantTwHoldDualVariants - 1, ", got ", variant);
  check_quant_tw_hold(x, dtype, 0, flags);
  TORCH_CHECK(x.dim() == 2,
              "primus_turbo_cpp.quant_tw_hold_dual_fp8: argument 'x' expected a 2-D tensor, got ",
              x.sizes());
  const int64_t m = x.size(0), n = x.size(1);
  TORCH_CHECK(m % 64 == 0 && n % 64 == 0,
              "primus_turbo_cpp.quant_tw_hold_dual_fp8: argument 'x' expected both dims multiples "
              "of 64, got ", x.sizes());
  return {m, n};
}

// (q [M, N], s 0-d fp32, qt [N, M]).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> alloc_quant_tw_hold_dual(
    const at::Tensor& x, at::ScalarType dtype) {
  const int64_t m = x.size(0), n = x.size(1);
  at::Tensor q = at::empty({m, n}, x.options().dtype(dtype));
  at::Tensor s = at::empty({}, x.options().dtype(at::kFloat));
  at::Tensor qt = at::empty({n, m}, x.options().dtype(dtype));
  return {q, s, qt};
}

}  // namespace primus_turbo::pytorch
