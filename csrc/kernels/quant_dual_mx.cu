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
// Variants (PRIMUS_TURBO_QUANT_CUDA_MX, all the same bits): 1 (a, the default before sm_90 and
// for shapes without whole clusters; H200 call 8.2: 0.816 of copy, 4 shapes; Triton 0.787 in
// call 8.1) = one tile per 256-thread block, 3 blocks per SM (79 registers). Why the 1x128
// kernel `t` of quant_dual.cu, same structure, reaches 0.918
// (ncu 8192 x 4096, calls 8.1 / 9.1: a 38.8 us, t 34.1 us): the L2 write sectors. a's scale
// stores are 4 bytes per s row / st row and tile (row stride N / 32 and M / 32 bytes), one
// 32-byte sector each: 2 x M N / 128 sectors (524288 there) on top of q and q^T's 2097152, where
// t's fp32 scales are 512-byte coalesced rows (65536): L2 compression input sectors 2621448 vs
// 2163231, L2 throughput ~87% in both (the limiter), DRAM 61.6% vs 69%. a issues fewer
// instructions (11.48 M vs 12.53 M), so the gap is not the math. 2 (f, the default on sm_90+
// since session 9 round 3; call 9.2: 0.831 / 0.831 of copy vs a 0.814 / 0.817, ncu 37.5 us vs
// 41.3 us, L2 input sectors 2294253) = a in thread block clusters of 2 x 4 tiles, M x N: after
// tile_body each block sends its 128 + 128 scale words to the owner block's shared memory by
// st.async with complete_tx on the owner's mbarrier (block r owns 128 / CN s rows and 128 / CM
// st rows of the cluster), the owner waits on its own barrier only, then stores 16 bytes per s
// row and 8 per st row: 96 sectors per tile instead of 256. Shapes whose tiles do not fill whole
// clusters (M % 256, N % 512) run a. f's 8-block clusters fit 45 at once on the H200 (360
// resident blocks vs a's 396); smaller clusters regain blocks but lose scale-sector savings.
// Removed after call 9.4 (x of copy, 4 shapes, two interleaved repeats; f 0.833 / 0.830): h (f
// in 2 x 2 clusters, 8-byte s and st rows, 128 sectors per tile, 368 resident blocks: 0.827 /
// 0.824) and i (1 x 4 along N, 16-byte s / 4-byte st rows, 160 sectors, 368 blocks: 0.817 /
// 0.821). Removed after call 9.3: g (f in 4 x 4 clusters of 16 blocks, the non-portable
// cluster size, 64 sectors per tile: 0.815 / 0.816 vs f 0.830 / 0.831).
// Removed after call 9.2: e (f with st.shared::cluster and a release / acquire cluster barrier;
// ptxas puts a MEMBAR.ALL.GPU before the arrive, so each block waited for its q / q^T stores:
// 0.781 / 0.779 vs a 0.814 / 0.817).
// Removed after call 8.2: d (512-thread blocks, 4 rows per lane: 0.751), e (persistent, next
// tile in registers: 0.777), f (a with ld.global.nc.L2::256B: 0.810), the rows kernel (0.834 vs
// Triton 0.875); after call 8.3: g (persistent 2 blocks/SM, next tile by cp.async, q^T through
// a swizzled shared tile with 16-byte stores: 0.806 vs a 0.816); after call 9.1: b / c / d
// (persistent, tiles staged by 1-D cp.async.bulk on mbarriers, 2 stages x 3 per SM / 3 x 2 /
// b with q^T through shared memory and bulk stores: 0.701 / 0.698 / 0.614 vs a 0.816). Needs
// sm_89+ (fp8 conversions; other archs compile an empty kernel and the Python gate never calls
// it there). ROCm builds compile a stub (AMD keeps the Triton kernels). Nothing here throws.
// The tile math lives in primus_turbo/quant_mx_tile.cuh.
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

