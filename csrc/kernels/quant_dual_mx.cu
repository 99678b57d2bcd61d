// Dual-output MXFP8 quantization of a bf16 matrix on NVIDIA: q in 1 x 32 blocks along rows and
// qt = x.T in 1 x 32 blocks along M, E8M0 scales, one pass (recipe and layouts in
// primus_turbo/quant_dual_mx.h; bitwise the Triton word kernel).
//
// Designed for MX (the 1x128 kernel's MX mode lost, session 7): a block of 256 threads takes a
// 128 x 128 tile as 8 independent warp tiles of 32 rows x 64 columns (4 along M, 2 along N).
// Lane (rq = lane / 8, cv = lane % 8) holds the 8 consecutive rows 8 rq .. +7 of the 8 columns
// 8 cv .. +7 (8 loads of 16 bytes: one instruction reads 4 rows x 128 bytes). So both MX
// blocks reduce inside the warp: a row block (32 columns) is a quad of lanes (2 shuffle steps),
// a column block (32 rows) the 4 lanes of one cv (2 steps); no shared-memory round trip for any
// amax.
// Amax works on exponent fields only (E8M0 needs nothing else): key = bits & 0x7f807f80 for two
// bf16 at once, packed maxima with __vmaxu2; a thread that saw an exponent of 255 (inf/NaN)
// redoes its maxima with those keys zeroed (rare). Scale math is integer: eb = max(e - EMAX, 0),
// multiplier bits (254 - eb) << 23. Both copies come from one walk over the thread's 4 column
// pairs (each value unpacked once, multiplied by its row and its column scale): a column's 8
// rows are 8 consecutive bytes of a qt row (8-byte stores straight from registers, full 32-byte
// sectors per 4 lanes, no shared tile); the row bytes collect in registers and leave as 8 bytes
// per row (a warp store covers 4 rows x 64 bytes). Scales go through 1 KB of shared memory so
// each row of s and of st gets one 4-byte store per tile (256 stores per tile instead of 1024
// single bytes), one __syncthreads per tile.
// sm_90 SASS per element (main path, 752 per thread and tile incl. the unexecuted byte-wise
// edge stores): 2 FMUL, 1 unpack, 1 F2FP (two outputs), 0.5 exponent mask, ~0.9 packed max,
// ~0.5 PRMT; 80 registers, no spill (the Triton word kernel: 11.75 per element, 96 registers).
// Variant (PRIMUS_TURBO_QUANT_CUDA_MX; H200 call 8.2, x of copy, 4 shapes: a 0.816, Triton
// 0.787 in call 8.1): 1 (a, the only one) = one tile per 256-thread block, 3 blocks per SM (79
// registers). Removed after call 8.2: d (512-thread blocks, 4 rows per lane: 0.751), e
// (persistent, next tile in registers: 0.777), f (a with ld.global.nc.L2::256B: 0.810), the rows
// kernel (0.834 vs Triton 0.875); after call 8.3: g (persistent 2 blocks/SM, next tile by
// cp.async, q^T through a swizzled shared tile with 16-byte stores: 0.806 vs a 0.816). Needs
// sm_89+ (fp8 conversions; other archs compile an empty kernel and the Python gate never calls
// it there). ROCm builds compile a stub (AMD keeps the Triton kernels). Nothing here throws.
// The tile math lives in primus_turbo/quant_mx_tile.cuh (shared with quant_dual_bulk.cu, whose
// persistent bulk-async pipeline serves the opt-in variants 2 / 3 / 4 = b / c / d, dispatched
// below).
#include "primus_turbo/device.h"
#include "primus_turbo/quant_dual_mx.h"

namespace primus_turbo {

#if PT_HIP

bool quant_dual_mx_gpu_available() noexcept { return false; }

Status quant_dual_mx_fp8_gpu(const void*, void*, void*, void*, void*, int64_t, int64_t, bool,
                             int, void*) noexcept {
  return kBadArgument;
}

#else

namespace {

#include "primus_turbo/quant_mx_tile.cuh"  // kTile, Layout, load_tile, tile_body

// One 128 x 128 tile per block; R rows per lane (8: 256 threads, 4: 512 threads), at least
// MINB blocks per SM (the register cap).
template <bool E5M2, int R, int MINB>
__global__ void __launch_bounds__(Layout<R>::kThreads, MINB)
    quant_mx_tile_kernel(const uint16_t* __restrict__ x, uint8_t* __restrict__ q,
                         uint8_t* __restrict__ s, uint8_t* __restrict__ qt,
                         uint8_t* __restrict__ st, int M, int N, int tiles_n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  __shared__ uint32_t ssm[kTile], csm[kTile];
  const int tm = blockIdx.x / tiles_n, tn = blockIdx.x % tiles_n;
  uint32_t d[R][4];
  load_tile<R>(d, x, M, N, tm, tn);
  tile_body<E5M2, R>(d, ssm, csm, q, s, qt, st, M, N, tm, tn);
#endif
}

template <bool E5M2, int R, int MINB>
void launch_tiles(const uint16_t* X, uint8_t* Q, uint8_t* S, uint8_t* QT, uint8_t* ST, int M,
                  int N, int tn, int64_t tiles, cudaStream_t stream) {
  quant_mx_tile_kernel<E5M2, R, MINB>
      <<<static_cast<unsigned>(tiles), Layout<R>::kThreads, 0, stream>>>(X, Q, S, QT, ST, M, N,
                                                                           tn);
}

template <bool E5M2>
Status launch(const void* x, void* q, void* s, void* qt, void* st, int64_t m, int64_t n,
              cudaStream_t stream) {
  const int64_t tiles_m = (m + kTile - 1) / kTile, tiles_n = (n + kTile - 1) / kTile;
  const int64_t tiles = tiles_m * tiles_n;
  // 32-bit row / column indices (offsets are 64-bit)
  if (tiles > 0x7fffffff || m > 0x7fffff00 || n > 0x7fffff00) return kBadArgument;
  const auto* X = static_cast<const uint16_t*>(x);
  auto* Q = static_cast<uint8_t*>(q);
  auto* S = static_cast<uint8_t*>(s);
  auto* QT = static_cast<uint8_t*>(qt);
  auto* ST = static_cast<uint8_t*>(st);
  const int tn = static_cast<int>(tiles_n);
  const int M = static_cast<int>(m), N = static_cast<int>(n);
  launch_tiles<E5M2, 8, 3>(X, Q, S, QT, ST, M, N, tn, tiles, stream);  // a
  PT_RETURN_LAUNCH_STATUS();
  return kOk;
}

}  // namespace

bool quant_dual_mx_gpu_available() noexcept { return true; }

Status quant_dual_mx_fp8_gpu(const void* x, void* q, void* s, void* qt, void* st, int64_t m,
                             int64_t n, bool e5m2, int variant, void* stream) noexcept {
  if (variant >= 2 && variant <= 4) {  // b / c / d: quant_dual_bulk.cu
    return quant_dual_mx_bulk_gpu(x, q, s, qt, st, m, n, e5m2, variant, stream);
  }
  if (m < 0 || n < 0 || m % 32 != 0 || n % 32 != 0 || variant != 1) return kBadArgument;
  if (m == 0 || n == 0) return kOk;
  auto* cs = static_cast<cudaStream_t>(stream);
  return e5m2 ? launch<true>(x, q, s, qt, st, m, n, cs) : launch<false>(x, q, s, qt, st, m, n, cs);
}

#endif  // PT_HIP

}  // namespace primus_turbo
