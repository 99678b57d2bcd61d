// Grouped GEMM, bf16, NT (out[rows of group g] = a[rows of g] @ b[g]^T, b [G, N, K]) on NVIDIA
// Hopper (sm_90a): a hand-written warp-specialised persistent kernel, because the compiler
// behind our Triton kernels cannot express what the vendor kernels use on this chip (TMA
// multicast across a 2-CTA cluster, setmaxnreg producer / consumer warpgroups).
//
// Block = 3 warpgroups (384 threads): warpgroup 0 is the producer (one thread issues the TMA
// loads, its registers cut to 40), warpgroups 1 and 2 the consumers (registers raised to 232):
// each owns 64 rows of the 128 x 256 output tile and runs wgmma m64n256k16 on it (128 fp32
// accumulators per thread). K steps of 64 flow through a ring of STAGES shared-memory stages
// (A 128 x 64 and B 256 x 64 bf16, 128-byte swizzled, 48 KiB per stage), each with a "full"
// mbarrier (TMA bytes landed) and an "empty" one (both consumers done reading).
// Persistent: min(#SMs, tiles) blocks walk the tile list with a grid stride; the next tile's
// loads start while the consumers store the current one. Tiles are numbered group by group
// (the table of row starts and tile starts is built in shared memory from `offs` at start:
// no host sync), within a group in bands of GROUP_M row tiles (row tile fastest) so that
// concurrent blocks share weight tiles in L2.
// CLUSTER 2: blocks run in pairs on the same weight tile and adjacent row tiles (a "pair
// tile"); each loads one half of the 256 x 64 weight tile and multicasts it into both blocks'
// shared memory, halving the L2 -> SM traffic of b. A stage is refilled only when the
// consumers of BOTH blocks released it (each consumer arrives on both blocks' empty barrier).
// When a group has an odd number of row tiles, the second block of its last pair computes rows
// past the group and stores nothing.
// Edges: rows past a group's end and columns past N are loaded (next group's rows, the next
// weight's rows or TMA zero fill) but never stored; K tails are zero-filled by TMA. Rows past
// offs[G] are zeroed at the end. 64-bit output offsets.
#include "primus_turbo/device.h"
#include "primus_turbo/grouped_gemm_hopper.h"

#include <algorithm>
#include <atomic>

#if !PT_HIP
#include <cuda.h>  // CUtensorMap and the driver types of cuTensorMapEncodeTiled
#endif

