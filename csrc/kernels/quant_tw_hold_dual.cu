// Dual dynamic tensorwise FP8 quantization (q = x quantized, qt = x.T quantized, one scale) of a
// bf16 [M, N] matrix in one cooperative launch that holds most of x on chip across a grid
// barrier: the 2-D sibling of quant_tw_hold.cu (read its file comment first; recipe and API in
// primus_turbo/quant_tw_hold.h). M and N multiples of 64.
//
// The matrix is cut into 64 x 64 tiles (8 KB; tile index tm * (N / 64) + tn) and block b of the
// co-resident grid (one 512-thread block per SM) owns a contiguous range of tile indices. Thread
// t owns the 16-byte vector (row t / 8, columns 8 (t % 8) .. +7) of every tile. Held: 26 tiles in
// shared memory (cp.async, L2 evict_first, XOR-swizzled slots: vector c of row r at r * 8 +
// (c ^ ((r / 8) % 8)), so the column reads below are bank-conflict free), 16 (variant 1: 12)
// tiles in registers (one uint4 per thread per tile); further tiles are streamed for the amax (L2 evict_last, read
// last). Phase 1 / barrier / scale as quant_tw_hold.cu. Phase 2, per tile: the q row bytes from
// the thread's own vector (8 bytes; a warp writes 4 rows x 64 contiguous bytes), and the qt bytes
// through shared memory: thread t reads column j = 4 (t / 32) + (t % 32) / 8 of rows 8 g .. 8 g +
// 7 (g = t % 8) and stores them as 8 bytes of qt row n0 + j (a warp: 4 qt rows x 64 contiguous
// bytes). Streamed tiles (newest first, re-read with evict_first) and register tiles go through
// two alternating 8 KB staging tiles (one block barrier per tile); shared-memory tiles are read
// in place. 224 KB of dynamic shared memory (26 + 2 tiles).
#include <algorithm>
#include <atomic>

#include "primus_turbo/device.h"
#include "primus_turbo/quant_tw_hold.h"

#if !PT_HIP
#include <cooperative_groups.h>
#endif

namespace primus_turbo {

#if PT_HIP

Status quant_tw_hold_dual_fp8_gpu(const void*, void*, void*, void*, void*, int64_t, int64_t, bool,
                                  float, int, int, int, void*) noexcept {
  return kBadArgument;
}

Status quant_tw_hold_dual_blocks(int, bool, int* blocks) noexcept {
  *blocks = 0;
  return kBadArgument;
}

#else

namespace {

constexpr int kTile = 64;          // rows and columns of a tile
constexpr int kThreads = 512;      // one 16-byte vector of every tile per thread
constexpr int kSmemTiles = 26;     // tiles held in shared memory
constexpr int kStageTiles = 2;     // staging tiles of the transposes
constexpr int kTileVec = kTile * kTile / 8;  // 512
constexpr int kDualSmemBytes = (kSmemTiles + kStageTiles) * kTileVec * 16;  // 224 KB

#include "primus_turbo/fp8_convert.cuh"  // cvt2, bf_lo, bf_hi

#include "primus_turbo/quant_tw_hold.cuh"  // policies, loads, keys, cast8, block_max

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// Shared-memory slot of vector c of tile row r (XOR swizzle by the row's 8-row group).
__device__ __forceinline__ int swz(int r, int c) { return r * 8 + (c ^ ((r >> 3) & 7)); }

// The origin (row m0, column n0) of tile `ti`.
__device__ __forceinline__ void tile_origin(int64_t ti, int tiles_n, int64_t* m0, int* n0) {
  const int64_t tm = ti / tiles_n;
  *m0 = tm * kTile;
  *n0 = static_cast<int>(ti - tm * tiles_n) * kTile;
}

// Both outputs of one tile: `own` is this thread's vector (row r, columns 8 c ..), `tile` the
// whole tile in (swizzled) shared memory, visible to the block.
template <bool E5M2>
__device__ __forceinline__ void cast_tile(const uint4* tile, uint4 own, int64_t ti, int tiles_n,
                                          uint8_t* __restrict__ q, uint8_t* __restrict__ qt,
                                          int64_t M, int64_t N, float scale, bool cs) {
  const int t = threadIdx.x, r = t >> 3, c = t & 7;
  int64_t m0;
  int n0;
  tile_origin(ti, tiles_n, &m0, &n0);
  store8(reinterpret_cast<uint2*>(q + (m0 + r) * N + n0 + 8 * c), cast8<E5M2>(own, scale), cs);
  const int g = t & 7, j = 4 * (t >> 5) + ((t & 31) >> 3);
  const uint16_t* tv = reinterpret_cast<const uint16_t*>(tile);
  uint32_t w[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int i = 8 * g + 2 * p;
    const uint32_t a = tv[swz(i, j >> 3) * 8 + (j & 7)];
    const uint32_t b = tv[swz(i + 1, j >> 3) * 8 + (j & 7)];
    w[p] = cvt2<E5M2>(__uint_as_float(a << 16) * scale, __uint_as_float(b << 16) * scale);
  }
  store8(reinterpret_cast<uint2*>(qt + (n0 + j) * M + m0 + 8 * g),
         make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16)), cs);
}

