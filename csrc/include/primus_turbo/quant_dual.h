// Dual-output FP8 quantization ("cast-transpose") of a bf16 matrix in 1 x 128 blocks
// (framework-free API of libprimus_turbo_kernels.so; NVIDIA sm_89+ only, the ROCm build returns
// kBadArgument and AMD keeps the Triton kernels).
//
// x: contiguous bf16 [M, N] (N % 8 == 0, 16-byte aligned). Outputs, fp8 (e4m3fn or e5m2):
//   q  [M, N] contiguous, quantized along rows;  qt [N, M] contiguous = x.T quantized along M.
// Recipe (bitwise the Triton kernels of primus_turbo/triton/quantization on NVIDIA): amax = max
// |x| over the finite values of a 1 x 128 block (inf/NaN left out), scale = fmax / max(amax,
// 1e-12) (div.full.f32, as Triton), q = satfinite(x * scale) (NaN stays NaN), scale_inv = 1 /
// scale (div.full.f32) in fp32: s [M, ceil(N/128)] with strides (1, M) (outer-dim major),
// st [N, ceil(M/128)] strides (1, N).
#pragma once

#include <cstdint>

#include "primus_turbo/common.h"

namespace primus_turbo {

// True in builds whose GPU kernels include the dual quantization (CUDA builds).
bool quant_dual_gpu_available() noexcept;

// `stream`: a cudaStream_t; s/st: float*. Runs on the current device. `variant`: 0 = persistent
// blocks with a cp.async double buffer (`p`, any size), 1 = one tile per block (`t`, the Python
// default; M, N <= 0x7fffff00, else kBadArgument); any other value returns kBadArgument. Both give
// the same bits.
Status quant_dual_fp8_gpu(const void* x, void* q, void* s, void* qt, void* st, int64_t m,
                          int64_t n, bool e5m2, float fmax, int variant, void* stream) noexcept;

}  // namespace primus_turbo