namespace primus_turbo {

#if PT_HIP || !defined(PRIMUS_TURBO_SM90A)

Status grouped_gemm_bf16_nt_hopper(const void*, const void*, void*, const int64_t*, int64_t,
                                   int64_t, int64_t, int64_t, int, int, void*) noexcept {
  return kBadArgument;
}

#else

namespace {

constexpr int kBM = 128, kBN = 256, kBK = 64;
constexpr int kStages = 4;
constexpr int kThreads = 384;
constexpr int kABytes = kBM * kBK * 2;  // 16 KiB
constexpr int kBBytes = kBN * kBK * 2;  // 32 KiB
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kRingBytes = kStages * kStageBytes;  // 192 KiB
// + alignment slack, the 2 kStages barriers and the group table (int64 row starts and int32
// unit starts, G + 1 each)
constexpr int kMaxSmem = 1024 + kRingBytes + 16 * kStages +
                         static_cast<int>(kGroupedGemmHopperMaxGroups + 1) * 12;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_LOOP:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_LOOP;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Arrive on the barrier at the same shared offset in block `rank` of the cluster (itself too).
// Default (.release.cta) semantics: the arrive only says "done reading this stage" (the reads
// were wgmma's, already waited for); .release.cluster put a MEMBAR.ALL.GPU before every arrive
// and cost 25-30 % (H200 call 11.2).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 r;\nmapa.shared::cluster.u32 r, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [r];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// The same box into the same shared offset of every block in `mask` (and their barriers).
__device__ __forceinline__ void tma_load_multicast(uint32_t dst, const CUtensorMap* map, int c0,
                                                   int c1, uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Not .aligned: the producer warp reaches the final one diverged (only its thread 0 loads).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// Shared-memory matrix descriptor of a K-major tile with 128-byte rows, 128-byte swizzle:
// 8-row core groups 1024 bytes apart (SBO), LBO unused (1).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) |
         (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keep the compiler from moving accumulator reads / writes across an asynchronous wgmma.
__device__ __forceinline__ void fence_acc(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= A * B^T over one k16 step: 64 x 256 fp32 accumulators per warpgroup, both operands
// K-major in shared memory (descriptors); scale_d 0 overwrites d (a tile's first step).
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db,
                                                 int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(scale_d));
}

// Where a unit of work (a tile, or a pair tile with CLUSTER 2) lies.
struct Unit {
  int64_t row0;     // first row of this block's tile
  int64_t row_end;  // end of its group's rows
  int group;
  int n0;           // first column
};

template <int C, int GM>
__device__ __forceinline__ Unit decode(int t, int g, int n_tiles, const int64_t* s_row,
                                       const int* s_unit, uint32_t rank) {
  int lo = 0, hi = g;  // the last group whose first unit is <= t (empty groups skipped)
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (s_unit[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int l = t - s_unit[lo];
  const int64_t start = s_row[lo], end = s_row[lo + 1];
  const int pairs = static_cast<int>(((end - start + kBM - 1) / kBM + C - 1) / C);
  const int band = GM * n_tiles;
  const int first = (l / band) * GM;
  const int gm = min(pairs - first, GM);
  const int r = l % band;
  Unit u;
  u.group = lo;
  u.row0 = start + (static_cast<int64_t>(first + r % gm) * C + rank) * kBM;
  u.row_end = end;
  u.n0 = (r / gm) * kBN;
  return u;
}

// C: cluster size; GM: row tiles (pair tiles) per band; W0: drain every k step's MMAs before
// releasing its stage (else keep one step in flight and release the step before).
template <int C, int GM, bool W0>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_nt_kernel(const __grid_constant__ CUtensorMap map_a,
                           const __grid_constant__ CUtensorMap map_b, pt_bf16* __restrict__ out,
                           const int64_t* __restrict__ offs, int g, int64_t m, int n, int k) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // swizzled tiles need 1024-byte alignment
  uint8_t* const gen = smem_raw + (base - raw);
  const uint32_t bars = base + kRingBytes;  // full[kStages], then empty[kStages]
  int64_t* const s_row = reinterpret_cast<int64_t*>(gen + kRingBytes + 16 * kStages);
  int* const s_unit = reinterpret_cast<int*>(s_row + g + 1);
  const int tid = threadIdx.x;
  const uint32_t rank = C == 2 ? cluster_rank() : 0;
  const int n_tiles = (n + kBN - 1) / kBN;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bars + 8 * s, 1);
      mbar_init(bars + 8 * (kStages + s), 2 * C);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // Group table: row starts (offs clamped to [0, m]) and the prefix sum of units per group.
  for (int i = tid; i <= g; i += kThreads) s_row[i] = min(max(offs[i], int64_t{0}), m);
  __syncthreads();
  if (tid < 32) {
    int carry = 0;
    for (int b = 0; b < g; b += 32) {
      const int i = b + tid;
      int u = 0;
      if (i < g) {
        const int64_t len = max(s_row[i + 1] - s_row[i], int64_t{0});
        u = static_cast<int>(((len + kBM - 1) / kBM + C - 1) / C) * n_tiles;
      }
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, u, o);
        if (tid >= o) u += v;
      }
      if (i < g) s_unit[i + 1] = carry + u;
      carry += __shfl_sync(0xffffffffu, u, 31);
    }
    if (tid == 0) s_unit[0] = 0;
  }
  if (C == 2) {
    cluster_sync();  // barriers initialised in both blocks before any multicast / remote arrive
  } else {
    __syncthreads();
  }
  const int total = s_unit[g];
  const int first_unit = C == 2 ? static_cast<int>(blockIdx.x) / 2 : static_cast<int>(blockIdx.x);
  const int unit_step = C == 2 ? static_cast<int>(gridDim.x) / 2 : static_cast<int>(gridDim.x);
  const int k_steps = (k + kBK - 1) / kBK;