// One 128 x 128 tile per block; R rows per lane (8: 256 threads), at least MINB blocks per SM
// (the register cap); OUTER: the outer-dim-major scale layout (store_scales_outer), else row-major.
template <bool E5M2, int R, int MINB, bool OUTER>
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
  if constexpr (OUTER) {
    store_scales_outer(ssm, csm, s, st, M, N, tm, tn);
  } else {
    store_scales(ssm, csm, s, st, M, N, tm, tn);
  }
#endif
}

// 32-bit words of CN (s) / CM (st) scale words per row, stored at once (16 / 8 bytes).
template <int W>
__device__ __forceinline__ void st_words(uint8_t* p, const uint32_t* w) {
  static_assert(W == 4 || W == 2, "f's 2 x 4 clusters: 4 s words, 2 st words per row");
  if constexpr (W == 4) {
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  }
}

// Variant f: a cluster of CM x CN tiles (blocks); the whole grid is clusters (M % 128 CM == 0,
// N % 128 CN == 0: every tile is full). Block r of cluster c takes tile (CM (c / cn) + r / CN,
// CN (c % cn) + r % CN), runs a's tile math, then the scale gather described at the top: each
// word sent by st.async with complete_tx on the owner's mbarrier (1 KB expected per block), the
// owner waits on its own barrier only (no fence, no second cluster barrier).
template <bool E5M2, int CM, int CN>
__global__ void __launch_bounds__(256, 3)
    quant_mx_cluster_kernel(const uint16_t* __restrict__ x, uint8_t* __restrict__ q,
                            uint8_t* __restrict__ s, uint8_t* __restrict__ qt,
                            uint8_t* __restrict__ st, int M, int N, int clusters_n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kSRows = kTile / CN;  // s rows this block owns (of the cluster's 128 CM)
  constexpr int kSCols = kTile / CM;  // st rows (columns of x) it owns (of 128 CN)
  static_assert(kSRows * CN + kSCols * CM == 2 * kTile, "each block owns 256 words");
  __shared__ uint32_t ssm[kTile], csm[kTile];
  __shared__ __align__(16) uint32_t sown[kSRows * CN];  // owned s rows: CN words each
  __shared__ __align__(16) uint32_t cown[kSCols * CM];  // owned st rows: CM words each
  __shared__ __align__(8) uint64_t mbar;  // the owned words' arrival
  const int t = threadIdx.x;
  const auto mbar_a = static_cast<uint32_t>(__cvta_generic_to_shared(&mbar));
  if (t == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(mbar_a) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile(
        "{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(
            mbar_a),
        "r"(2 * kTile * 4) : "memory");  // 256 words
  }
  // every block of the cluster must be running (and its barrier initialised) before any writes
  // into its shared memory
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  uint32_t rank, cid;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(cid));
  const int cmi = static_cast<int>(cid) / clusters_n, cni = static_cast<int>(cid) % clusters_n;
  const int sub_m = static_cast<int>(rank) / CN, sub_n = static_cast<int>(rank) % CN;
  const int tm = cmi * CM + sub_m, tn = cni * CN + sub_n;
  {
    uint32_t d[8][4];
    load_tile<8>(d, x, M, N, tm, tn);
    tile_body<E5M2, 8>(d, ssm, csm, q, qt, M, N, tm, tn);
  }
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
  {
    // s row r (of the cluster) -> owner r / kSRows, word (r % kSRows) CN + sub_n; st row c ->
    // owner c / kSCols, word (c % kSCols) CM + sub_m
    uint32_t* slot;
    uint32_t owner, v;
    if (t < kTile) {
      const int r = kTile * sub_m + t;
      slot = &sown[(r % kSRows) * CN + sub_n];
      owner = static_cast<uint32_t>(r / kSRows);
      v = ssm[t];
    } else {
      const int c = kTile * sub_n + (t - kTile);
      slot = &cown[(c % kSCols) * CM + sub_m];
      owner = static_cast<uint32_t>(c / kSCols);
      v = csm[t - kTile];
    }
    const auto local = static_cast<uint32_t>(__cvta_generic_to_shared(slot));
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                 : "=r"(remote)
                 : "r"(local), "r"(owner));
    uint32_t rbar;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rbar) : "r"(mbar_a), "r"(owner));
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(
            remote),
        "r"(v), "r"(rbar) : "memory");
  }
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], "
        "0;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(mbar_a)
        : "memory");
  }
  // owners store; no block touches another block's shared memory after this point (every word
  // this block receives has arrived), so exits are safe
  const int m0 = cmi * CM * kTile, n0 = cni * CN * kTile;
  if (t < kSRows) {
    const int row = m0 + static_cast<int>(rank) * kSRows + t;
    st_words<CN>(s + int64_t{row} * (N / 32) + n0 / 32, &sown[t * CN]);
  } else if (t >= kTile && t < kTile + kSCols) {
    const int c = t - kTile;
    const int n = n0 + static_cast<int>(rank) * kSCols + c;
    st_words<CM>(st + int64_t{n} * (M / 32) + m0 / 32, &cown[c * CM]);
  }
