// Torch glue shared by the GPU and Meta registrations of primus_turbo_cpp::quant_tw_delayed_fp8
// (the CUDA delayed-scaling tensorwise cast of primus_turbo/quant_tw_delayed.h): argument checks.
// The outputs are the caller's (the Triton launcher allocates them: q [M, N], qt [N, M], sinv
// fp32 1 element); `amax` (fp32, 1 element) is updated in place.
#pragma once

#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

namespace primus_turbo::pytorch {

#define PT_TWD_CHECK(cond, ...) \
  TORCH_CHECK(cond, "primus_turbo_cpp.quant_tw_delayed_fp8: ", __VA_ARGS__)

inline void check_twd_scalar(const at::Tensor& t, const at::Tensor& x, const char* name) {
  PT_TWD_CHECK(t.scalar_type() == at::kFloat && t.numel() == 1, "argument '", name,
               "' expected a 1-element float32 tensor, got ", t.scalar_type(), " ", t.sizes());
  PT_TWD_CHECK(t.device() == x.device(), "argument '", name, "' expected device ", x.device(),
               ", got ", t.device());
}

inline void check_twd_out(const at::Tensor& t, const at::Tensor& x, int64_t rows, int64_t cols,
                          at::ScalarType dtype, const char* name) {
  PT_TWD_CHECK(t.scalar_type() == dtype, "argument '", name, "' expected dtype ", dtype,
               ", got ", t.scalar_type());
  PT_TWD_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols && t.is_contiguous(),
               "argument '", name, "' expected a contiguous [", rows, ", ", cols, "] tensor, got ",
               t.sizes());
  PT_TWD_CHECK(t.device() == x.device(), "argument '", name, "' expected device ", x.device(),
               ", got ", t.device());
}

// x: contiguous bf16 [M, N]; dual: N % 8 == 0, else M * N % 8 == 0; q (store: defined) fp8
// e4m3fn / e5m2 [M, N]; qt (dual and store) [N, M] of q's dtype; sinv (store) fp32 1 element;
// variant 1 (the only one). Returns (M, N, store).
inline std::pair<std::pair<int64_t, int64_t>, bool> check_quant_tw_delayed(
    const at::Tensor& x, const at::Tensor& scale, const at::Tensor& amax,
    const c10::optional<at::Tensor>& q, const c10::optional<at::Tensor>& qt,
    const c10::optional<at::Tensor>& sinv, bool dual, int64_t variant) {
  PT_TWD_CHECK(variant == 1, "argument 'variant' expected 1, got ", variant);
  PT_TWD_CHECK(x.dim() == 2, "argument 'x' expected a 2-D tensor, got ", x.sizes());
  PT_TWD_CHECK(x.scalar_type() == at::kBFloat16, "argument 'x' expected dtype bfloat16, got ",
               x.scalar_type());
  PT_TWD_CHECK(x.is_contiguous(), "argument 'x' expected contiguous");
  const int64_t m = x.size(0), n = x.size(1);
  if (dual) {
    PT_TWD_CHECK(n % 8 == 0, "argument 'x' expected a column count that is a multiple of 8 "
                 "(dual), got ", n);
  } else {
    PT_TWD_CHECK((m * n) % 8 == 0, "argument 'x' expected a size that is a multiple of 8, got ",
                 m * n);
  }
  check_twd_scalar(scale, x, "scale");
  check_twd_scalar(amax, x, "amax");
  const bool store = q.has_value() && q->defined();
  if (store) {
    const at::ScalarType dt = q->scalar_type();
    PT_TWD_CHECK(dt == at::kFloat8_e4m3fn || dt == at::kFloat8_e5m2,
                 "argument 'q' expected dtype float8_e4m3fn or float8_e5m2, got ", dt);
    check_twd_out(*q, x, m, n, dt, "q");
    if (dual) {
      PT_TWD_CHECK(qt.has_value() && qt->defined(), "argument 'qt' expected a tensor (dual)");
      check_twd_out(*qt, x, n, m, dt, "qt");
    }
    PT_TWD_CHECK(sinv.has_value() && sinv->defined(), "argument 'sinv' expected a tensor");
    check_twd_scalar(*sinv, x, "sinv");
  }
  return {{m, n}, store};
}

}  // namespace primus_turbo::pytorch
