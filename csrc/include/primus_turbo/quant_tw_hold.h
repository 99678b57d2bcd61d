// Dynamic tensorwise FP8 quantization of a bf16 tensor in ONE cooperative launch that holds most
// of the input on chip across a grid barrier ("hold" kernel; framework-free API of
// libprimus_turbo_kernels.so; NVIDIA sm_90+ only: the bulk copies; other archs and the ROCm
// build return kBadArgument and keep the Triton kernels).
//
// x: contiguous bf16, `numel` elements, 16-byte aligned. Outputs: q (fp8 e4m3fn or e5m2, numel
// bytes, same layout) and s (one fp32, scale_inv). Recipe (bitwise the Triton tensorwise kernels
// of primus_turbo/triton/quantization/quant_tensorwise.py on NVIDIA): amax = max |x| over the
// finite values (inf/NaN left out), scale = fmax / max(amax, 1e-12) (div.full.f32, as Triton),
// q = satfinite(x * scale) (NaN stays NaN), s = 1 / scale (div.full.f32).
#pragma once

#include <cstdint>

#include "primus_turbo/common.h"

namespace primus_turbo {

// Kernel variants (`variant`; threads x 16-byte vectors held in registers per thread x remainder
// vectors in flight per thread and loop step): 0 = 512 x 16 x 8 (128 registers), 1 = 1024 x 8 x 1
// and 2 = 1024 x 7 x 2 (64 registers); all with 224 KB of shared memory per block, one block per
// SM (sm_90: 224 + 112-128 KB of x held per SM).
constexpr int kQuantTwHoldVariants = 3;
// The dual kernels' first id in the torch op quant_tw_hold_blocks (id - kQuantTwHoldDualVariant is
// quant_tw_hold_dual_blocks's variant).
constexpr int kQuantTwHoldDualVariant = kQuantTwHoldVariants;

// Flags (`flags`, bits): 1 = L2 evict_last on the streamed remainder's amax loads and
// evict_first on its re-read (else default priority), 2 = streaming (.cs) stores of q.
constexpr int kQuantTwHoldEvict = 1;
constexpr int kQuantTwHoldStreamStores = 2;

// The co-resident block count of `variant` (fp8 e5m2 or e4m3fn output) on the current device (the
// cooperative grid): blocks-per-SM x SMs, 0 when the kernel cannot be made resident or the
// device is not sm_90+ (cached per device; sets the kernel's shared-memory opt-in).
Status quant_tw_hold_blocks(int variant, bool e5m2, int* blocks) noexcept;

// `parts`: uint32 workspace of `blocks` words (1 <= `blocks` <= quant_tw_hold_blocks's count: the
// grid);
// `stream`: a cudaStream_t. numel >= 1. Runs on the current device.
Status quant_tw_hold_fp8_gpu(const void* x, void* q, void* s, void* parts, int64_t numel,
                             bool e5m2, float fmax, int variant, int flags, int blocks,
                             void* stream) noexcept;

// Dual: q [M, N] and qt [N, M] (= x.T quantized) with the one scale s; x contiguous bf16 [M, N],
// M and N multiples of 64 (>= 64), 16-byte aligned; 512 threads per block, 64 x 64 tiles, 26 in
// shared memory per block and (`variant`) 0: 16 in registers, 4 streamed tiles in flight; 1: 12
// and 8. `blocks`: 1 .. quant_tw_hold_dual_blocks's count.
constexpr int kQuantTwHoldDualVariants = 2;
Status quant_tw_hold_dual_blocks(int variant, bool e5m2, int* blocks) noexcept;
Status quant_tw_hold_dual_fp8_gpu(const void* x, void* q, void* qt, void* s, void* parts,
                                  int64_t m, int64_t n, bool e5m2, float fmax, int variant,
                                  int flags, int blocks, void* stream) noexcept;

}  // namespace primus_turbo
