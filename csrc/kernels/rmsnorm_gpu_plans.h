// Internal to the kernels library: the "tiles" launch plan of the RMSNorm GPU kernels
// (rmsnorm_tiles.cu), called by the public entry points in rmsnorm.cu. Each returns kOk without
// launching when its vector path does not apply (*handled false / *nparts -1): unaligned
// pointers, hidden not a multiple of 16 bytes, or rows longer than the register-cached path holds.
#pragma once

#include <cstdint>

#include "primus_turbo/device.h"

namespace primus_turbo {

Status rmsnorm_fwd_tiles(const void* x, const void* w, void* y, float* rstd, int64_t rows,
                         int64_t hidden, float eps, DType dtype, ptStream_t s,
                         bool* handled) noexcept;
// Partial dw rows the tiles backward writes for an aligned call (0 when it does not apply).
Status rmsnorm_bwd_tiles_partials(int64_t rows, int64_t hidden, DType dtype,
                                  int64_t* nparts) noexcept;
// Launches dx and the partial dw rows; *nparts = partial rows written, -1 when not handled.
Status rmsnorm_bwd_tiles(const void* dy, const void* x, const void* w, const float* rstd,
                         void* dx, float* part, int64_t rows, int64_t hidden, DType dtype,
                         ptStream_t s, int64_t* nparts) noexcept;

}  // namespace primus_turbo
