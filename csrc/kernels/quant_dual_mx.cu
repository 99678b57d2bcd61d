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
// The scales leave outer-dim-major (s stored as [N/32][M], st as [M/32][N]; logical [M, N/32]
// / [N, M/32] with strides (1, M) / (1, N), like the 1x128 recipe's fp32 scales): a tile's 4
// blocks per direction are 4 runs of 128 consecutive bytes, 32 full L2 sectors per tile.
// sm_90 SASS per element (main path): 2 FMUL, 1 unpack, 1 F2FP (two outputs), 0.5 exponent
// mask, ~0.9 packed max, ~0.5 PRMT; 80 registers, no spill (the Triton word kernel: 11.75 per
// element, 96 registers). One tile per 256-thread block, 3 blocks per SM.
// Measured history (H200, graph, x of copy, geomean 8192/6144/4096/28672 x 4096; details in
// docs/low_precision_notes.md): with row-major scales this kernel (then `a`) read 0.815-0.818:
// its 4-byte scale stores, rows N/32 and M/32 bytes apart, cost 2 M N / 128 partial L2 write
// sectors (524288 at 8192x4096, on top of q + q^T's 2097152) and made it L2-write-bound
// (ncu: a 38.8 us vs the 1x128 kernel's 34.1 us with fewer instructions). Gathering the scales
// in 2x4 thread block clusters (`f`, default in session 9) recovered a third: 0.831-0.833.
// Storing them outer-dim-major (call 10.1) removed the partial sectors: **0.903 / 0.903** (every
// shape 0.895-0.910), so the clusters (and the row-major layout) were removed. Earlier losers:
// 512-thread blocks (0.751), persistent variants with the next tile in registers (0.777), by
// cp.async (0.806) or by 1-D cp.async.bulk rings (0.61-0.70), ld.global.nc.L2::256B (0.810),
// a CUDA rows kernel (0.834 vs Triton 0.875), cluster barriers (0.78), 4x4 / 2x2 / 1x4 clusters
// (0.815 / 0.827 / 0.817). Needs sm_89+ (fp8 conversions; other archs compile an empty kernel
// and the Python gate never calls it there). ROCm builds compile a stub (AMD keeps the Triton
// kernels). Nothing here throws. The tile math lives in primus_turbo/quant_mx_tile.cuh.
#include "primus_turbo/device.h"
#include "primus_turbo/quant_dual_mx.h"

namespace primus_turbo {

#if PT_HIP

bool quant_dual_mx_gpu_available() noexcept { return false; }

Status quant_dual_mx_fp8_gpu(const void*, void*, void*, void*, void*, int64_t, int64_t, bool,
                             void*) noexcept {
  return kBadArgument;
}

#else

namespace {

#include "primus_turbo/quant_mx_tile.cuh"  // kTile, Layout, load_tile, tile_body

// One 128 x 128 tile per block; R rows per lane (8: 256 threads), at least MINB blocks per SM
// (the register cap).
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
  tile_body<E5M2, R>(d, ssm, csm, q, qt, M, N, tm, tn);
  store_scales(ssm, csm, s, st, M, N, tm, tn);
#endif
}

template <bool E5M2>
Status launch(const void* x, void* q, void* s, void* qt, void* st, int64_t m, int64_t n,
              cudaStream_t stream) {
  const int64_t tiles_m = (m + kTile - 1) / kTile, tiles_n = (n + kTile - 1) / kTile;
  const int64_t tiles = tiles_m * tiles_n;
  // 32-bit row / column indices (offsets are 64-bit)
  if (tiles > 0x7fffffff || m > 0x7fffff00 || n > 0x7fffff00) return kBadArgument;
  quant_mx_tile_kernel<E5M2, 8, 3><<<static_cast<unsigned>(tiles), Layout<8>::kThreads, 0,
                                     stream>>>(
      static_cast<const uint16_t*>(x), static_cast<uint8_t*>(q), static_cast<uint8_t*>(s),
      static_cast<uint8_t*>(qt), static_cast<uint8_t*>(st), static_cast<int>(m),
      static_cast<int>(n), static_cast<int>(tiles_n));
  PT_RETURN_LAUNCH_STATUS();
  return kOk;
}

}  // namespace

bool quant_dual_mx_gpu_available() noexcept { return true; }

Status quant_dual_mx_fp8_gpu(const void* x, void* q, void* s, void* qt, void* st, int64_t m,
                             int64_t n, bool e5m2, void* stream) noexcept {
  if (m < 0 || n < 0 || m % 32 != 0 || n % 32 != 0) return kBadArgument;
  if (m == 0 || n == 0) return kOk;
  auto* cs = static_cast<cudaStream_t>(stream);
  return e5m2 ? launch<true>(x, q, s, qt, st, m, n, cs) : launch<false>(x, q, s, qt, st, m, n, cs);
}

#endif  // PT_HIP

}  // namespace primus_turbo
