// Torch glue shared by the CPU, GPU and Meta registrations of primus_turbo_cpp::rmsnorm_*.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "primus_turbo/common.h"

namespace primus_turbo::pytorch {

// Every argument error is raised here, in the torch glue, before the kernels library runs; the
// library itself never throws (it returns a Status, see check_status).
inline DType to_dtype(const at::Tensor& t, const char* arg) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default: break;
  }
  TORCH_CHECK(false, "primus_turbo_cpp.rmsnorm: argument '", arg,
              "' expected dtype float32/float16/bfloat16, got ", t.scalar_type());
  return DType::kFloat32;  // not reached (TORCH_CHECK(false) throws); keeps every path returning
}

// Raises when a kernels-library call failed (a GPU runtime error: launch, occupancy query).
inline void check_status(Status s, const char* what) {
  TORCH_CHECK(s == kOk, "primus_turbo_cpp.rmsnorm: ", what, " failed: ", status_string(s),
              " (status ", s, ")");
}

// x [rows, hidden] contiguous, w [hidden] of x's dtype; returns (rows, hidden).
inline std::pair<int64_t, int64_t> check_fwd(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2, "primus_turbo_cpp.rmsnorm: argument 'x' expected a 2-D tensor, got ",
              x.sizes());
  TORCH_CHECK(x.is_contiguous(), "primus_turbo_cpp.rmsnorm: argument 'x' expected contiguous");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(1) && w.is_contiguous(),
              "primus_turbo_cpp.rmsnorm: argument 'weight' expected contiguous [", x.size(1),
              "], got ", w.sizes());
  TORCH_CHECK(w.scalar_type() == x.scalar_type(),
              "primus_turbo_cpp.rmsnorm: argument 'weight' expected dtype ", x.scalar_type(),
              ", got ", w.scalar_type());
  TORCH_CHECK(w.device() == x.device(),
              "primus_turbo_cpp.rmsnorm: argument 'weight' expected device ", x.device(),
              ", got ", w.device());
  to_dtype(x, "x");
  return {x.size(0), x.size(1)};
}

inline void check_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                      const at::Tensor& rstd) {
  check_fwd(x, w);
  TORCH_CHECK(dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type() &&
                  dy.is_contiguous() && dy.device() == x.device(),
              "primus_turbo_cpp.rmsnorm: argument 'dy' expected a contiguous tensor like x ",
              x.sizes(), ", got ", dy.sizes(), " ", dy.scalar_type());
  TORCH_CHECK(rstd.dim() == 1 && rstd.size(0) == x.size(0) &&
                  rstd.scalar_type() == at::kFloat && rstd.is_contiguous() &&
                  rstd.device() == x.device(),
              "primus_turbo_cpp.rmsnorm: argument 'rstd' expected contiguous float32 [",
              x.size(0), "], got ", rstd.sizes(), " ", rstd.scalar_type());
}

}  // namespace primus_turbo::pytorch
