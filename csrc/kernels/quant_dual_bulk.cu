// Persistent cast-transpose with a Hopper bulk-async load pipeline (sm_90+), generic over the
// tile-scale policy: the MX dual recipe now (MxTile: the tile math of quant_dual_mx.cu's
// variant a, primus_turbo/quant_mx_tile.cuh); the 1x128 recipe could plug in its own policy.
//
// Each block walks the 128 x 128 tiles blockIdx.x, + gridDim.x, ... and keeps STAGES of them
// in a ring of shared stages (32 KB each, row-major, 256 bytes per tile row). Warp 0 fills a
// stage: lane 0 arms the stage's mbarrier with the tile's byte count (expect_tx), then the 32
// lanes issue one 1-D `cp.async.bulk` per tile row (256 contiguous bytes of x, no tensor map;
// rows / columns past the matrix are not copied), each completing its bytes on that mbarrier.
// Every thread waits on the stage's mbarrier phase (try_wait.parity), reads its part of the tile
// from shared memory (conflict-free: a quarter-warp reads one row's 128 contiguous bytes), and
// runs the policy (amaxes, scales, both copies stored from registers). The policy ends with a
// __syncthreads after its last read of the stage, so after it returns warp 0 refills the stage
// with the tile STAGES steps ahead (after a generic -> async proxy fence). So STAGES - 1 tiles
// are in flight while one is processed, issued by 4 instructions per lane instead of 8 cp.async
// or 8 LDG per thread.
// Variants (PRIMUS_TURBO_QUANT_CUDA_MX): 2 = b: 2 stages, 3 blocks per SM (64 KB dynamic shared
// memory per block, register cap 80 as a); 3 = c: 3 stages, 2 blocks per SM (96 KB, cap 128);
// 4 = d: b's ring at 2 blocks per SM with the store side asynchronous too: q^T goes into a
// double-buffered shared tile (2 x 18 KB, rows 144 bytes apart, row n at slot (n % 8) * 16 +
// n / 8: 2 wavefronts per 8-byte warp store) and leaves as one 1-D bulk store per q^T row
// (threads 0..127, one bulk group per tile; before the next tile's barrier they wait for the
// group's shared reads); q rows and the scales leave from registers as in a.
// Other archs compile an empty kernel (the launcher refuses devices before sm_90 and the Python
// gate runs a there); ROCm builds compile a stub.
#include <algorithm>
#include <atomic>

#include "primus_turbo/device.h"
#include "primus_turbo/quant_dual_mx.h"

namespace primus_turbo {

#if PT_HIP

Status quant_dual_mx_bulk_gpu(const void*, void*, void*, void*, void*, int64_t, int64_t, bool,
                              int, void*) noexcept {
  return kBadArgument;
}

#else

namespace {

// %tid.x read afresh where the tile math asks for it (see quant_mx_tile.cuh)
__device__ __forceinline__ int fresh_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}
#define PT_MX_TILE_TID() fresh_tid()
#include "primus_turbo/quant_mx_tile.cuh"  // kTile, Layout, tile_body

constexpr int kRowBytes = kTile * 2;             // one bf16 tile row
constexpr int kStageBytes = kTile * kRowBytes;  // 32 KB

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

// Blocks until the phase of parity `parity` of *bar has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t a = smem_u32(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(a), "r"(parity)
        : "memory");
  } while (!done);
}