#endif  // __CUDA_ARCH__ >= 900

// kRegTiles: tiles held in registers (one uint4 per thread each); kStream: streamed tiles in
// flight per loop step.
template <bool E5M2, int kRegTiles, int kStream>
__global__ void __launch_bounds__(kThreads, 1)
    quant_tw_hold_dual_kernel(const uint16_t* __restrict__ x, uint8_t* __restrict__ q,
                              uint8_t* __restrict__ qt, float* __restrict__ s,
                              uint32_t* __restrict__ parts, int64_t M, int64_t N, int64_t ntiles,
                              int tiles_n, float fmax, int flags) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint4 sm[];  // kSmemTiles held + kStageTiles staging tiles
  __shared__ uint32_t red[32];
  const int t = threadIdx.x, r = t >> 3, c = t & 7, slot = swz(r, c);
  const int nblk = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
  const int64_t per = ntiles / nblk;  // the host keeps per + 1 < 2**31
  const int extra = static_cast<int>(ntiles % nblk);
  const int64_t first = b * per + min(b, extra);
  const int cnt = static_cast<int>(per) + (b < extra ? 1 : 0);
  const int hs = min(cnt, kSmemTiles);
  const int hr = min(cnt - hs, kRegTiles);
  const int rest = cnt - hs - hr;  // streamed tiles first + hs + hr + k, k < rest
  const bool evict = (flags & kQuantTwHoldEvict) != 0;
  const bool cs = (flags & kQuantTwHoldStreamStores) != 0;
  // this thread's vector of tile ti
  auto vec_of = [&](int64_t ti) -> const uint4* {
    int64_t m0;
    int n0;
    tile_origin(ti, tiles_n, &m0, &n0);
    return reinterpret_cast<const uint4*>(x + (m0 + r) * N + n0 + 8 * c);
  };

  {
    const uint64_t pol = policy_evict_first();
    for (int k = 0; k < hs; ++k) cp_async16(&sm[k * kTileVec + slot], vec_of(first + k), pol);
  }
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  uint4 h[kRegTiles];
  {
    const uint64_t pol = policy_evict_first();
#pragma unroll
    for (int j = 0; j < kRegTiles; ++j) {
      h[j] = j < hr ? ld_vec(vec_of(first + hs + j), pol) : zero;
    }
  }
  const int64_t rs0 = first + hs + hr;  // the first streamed tile
  uint32_t m2 = 0;
  for (int k0 = 0; k0 < rest; k0 += kStream) {
    const uint64_t pol = evict ? policy_evict_last() : policy_evict_normal();
    uint4 v[kStream];
#pragma unroll
    for (int u = 0; u < kStream; ++u) {
      v[u] = k0 + u < rest ? ld_vec(vec_of(rs0 + k0 + u), pol) : zero;
    }
#pragma unroll
    for (int u = 0; u < kStream; ++u) m2 = vmax<false>(v[u], m2);
  }
  cp_async_commit_wait_all();
  for (int k = 0; k < hs; ++k) m2 = vmax<false>(sm[k * kTileVec + slot], m2);
#pragma unroll
  for (int j = 0; j < kRegTiles; ++j) m2 = vmax<false>(h[j], m2);
  uint32_t key = max(m2 & 0xffffu, m2 >> 16);
  if (key >= kInfKey) {  // an inf or NaN among this thread's values: again, finite values only
    m2 = 0;
#pragma unroll
    for (int j = 0; j < kRegTiles; ++j) m2 = vmax<true>(h[j], m2);
    for (int k = 0; k < hs; ++k) m2 = vmax<true>(sm[k * kTileVec + slot], m2);
    const uint64_t pol = policy_evict_normal();
    for (int k = 0; k < rest; ++k) m2 = vmax<true>(ld_vec(vec_of(rs0 + k), pol), m2);
    key = max(m2 & 0xffffu, m2 >> 16);
  }
  key = block_max<kThreads>(key, red);
  if (t == 0) parts[b] = key;

  cooperative_groups::this_grid().sync();  // also a block barrier: the held tiles are visible

  uint32_t gk = 0;
  for (int i = t; i < nblk; i += kThreads) gk = max(gk, __ldcg(parts + i));
  gk = block_max<kThreads>(gk, red);
  const float scale = div_full(fmax, fmaxf(__uint_as_float(gk << 16), 1e-12f));
  if (b == 0 && t == 0) *s = div_full(1.0f, scale);

  // Phase 2: streamed tiles newest first, then the shared-memory tiles, then the registers'
  uint4* stage = sm + kSmemTiles * kTileVec;
  int ns = 0;  // staged tiles so far (alternating staging tiles; one barrier per tile)
  for (int k1 = rest; k1 > 0; k1 -= kStream) {
    const uint64_t pol = evict ? policy_evict_first() : policy_evict_normal();
    const int k0 = max(0, k1 - kStream);
    uint4 v[kStream];
#pragma unroll
    for (int u = 0; u < kStream; ++u) {
      v[u] = k0 + u < k1 ? ld_vec(vec_of(rs0 + k0 + u), pol) : zero;
    }
#pragma unroll
    for (int u = kStream - 1; u >= 0; --u) {
      if (k0 + u < k1) {  // block-uniform
        uint4* st = stage + (ns & 1) * kTileVec;
        st[slot] = v[u];
        __syncthreads();
        cast_tile<E5M2>(st, v[u], rs0 + k0 + u, tiles_n, q, qt, M, N, scale, cs);
        ++ns;
      }
    }
  }
  for (int k = 0; k < hs; ++k) {
    const uint4* tile = sm + k * kTileVec;
    cast_tile<E5M2>(tile, tile[slot], first + k, tiles_n, q, qt, M, N, scale, cs);
  }