  if (tid < 128) {  // producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (tid == 0) {
      int it = 0;
      for (int t = first_unit; t < total; t += unit_step) {
        const Unit u = decode<C, GM>(t, g, n_tiles, s_row, s_unit, rank);
        const int arow = static_cast<int>(u.row0);
        const int brow = u.group * n + u.n0 + static_cast<int>(rank) * (kBN / C);
        for (int kt = 0; kt < k_steps; ++kt, ++it) {
          const int s = it % kStages;
          const uint32_t phase = (it / kStages) & 1;
          const uint32_t full = bars + 8 * s, empty = bars + 8 * (kStages + s);
          const uint32_t sa = base + s * kABytes;
          const uint32_t sb = base + kStages * kABytes + s * kBBytes;
          mbar_wait(empty, phase ^ 1);
          mbar_expect_tx(full, kStageBytes);
          tma_load(sa, &map_a, kt * kBK, arow, full);
          if (C == 2) {
            tma_load_multicast(sb + rank * (kBBytes / 2), &map_b, kt * kBK, brow, full, 0x3);
          } else {
            tma_load(sb, &map_b, kt * kBK, brow, full);
          }
        }
      }
    }
  } else {  // consumer warpgroups: 64 rows of the tile each
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int c = tid / 128 - 1;
    const int t128 = tid % 128;
    const int warp = t128 / 32, lane = t128 % 32;
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    int it = 0;
    for (int t = first_unit; t < total; t += unit_step) {
      const Unit u = decode<C, GM>(t, g, n_tiles, s_row, s_unit, rank);
      for (int kt = 0; kt < k_steps; ++kt, ++it) {
        const int s = it % kStages;
        const uint32_t phase = (it / kStages) & 1;
        const uint32_t sa = base + s * kABytes + c * (kABytes / 2);
        const uint32_t sb = base + kStages * kABytes + s * kBBytes;
        mbar_wait(bars + 8 * s, phase);
        wgmma_fence();
        fence_acc(acc);
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          wgmma_m64n256k16(acc, smem_desc(sa + kk * 32), smem_desc(sb + kk * 32),
                           (kt | kk) != 0);
        }
        wgmma_commit();
        fence_acc(acc);
        if (W0) {
          wgmma_wait<0>();
        } else {
          wgmma_wait<1>();
        }
        if ((W0 || kt > 0) && t128 == 0) {  // W0: this step's stage is free, else the previous
          const uint32_t empty = bars + 8 * (kStages + (it - (W0 ? 0 : 1)) % kStages);
          if (C == 2) {
            mbar_arrive_cluster(empty, 0);
            mbar_arrive_cluster(empty, 1);
          } else {
            mbar_arrive(empty);
          }
        }
      }
      wgmma_wait<0>();
      fence_acc(acc);
      if (!W0 && t128 == 0) {
        const uint32_t empty = bars + 8 * (kStages + (it - 1) % kStages);
        if (C == 2) {
          mbar_arrive_cluster(empty, 0);
          mbar_arrive_cluster(empty, 1);
        } else {
          mbar_arrive(empty);
        }
      }
      // Epilogue: accumulator (row 16 warp + lane / 4 (+ 8), columns 8 j + 2 (lane % 4) + {0, 1})
      // -> bf16 pairs, rows past the group and columns past N dropped.
      const int64_t r0 = u.row0 + c * 64 + warp * 16 + lane / 4;
      const int64_t end = min(u.row_end, m);
      const int col0 = u.n0 + 2 * (lane % 4);
      pt_bf16* const o0 = out + r0 * n;
      pt_bf16* const o1 = o0 + 8 * static_cast<int64_t>(n);
      const bool ok0 = r0 < end, ok1 = r0 + 8 < end;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int col = col0 + 8 * j;
        if (col < n) {
          if (ok0) {
            *reinterpret_cast<__nv_bfloat162*>(o0 + col) =
                __floats2bfloat162_rn(acc[4 * j], acc[4 * j + 1]);
          }
          if (ok1) {
            *reinterpret_cast<__nv_bfloat162*>(o1 + col) =
                __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
          }
        }
      }
    }
    // Rows past the last group: zeros.
    const int64_t tail0 = s_row[g];
    const int64_t pairs = (m - tail0) * n / 2;
    const int64_t step = static_cast<int64_t>(gridDim.x) * 256;
    __nv_bfloat162* const tail = reinterpret_cast<__nv_bfloat162*>(out + tail0 * n);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + (tid - 128); i < pairs; i += step) {
      tail[i] = __floats2bfloat162_rn(0.f, 0.f);
    }
  }
  if (C == 2) cluster_sync();  // no block leaves while its peer may still write into it
#endif
}