// Bulk stores (bulk async-groups of this thread): `bytes` (multiple of 16, both addresses
// 16-byte aligned) from shared src to global dst; commit; wait until the reads of the shared
// sources (READ) or the whole groups are done.
__device__ __forceinline__ void bulk_s2g(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
               "r"(smem_u32(src)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
template <bool READ>
__device__ __forceinline__ void bulk_wait_all() {
  if (READ) {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  } else {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
}

// `bytes` (multiple of 16, both addresses 16-byte aligned) from global src to shared dst,
// completing on *bar.
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
#endif

// q^T staged in shared memory for bulk stores (tile_body's QtOut): rows 144 bytes apart (16
// past the 128 data bytes, 16-byte aligned for the bulk reads). Before the tile's barrier every
// thread fences its writes to the async proxy and the storing threads (0..127) wait until their
// previous bulk stores have read their shared rows (the tile before, the other buffer: its
// rows are written again after this barrier).
struct QtBulk {
  static constexpr bool kOn = true;
  static constexpr int kStride = kTile + 16;
  __device__ __forceinline__ static void before_sync(int t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (t < kTile) bulk_wait_all<true>();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
  }
};

struct MxArgs {  // the outputs (primus_turbo/quant_dual_mx.h)
  uint8_t* q;
  uint8_t* s;
  uint8_t* qt;
  uint8_t* st;
};

// MX dual policy: quant_dual_mx.cu's variant-a tile math on a tile read from shared memory;
// QT_BULK: q^T through a shared tile (in the scratch, after the scale bytes) and bulk stores.
template <bool E5M2, bool QT_BULK>
struct MxTile {
  static constexpr int kThreads = Layout<8>::kThreads;  // 256
  // row and column scale bytes (+ the q^T tile)
  static constexpr int kScratchWords = 2 * kTile + (QT_BULK ? kTile * QtBulk::kStride / 4 : 0);
  using Args = MxArgs;
  // tile: the stage (row r of the tile at r * kRowBytes); rows / columns past x are stale.
  __device__ __forceinline__ static void run(const uint8_t* tile, uint32_t* scratch,
                                             const Args& a, int M, int N, int tm, int tn) {
    const Layout<8> L;
    const int rl = 32 * L.wm + 8 * L.rq, cl = 64 * L.wn + 8 * L.cv;  // in the tile
    const bool ok = tm * kTile + rl < M && tn * kTile + cl < N;
    const uint4* src = reinterpret_cast<const uint4*>(tile + rl * kRowBytes + cl * 2);
    uint32_t d[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint4 u = make_uint4(0u, 0u, 0u, 0u);
      if (ok) u = src[j * (kRowBytes / 16)];
      d[j][0] = u.x;
      d[j][1] = u.y;
      d[j][2] = u.z;
      d[j][3] = u.w;
    }
    // tile_body's __syncthreads (before the scale stores) follows every read of the stage
    if constexpr (QT_BULK) {
      tile_body<E5M2, 8, QtBulk>(d, scratch, scratch + kTile, a.q, a.s, a.qt, a.st, M, N, tm, tn,
                                 reinterpret_cast<uint8_t*>(scratch + 2 * kTile));
    } else {
      tile_body<E5M2, 8>(d, scratch, scratch + kTile, a.q, a.s, a.qt, a.st, M, N, tm, tn);
    }
  }
  // After run (past its barrier): QT_BULK: threads 0..127 store q^T row t of the tile (its
  // min(128, M - m0) bytes along M) from the shared tile with one bulk store each.
  __device__ __forceinline__ static void after_tile(uint32_t* scratch, const Args& a, int M,
                                                    int N, int tm, int tn) {
    if constexpr (QT_BULK) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      const int t = fresh_tid();
      if (t < kTile) {
        const int n = tn * kTile + t, m0 = tm * kTile;
        if (n < N) {
          const auto* qts = reinterpret_cast<const uint8_t*>(scratch + 2 * kTile);
          bulk_s2g(a.qt + (int64_t{n} * M + m0), qts + ((t % 8) * 16 + t / 8) * QtBulk::kStride,
                   static_cast<uint32_t>(min(kTile, M - m0)));
        }
        bulk_commit();
      }
#endif
    }
  }
  // At the end of the kernel: the bulk stores complete before the block's shared memory goes.
  __device__ __forceinline__ static void finish() {
    if constexpr (QT_BULK) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if (fresh_tid() < kTile) bulk_wait_all<false>();
#endif
    }
  }
};

// Warp 0: tile `tile` of x into `stage`, completing on *bar. Not inlined: its lane-dependent
// addresses would otherwise be hoisted out of the tile loop and held in registers throughout.
__device__ __noinline__ void issue_tile(const uint16_t* __restrict__ x, uint8_t* stage,
                                        uint64_t* bar, int M, int N, int tiles_n, int tile) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int m0 = tile / tiles_n * kTile, n0 = tile % tiles_n * kTile;
  const int rows = min(kTile, M - m0);
  const uint32_t row_bytes = static_cast<uint32_t>(min(kTile, N - n0)) * 2;
  if (lane == 0) mbar_arrive_expect_tx(bar, static_cast<uint32_t>(rows) * row_bytes);
  __syncwarp();
  const uint16_t* src = x + (int64_t{m0} * N + n0);
  for (int r = lane; r < rows; r += 32) {
    bulk_g2s(stage + r * kRowBytes, src + int64_t{r} * N, row_bytes, bar);
  }
#endif
}