#pragma unroll
  for (int j = 0; j < kRegTiles; ++j) {
    if (j < hr) {  // block-uniform
      uint4* st = stage + (ns & 1) * kTileVec;
      st[slot] = h[j];
      __syncthreads();
      cast_tile<E5M2>(st, h[j], first + hs + j, tiles_n, q, qt, M, N, scale, cs);
      ++ns;
    }
  }
#endif  // __CUDA_ARCH__ >= 900
}

// Dual variants (quant_tw_hold.h): 0 = 16 register tiles, 4 streamed tiles in flight; 1 = 12, 8.
const void* dual_kernel(int variant, bool e5m2) {
  if (variant == 1) {
    return e5m2 ? reinterpret_cast<const void*>(&quant_tw_hold_dual_kernel<true, 12, 8>)
                : reinterpret_cast<const void*>(&quant_tw_hold_dual_kernel<false, 12, 8>);
  }
  return e5m2 ? reinterpret_cast<const void*>(&quant_tw_hold_dual_kernel<true, 16, 4>)
              : reinterpret_cast<const void*>(&quant_tw_hold_dual_kernel<false, 16, 4>);
}

Status dual_resident_blocks(int variant, bool e5m2, int* blocks) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices][kQuantTwHoldDualVariants][2];  // blocks + 1, 0 = unset
  int dev = 0;
  PT_RETURN_IF_ERROR(ptGetDevice(&dev));
  std::atomic<int>* slot =
      dev >= 0 && dev < kMaxDevices ? &cache[dev][variant][e5m2 ? 1 : 0] : nullptr;
  if (slot != nullptr) {
    const int v = slot->load(std::memory_order_relaxed);
    if (v > 0) {
      *blocks = v - 1;
      return kOk;
    }
  }
  int major = 0, coop = 0, sms = 0, per_sm = 0;
  PT_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  PT_RETURN_IF_ERROR(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  PT_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  int n = 0;
  if (major >= 9 && coop != 0) {
    const void* fn = dual_kernel(variant, e5m2);
    PT_RETURN_IF_ERROR(
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kDualSmemBytes));
    PT_RETURN_IF_ERROR(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kThreads, kDualSmemBytes));
    n = per_sm * sms;
  }
  if (slot != nullptr) slot->store(n + 1, std::memory_order_relaxed);
  *blocks = n;
  return kOk;
}

}  // namespace

Status quant_tw_hold_dual_blocks(int variant, bool e5m2, int* blocks) noexcept {
  *blocks = 0;
  if (variant < 0 || variant >= kQuantTwHoldDualVariants) return kBadArgument;
  return dual_resident_blocks(variant, e5m2, blocks);
}

Status quant_tw_hold_dual_fp8_gpu(const void* x, void* q, void* qt, void* s, void* parts,
                                  int64_t m, int64_t n, bool e5m2, float fmax, int variant,
                                  int flags, int blocks, void* stream) noexcept {
  if (variant < 0 || variant >= kQuantTwHoldDualVariants) return kBadArgument;
  if (m < kTile || n < kTile || m % kTile != 0 || n % kTile != 0 || blocks < 1) {
    return kBadArgument;
  }
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(q) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(qt) % 8 != 0) {
    return kBadArgument;
  }
  int64_t ntiles = (m / kTile) * (n / kTile);
  int tiles_n = static_cast<int>(n / kTile);
  if (n / kTile > 0x7fffffff || ntiles / blocks >= 0x7fffffff) return kBadArgument;
  int resident = 0;
  const Status st = dual_resident_blocks(variant, e5m2, &resident);
  if (st != kOk) return st;
  if (blocks > resident) return kBadArgument;  // the cooperative grid must be co-resident
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kDualSmemBytes;
  cfg.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const uint16_t* xv = static_cast<const uint16_t*>(x);
  uint8_t* qv = static_cast<uint8_t*>(q);
  uint8_t* qtv = static_cast<uint8_t*>(qt);
  float* sf = static_cast<float*>(s);
  uint32_t* pw = static_cast<uint32_t*>(parts);
  int64_t mm = m, nn = n;
  void* args[] = {&xv, &qv, &qtv, &sf, &pw, &mm, &nn, &ntiles, &tiles_n, &fmax, &flags};
  PT_RETURN_IF_ERROR(cudaLaunchKernelExC(&cfg, dual_kernel(variant, e5m2), args));
  return kOk;
}

#endif  // PT_HIP

}  // namespace primus_turbo
