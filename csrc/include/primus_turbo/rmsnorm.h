// RMSNorm kernels (framework-free API of libprimus_turbo_kernels.so).
//
//   rstd[r] = 1 / sqrt(mean_h(x[r, h]^2) + eps)
//   y[r, h] = x[r, h] * rstd[r] * w[h]
//   dx[r, h] = rstd[r] * (w[h] dy[r, h] - xhat[r, h] * mean_h(xhat[r, :] * w * dy[r, :]))
//   dw[h]    = sum_r dy[r, h] * xhat[r, h],          xhat = x * rstd
//
// x, y, dy, dx: contiguous [rows, hidden] of `dtype`; w, dw: [hidden] of `dtype`; rstd: fp32
// [rows]. All accumulation is fp32. dw is reduced deterministically: fixed row blocks write fp32
// partial sums, then a fixed-order sum over the blocks (same inputs, same device -> same bits).
#pragma once

#include <cstdint>

#include "primus_turbo/common.h"

namespace primus_turbo {

// Every entry point is noexcept and returns a Status (common.h); the caller has validated the
// arguments (shapes, dtypes, contiguity, devices) before the call.
Status rmsnorm_fwd_cpu(const void* x, const void* w, void* y, float* rstd, int64_t rows,
                       int64_t hidden, float eps, DType dtype) noexcept;

// `dw_partial` is caller-provided fp32 scratch of rmsnorm_bwd_cpu_partials(rows) * hidden floats.
int64_t rmsnorm_bwd_cpu_partials(int64_t rows) noexcept;
Status rmsnorm_bwd_cpu(const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                       void* dw, float* dw_partial, int64_t rows, int64_t hidden,
                       DType dtype) noexcept;

// GPU entry points (only in builds with a GPU toolchain). `stream` is a cudaStream_t/hipStream_t;
// they run on the current device.
Status rmsnorm_fwd_gpu(const void* x, const void* w, void* y, float* rstd, int64_t rows,
                       int64_t hidden, float eps, DType dtype, void* stream) noexcept;
// Number of fp32 partial rows the backward needs as scratch (`dw_partial`: that many x hidden),
// written to *nparts.
Status rmsnorm_bwd_gpu_partials(int64_t rows, int64_t hidden, DType dtype,
                                int64_t* nparts) noexcept;
Status rmsnorm_bwd_gpu(const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                       void* dw, float* dw_partial, int64_t rows, int64_t hidden, DType dtype,
                       void* stream) noexcept;
// Re-reads the PRIMUS_TURBO_RMSNORM_CPP_*PLAN environment variables at the next call (they are
// cached otherwise), so a benchmark can compare launch plans in one process.
void rmsnorm_gpu_reload_plans() noexcept;

}  // namespace primus_turbo
