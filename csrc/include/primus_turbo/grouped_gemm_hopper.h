// Grouped GEMM, bf16, NT, on NVIDIA Hopper (sm_90a): framework-free API of
// libprimus_turbo_kernels.so (kernel and design notes in csrc/kernels/grouped_gemm_hopper.cu).
// Built only when the CUDA arch list has 9.0a (PRIMUS_TURBO_SM90A); in other builds (ROCm, other
// archs) the launch returns kBadArgument and the torch op has no CUDA registration.
#pragma once

#include <cstdint>

#include "primus_turbo/common.h"

namespace primus_turbo {

constexpr int64_t kGroupedGemmHopperMaxGroups = 1024;

// out[offs[i] : offs[i + 1]] = a[offs[i] : offs[i + 1]] @ b[i]^T for every group i < g; rows
// of out past offs[g] are zeroed. a: bf16 [m, k] row-major, b: bf16 [g, n, k] contiguous, out:
// bf16 [m, n] contiguous, offs: int64 [g + 1] on the device (non-decreasing; clamped to [0, m]).
// Needs n % 8 == 0, k % 8 == 0, k > 0, 16-byte aligned pointers, g <= 1024, m and g * n below
// 2^31; cluster 1 (one block per tile) or 2 (pairs of blocks sharing the weight tile through
// TMA multicast). variant (A/B of the kernel's options, 0 = default): bit 0 launch without the
// cluster attribute (cluster 1), bit 1 drain every k step's MMAs, bit 2 bands of 16 row tiles.
// Runs on `stream` (a cudaStream_t) of the current device; no host sync.
Status grouped_gemm_bf16_nt_hopper(const void* a, const void* b, void* out, const int64_t* offs,
                                   int64_t m, int64_t n, int64_t k, int64_t g, int cluster,
                                   int variant, void* stream) noexcept;

}  // namespace primus_turbo
