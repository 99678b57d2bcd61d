// Delayed-scaling tensorwise FP8 cast of a bf16 matrix on NVIDIA (framework-free API of
// libprimus_turbo_kernels.so; sm_89+ only, the ROCm build returns kBadArgument and AMD keeps the
// Triton kernel).
//
// x: contiguous bf16 [M, N], 16-byte aligned (dual: N % 8 == 0; plain: M * N % 8 == 0).
// Recipe (bitwise primus_turbo/triton/quantization/quant_tensorwise.py's tw_delayed_kernel on
// NVIDIA): with the GIVEN multiplier scale = scale[0] (fp32, device), q = satfinite(x * scale)
// (NaN stays NaN) [M, N] contiguous, with `dual` also qt = q of x.T [N, M] contiguous;
// sinv[0] = 1 / scale (IEEE division, div.rn); amax[0] (fp32 bits, read as int32) becomes
// max(amax[0], amax(x)) by integer atomicMax on the bits, amax(x) the largest finite |x| (inf
// and NaN left out; 0 for an all-zero input). `store` false: only the amax (q, qt, sinv unused).
#pragma once

#include <cstdint>

#include "primus_turbo/common.h"

namespace primus_turbo {

// `stream`: a cudaStream_t; runs on the current device. `variant`: 1 (the only one; plain fp8
// stores, streaming .cs stores were measured and removed). Dual: M, N <= 0x7fffff00 (32-bit rows
// and columns), else kBadArgument; any other bad argument returns kBadArgument too.
Status quant_tw_delayed_fp8_gpu(const void* x, void* q, void* qt, const float* scale, float* sinv,
                                float* amax, int64_t m, int64_t n, bool dual, bool store,
                                bool e5m2, int variant, void* stream) noexcept;

}  // namespace primus_turbo