#endif
}

template <bool E5M2, int R, int MINB, bool OUTER>
void launch_tiles(const uint16_t* X, uint8_t* Q, uint8_t* S, uint8_t* QT, uint8_t* ST, int M,
                  int N, int tn, int64_t tiles, cudaStream_t stream) {
  quant_mx_tile_kernel<E5M2, R, MINB, OUTER>
      <<<static_cast<unsigned>(tiles), Layout<R>::kThreads, 0, stream>>>(X, Q, S, QT, ST, M, N,
                                                                           tn);
}

template <bool E5M2, int CM, int CN>
cudaError_t launch_clusters(const uint16_t* X, uint8_t* Q, uint8_t* S, uint8_t* QT, uint8_t* ST,
                            int M, int N, int64_t tiles, cudaStream_t stream) {
  auto* kern = quant_mx_cluster_kernel<E5M2, CM, CN>;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(tiles), 1, 1);
  cfg.blockDim = dim3(256, 1, 1);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CM * CN;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const int clusters_n = N / (kTile * CN);
  return cudaLaunchKernelEx(&cfg, kern, X, Q, S, QT, ST, M, N, clusters_n);
}

template <bool E5M2>
Status launch(const void* x, void* q, void* s, void* qt, void* st, int64_t m, int64_t n,
              int variant, cudaStream_t stream) {
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
  // f (2 x 4 tiles): whole clusters only, sm_90+ (else a)
  if (variant == 2 && m % (2 * kTile) == 0 && n % (4 * kTile) == 0) {
    int dev = 0, major = 0;
    PT_RETURN_IF_ERROR(ptGetDevice(&dev));
    PT_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major >= 9) {
      const cudaError_t e = launch_clusters<E5M2, 2, 4>(X, Q, S, QT, ST, M, N, tiles, stream);
      PT_RETURN_IF_ERROR(e);
      return kOk;
    }
  }
  if (variant == 3) {
    launch_tiles<E5M2, 8, 3, true>(X, Q, S, QT, ST, M, N, tn, tiles, stream);  // o
  } else {
    launch_tiles<E5M2, 8, 3, false>(X, Q, S, QT, ST, M, N, tn, tiles, stream);  // a
  }
  PT_RETURN_LAUNCH_STATUS();
  return kOk;
}

}  // namespace

bool quant_dual_mx_gpu_available() noexcept { return true; }

Status quant_dual_mx_fp8_gpu(const void* x, void* q, void* s, void* qt, void* st, int64_t m,
                             int64_t n, bool e5m2, int variant, void* stream) noexcept {
  if (m < 0 || n < 0 || m % 32 != 0 || n % 32 != 0 || variant < 1 || variant > 3) {
    return kBadArgument;
  }
  if (m == 0 || n == 0) return kOk;
  auto* cs = static_cast<cudaStream_t>(stream);
  return e5m2 ? launch<true>(x, q, s, qt, st, m, n, variant, cs)
              : launch<false>(x, q, s, qt, st, m, n, variant, cs);
}

#endif  // PT_HIP

}  // namespace primus_turbo