// Persistent bulk-pipelined walk of the 128 x 128 tiles of x [M, N] (bf16) with Policy.
template <class Policy, int STAGES, int MINB>
__global__ void __launch_bounds__(Policy::kThreads, MINB)
    quant_bulk_kernel(const uint16_t* __restrict__ x, const typename Policy::Args args, int M,
                      int N, int tiles_n, int tiles) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint8_t stages[];  // STAGES x kStageBytes
  __shared__ __align__(8) uint64_t full[STAGES];
  __shared__ __align__(16) uint32_t scratch[2][Policy::kScratchWords];  // by step parity
  const int t = threadIdx.x, warp = t >> 5;
  if (t == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) mbar_init(&full[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const int grid = static_cast<int>(gridDim.x);
  if (warp == 0) {
#pragma unroll 1
    for (int s = 0; s < STAGES; ++s) {
      const int tile = static_cast<int>(blockIdx.x) + s * grid;
      if (tile < tiles) issue_tile(x, stages + s * kStageBytes, &full[s], M, N, tiles_n, tile);
    }
  }
  for (int step = 0;; ++step) {  // stage step % STAGES, phase parity (step / STAGES) & 1
    const int tile = static_cast<int>(blockIdx.x) + step * grid;
    if (tile >= tiles) break;
    const int s = step % STAGES;
    mbar_wait(&full[s], static_cast<uint32_t>(step / STAGES) & 1u);
    // M, N opaque per tile: what derives from them is recomputed in each tile instead of being
    // held in registers across the loop (spills at the cap 80)
    int m = M, n = N;
    asm volatile("" : "+r"(m), "+r"(n));
    Policy::run(stages + s * kStageBytes, scratch[step & 1], args, m, n, tile / tiles_n,
                tile % tiles_n);
    Policy::after_tile(scratch[step & 1], args, m, n, tile / tiles_n, tile % tiles_n);
    const int next = tile + STAGES * grid;
    if (warp == 0 && next < tiles) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic reads, then
      issue_tile(x, stages + s * kStageBytes, &full[s], M, N, tiles_n, next);  // async writes
    }
  }
  Policy::finish();
#endif
}

template <class Policy, int STAGES, int MINB>
Status launch_bulk(const uint16_t* x, const typename Policy::Args& args, int M, int N,
                   cudaStream_t stream) {
  const int64_t tiles_n = (N + kTile - 1) / kTile;
  const int64_t tiles = (M + kTile - 1) / kTile * tiles_n;
  if (tiles > 0x7fffffff - (1 << 20)) return kBadArgument;  // tile + STAGES * grid fits an int
  int dev = 0, major = 0;
  PT_RETURN_IF_ERROR(ptGetDevice(&dev));
  PT_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major < 9) return kBadArgument;  // bulk copies and mbarrier tx counts: sm_90+
  constexpr int kSmem = STAGES * kStageBytes;
  auto* kern = quant_bulk_kernel<Policy, STAGES, MINB>;
  // the opt-in once per device and instantiation (not again inside a CUDA graph capture)
  static std::atomic<bool> smem_set[64];
  if (dev < 0 || dev >= 64 || !smem_set[dev].load(std::memory_order_relaxed)) {
    PT_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    if (dev >= 0 && dev < 64) smem_set[dev].store(true, std::memory_order_relaxed);
  }
  int sms = 1;
  const Status st_sm = device_sm_count(&sms);
  if (st_sm != kOk) return st_sm;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(tiles, int64_t{MINB} * sms));
  kern<<<blocks, Policy::kThreads, kSmem, stream>>>(x, args, M, N, static_cast<int>(tiles_n),
                                                    static_cast<int>(tiles));
  PT_RETURN_LAUNCH_STATUS();
  return kOk;
}

template <bool E5M2>
Status launch_mx(const void* x, void* q, void* s, void* qt, void* st, int M, int N, int variant,
                 cudaStream_t stream) {
  using P = MxTile<E5M2, false>;
  using PB = MxTile<E5M2, true>;
  const MxArgs args{static_cast<uint8_t*>(q), static_cast<uint8_t*>(s),
                    static_cast<uint8_t*>(qt), static_cast<uint8_t*>(st)};
  const auto* X = static_cast<const uint16_t*>(x);
  if (variant == 2) return launch_bulk<P, 2, 3>(X, args, M, N, stream);  // b
  if (variant == 3) return launch_bulk<P, 3, 2>(X, args, M, N, stream);  // c
  return launch_bulk<PB, 2, 2>(X, args, M, N, stream);                   // d
}

}  // namespace

Status quant_dual_mx_bulk_gpu(const void* x, void* q, void* s, void* qt, void* st, int64_t m,
                              int64_t n, bool e5m2, int variant, void* stream) noexcept {
  if (m < 0 || n < 0 || m % 32 != 0 || n % 32 != 0 || variant < 2 || variant > 4) {  // b c d
    return kBadArgument;
  }
  if (m == 0 || n == 0) return kOk;
  if (m > 0x7fffff00 || n > 0x7fffff00) return kBadArgument;  // 32-bit row / column indices
  auto* cs = static_cast<cudaStream_t>(stream);
  const int M = static_cast<int>(m), N = static_cast<int>(n);
  return e5m2 ? launch_mx<true>(x, q, s, qt, st, M, N, variant, cs)
              : launch_mx<false>(x, q, s, qt, st, M, N, variant, cs);
}

#endif  // PT_HIP

}  // namespace primus_turbo