// ---- host --------------------------------------------------------------------------------

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_fn() {
  static EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return static_cast<EncodeTiled>(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A 2-D bf16 row-major [rows, cols] map with boxes of box_rows x 64 columns, 128-byte swizzle.
bool make_map(CUtensorMap* map, const void* ptr, int64_t rows, int64_t cols, int box_rows) {
  const EncodeTiled fn = encode_fn();
  if (fn == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kBK), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  return fn(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims, strides, box,
            elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A launch of `blocks` blocks of kThreads in clusters of `c` (`attr` holds the attribute).
cudaLaunchConfig_t cluster_launch(int c, int blocks, size_t smem, cudaStream_t stream,
                                  cudaLaunchAttribute* attr) {
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = c;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

template <int C, int GM, bool W0>
Status launch(const CUtensorMap& ma, const CUtensorMap& mb, pt_bf16* out, const int64_t* offs,
              int g, int64_t m, int n, int k, int64_t units, size_t smem, bool plain,
              cudaStream_t stream) {
  auto kernel = grouped_gemm_nt_kernel<C, GM, W0>;
  static std::atomic<uint64_t> attr_set{0};  // per instantiation, one bit per device
  int dev = 0;
  PT_RETURN_IF_ERROR(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (!(attr_set.load() & bit)) {
    PT_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            kMaxSmem));
    attr_set.fetch_or(bit);
  }
  // Persistent: every block must be resident at once. Clusters of 2 need two free SMs of one
  // GPC, so fewer than #SMs / 2 of them may fit: ask the occupancy API (once per device).
  static std::atomic<int> resident[64] = {};
  int fit = resident[dev & 63].load();
  if (fit == 0) {
    int sms = 0;
    PT_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    fit = sms;
    if (C > 1) {
      cudaLaunchAttribute qa;
      const cudaLaunchConfig_t q = cluster_launch(C, sms / C * C, kMaxSmem, nullptr, &qa);
      int clusters = 0;
      PT_RETURN_IF_ERROR(cudaOccupancyMaxActiveClusters(&clusters, kernel, &q));
      if (clusters <= 0) return kBadArgument;
      fit = clusters * C;
    }
    resident[dev & 63].store(fit);
  }
  const int blocks = static_cast<int>(std::min<int64_t>(fit / C, units) * C);
  if (C == 1 && plain) {
    kernel<<<blocks, kThreads, smem, stream>>>(ma, mb, out, offs, g, m, n, k);
    PT_RETURN_IF_ERROR(cudaGetLastError());
    return kOk;
  }
  cudaLaunchAttribute at;
  const cudaLaunchConfig_t cfg = cluster_launch(C, blocks, smem, stream, &at);
  PT_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, kernel, ma, mb, out, offs, g, m, n, k));
  return kOk;
}

template <int C>
Status launch_variant(int variant, const CUtensorMap& ma, const CUtensorMap& mb, pt_bf16* out,
                      const int64_t* offs, int g, int64_t m, int n, int k, int64_t units,
                      size_t smem, cudaStream_t stream) {
  const bool plain = variant & 1;
  switch (variant & 6) {
    case 0: return launch<C, 8, false>(ma, mb, out, offs, g, m, n, k, units, smem, plain, stream);
    case 2: return launch<C, 8, true>(ma, mb, out, offs, g, m, n, k, units, smem, plain, stream);
    case 4: return launch<C, 16, false>(ma, mb, out, offs, g, m, n, k, units, smem, plain, stream);
    default: return launch<C, 16, true>(ma, mb, out, offs, g, m, n, k, units, smem, plain, stream);
  }
}

}  // namespace

Status grouped_gemm_bf16_nt_hopper(const void* a, const void* b, void* out, const int64_t* offs,
                                   int64_t m, int64_t n, int64_t k, int64_t g, int cluster,
                                   int variant, void* stream) noexcept {
  constexpr int64_t kLimit = (int64_t{1} << 31) - 1;
  if (m < 0 || n <= 0 || k <= 0 || g <= 0 || g > kGroupedGemmHopperMaxGroups || n % 8 ||
      k % 8 || m > kLimit - 2 * kBM || g * n > kLimit || (cluster != 1 && cluster != 2) || variant < 0 || variant > 7) {
    return kBadArgument;
  }
  if ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
       reinterpret_cast<uintptr_t>(out)) % 16) {
    return kBadArgument;
  }
  if (m == 0) return kOk;
  CUtensorMap ma, mb;
  if (!make_map(&ma, a, m, k, kBM) || !make_map(&mb, b, g * n, k, kBN / cluster)) {
    return kBadArgument;
  }
  // Units are at most (row tiles of all groups / cluster + one per group) x column tiles.
  const int64_t n_tiles = (n + kBN - 1) / kBN;
  const int64_t units = ((m + kBM - 1) / kBM / cluster + g) * n_tiles;
  const size_t smem = 1024 + kRingBytes + 16 * kStages + (g + 1) * 12;
  auto* o = static_cast<pt_bf16*>(out);
  auto* s = static_cast<cudaStream_t>(stream);
  const int gi = static_cast<int>(g), ni = static_cast<int>(n), ki = static_cast<int>(k);
  return cluster == 2 ? launch_variant<2>(variant, ma, mb, o, offs, gi, m, ni, ki, units, smem, s)
                      : launch_variant<1>(variant, ma, mb, o, offs, gi, m, ni, ki, units, smem, s);
}

#endif  // PT_HIP || !PRIMUS_TURBO_SM90A

}  // namespace primus_turbo
