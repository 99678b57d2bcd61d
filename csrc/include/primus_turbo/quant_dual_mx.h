// Dual-output MXFP8 quantization ("cast-transpose") of a bf16 matrix (framework-free API of
// libprimus_turbo_kernels.so; NVIDIA sm_89+ only, the ROCm build returns kBadArgument and AMD
// keeps the Triton kernels).
//
// x: contiguous bf16 [M, N], M % 32 == 0, N % 32 == 0, 16-byte aligned. Outputs, fp8 (e4m3fn or
// e5m2): q [M, N] contiguous, quantized in 1 x 32 blocks along rows; qt [N, M] contiguous = x.T
// quantized in 1 x 32 blocks along M. Scales: E8M0 bytes, s [M, N/32] and st [N, M/32], stored
// outer-dim-major: s as [N/32][M] and st as [M/32][N] (strides (1, M) / (1, N)). Recipe
// (bitwise the Triton word kernel, primus_turbo/triton/quantization/quant_words.py): e = the biased exponent of the block's largest finite |x| (inf/NaN left out,
// 0 for an all-zero / all-inf/NaN block), stored byte eb = max(e - EMAX, 0) (EMAX 8 for e4m3, 15
// for e5m2), q = satfinite(x * 2^(127 - eb)) (one fp32 product, NaN stays NaN).
#pragma once

#include <cstdint>

#include "primus_turbo/common.h"

namespace primus_turbo {

// True in builds whose GPU kernels include the MX dual quantization (CUDA builds).
bool quant_dual_mx_gpu_available() noexcept;

// `stream`: a cudaStream_t. Runs on the current device; returns kBadArgument for bad sizes.
Status quant_dual_mx_fp8_gpu(const void* x, void* q, void* s, void* qt, void* st, int64_t m,
                             int64_t n, bool e5m2, void* stream) noexcept;

}  // namespace primus_turbo
