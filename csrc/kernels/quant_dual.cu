// Dual-output FP8 quantization of a bf16 matrix on NVIDIA, 1 x 128 blocks: q (along rows) and
// qt = x.T quantized along M, in one pass ("cast-transpose"; recipe and layouts in
// primus_turbo/quant_dual.h).
//
// Variant p (the default is t: see Variants below). Persistent blocks of 256 threads (2 per SM)
// walk the 128 x 128 tiles of x; the next tile's loads (cp.async into a second shared stage) are
// in flight while the current one is processed.
// Thread t owns the 8 columns 8 * (t % 16) .. +7 of the 4 rows 4 * (t / 16) .. +3 in each of two
// 64-row passes (8 vectors of 16 bytes). Amax is taken on the bf16 bit patterns (|x| = bits &
// 0x7fff, a monotone key; two values per 32-bit word with __vmaxu2); only a thread that saw an
// inf/NaN key redoes its maxima with the finite filter. Row blocks reduce with shuffles inside
// 16 lanes, column blocks through a 2 KB shared array. The row copy is stored straight from
// registers (8 bytes per row and thread). For the column copy each thread converts its 4 rows x
// 8 columns with the column scales, packs the 4 bytes of one column (4 consecutive rows) into a
// 32-bit word, and writes the words into a 16 KB shared tile holding qt's 128 x 128 bytes (XOR
// swizzle: the 32 lanes of a warp hit 32 banks); the tile is read back along M with 16-byte loads
// and stored as 16-byte rows of qt. Needs sm_89+ (fp8 conversions; other archs compile an empty
// kernel and the Python gate never calls it there). ROCm builds skip the kernel (AMD keeps the
// Triton kernels). Nothing here throws.
// Variants (`variant` of quant_dual_fp8_gpu, PRIMUS_TURBO_QUANT_CUDA_B128; same bits): 1 = `t`,
// the Python default since session 9 round 2 (after quant_dual_mx.cu's a: one tile per block won
// there): one 128 x 128 tile per 256-thread block, 3 blocks per SM (80 registers, 0 spill), 8 warp
// tiles of 32 x 64 (see quant_dual_tile_kernel); H200 call 9.1 (graph, two interleaved repeats,
// 8192/6144/4096/28672 x 4096): 0.918 of copy geomean, every shape 0.91-0.93; call 9.2: 0.916.
// 0 = `p`, the persistent kernel above (the default until then and the op's default argument;
// 0.854 in the same A/B, 28672: 0.823; call 9.2: 0.853); t indexes rows and columns in 32 bits, so
// M or N > 0x7fffff00 is refused (kBadArgument) and the Python gate sends such inputs to p.
// (t at 4 blocks per SM, 64 registers with the row multipliers re-read from shared memory, tied t
// in call 9.2, 0.918, and was removed.)
#include <algorithm>
#include <atomic>

#include "primus_turbo/device.h"
#include "primus_turbo/quant_dual.h"

namespace primus_turbo {

#if PT_HIP

bool quant_dual_gpu_available() noexcept { return false; }

Status quant_dual_fp8_gpu(const void*, void*, void*, void*, void*, int64_t, int64_t, bool, float,
                          int, void*) noexcept {
  return kBadArgument;
}

#else

namespace {

constexpr int kTile = 128;  // rows and columns of a tile
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
constexpr uint32_t kInfKey = 0x7f80u;  // |bf16| bit patterns >= this are inf or NaN
constexpr int kStageSmem = 2 * 8 * kThreads * 16;  // two stages of the bf16 tile (dynamic smem)

// Triton's fp32 division (checked in its sm_90 PTX): div.full.f32, not the IEEE div.rn.
__device__ __forceinline__ float div_full(float a, float b) {
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

#include "primus_turbo/fp8_convert.cuh"  // cvt2, bf_lo, bf_hi

// |x| keys of two bf16 values; FINITE: inf/NaN keys become 0 (excluded from amax).
template <bool FINITE>
__device__ __forceinline__ uint32_t abs_key2(uint32_t w) {
  w &= 0x7fff7fffu;
  if (FINITE) {
    const uint32_t lo = w & 0xffffu, hi = w >> 16;
    w = (lo < kInfKey ? lo : 0u) | ((hi < kInfKey ? hi : 0u) << 16);
  }
  return w;
}

// Per-thread maxima: rpk[2 p + j / 2] holds rows (p, j) and (p, j + 1) as u16x2 keys, cmx[i]
// columns 2i and 2i + 1 over all 8 rows.
template <bool FINITE>
__device__ __forceinline__ void thread_amax(const uint32_t (&d)[2][4][4], uint32_t (&rpk)[4],
                                            uint32_t (&cmx)[4]) {
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    uint32_t row[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t a[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = abs_key2<FINITE>(d[p][j][i]);
        cmx[i] = (p == 0 && j == 0) ? a[i] : __vmaxu2(cmx[i], a[i]);
      }
      const uint32_t r = __vmaxu2(__vmaxu2(a[0], a[1]), __vmaxu2(a[2], a[3]));
      row[j] = max(r & 0xffffu, r >> 16);
    }
    rpk[2 * p] = row[0] | (row[1] << 16);
    rpk[2 * p + 1] = row[2] | (row[3] << 16);
  }
}

// Multiplier fmax / max(amax, 1e-12) of a block whose amax key is `key` (bf16 bits of the
// finite amax), and the stored scale_inv = 1 / multiplier (both div.full, as Triton).
__device__ __forceinline__ float scale_of(uint32_t key, float fmax, float* inv) {
  const float scale = div_full(fmax, fmaxf(__uint_as_float(key << 16), 1e-12f));
  *inv = div_full(1.0f, scale);
  return scale;
}

// Everything after the loads of one tile: d holds the thread's 2 passes x 4 rows x 8 columns
// (zeros outside x). tsm / csm: the block's shared arrays (see the kernel).
template <bool E5M2>
__device__ __forceinline__ void tile_body(const uint32_t (&d)[2][4][4], uint32_t* tsm,
                                          uint4 (*csm)[16], uint8_t* __restrict__ q,
                                          float* __restrict__ s, uint8_t* __restrict__ qt,
                                          float* __restrict__ st, int64_t M, int64_t N,
                                          int64_t m0, int64_t n0, float fmax) {
  const int t = threadIdx.x;
  const int cv = t & 15, rg = t >> 4, warp = t >> 5, lane = t & 31;
  const int64_t col = n0 + 8 * cv;
  const bool col_ok = col < N;  // N % 8 == 0: a vector is wholly in or out

  uint32_t rpk[4], cmx[4];
  thread_amax<false>(d, rpk, cmx);
  {
    const uint32_t top = __vmaxu2(__vmaxu2(rpk[0], rpk[1]), __vmaxu2(rpk[2], rpk[3]));
    if (max(top & 0xffffu, top >> 16) >= kInfKey) thread_amax<true>(d, rpk, cmx);
  }

  // column partials: the two row groups of a warp (lanes l and l + 16), then shared memory
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    cmx[i] = __vmaxu2(cmx[i], __shfl_xor_sync(0xffffffffu, cmx[i], 16));
  }
  if (lane < 16) csm[warp][cv] = make_uint4(cmx[0], cmx[1], cmx[2], cmx[3]);

  // row blocks: 128 columns = 16 lanes
#pragma unroll
  for (int off = 1; off < 16; off <<= 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      rpk[i] = __vmaxu2(rpk[i], __shfl_xor_sync(0xffffffffu, rpk[i], off));
    }
  }

  // row copy: scale, convert, 8 bytes per row; lane cv == j writes row j's scale
#pragma unroll
  for (int p = 0; p < 2; ++p) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t row = m0 + p * 64 + rg * 4 + j;
      const uint32_t key = (rpk[2 * p + j / 2] >> (16 * (j & 1))) & 0xffffu;
      float inv = 0.f;
      const float sc = scale_of(key, fmax, &inv);
      uint32_t b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        b[i] = cvt2<E5M2>(bf_lo(d[p][j][i]) * sc, bf_hi(d[p][j][i]) * sc);
      }
      if (col_ok && row < M) {
        *reinterpret_cast<uint2*>(q + row * N + col) =
            make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
      }
      // lanes 0..3 hold the block's scale even where their own columns are past N
      if (cv == j && row < M) s[(n0 / kTile) * M + row] = inv;
    }
  }
  __syncthreads();

  // column blocks: combine the 8 warps' partials (128 rows)
  float csc[8];
  {
    uint32_t c[4];
#pragma unroll
    for (int k = 0; k < kWarps; ++k) {
      const uint4 u = csm[k][cv];
      c[0] = k == 0 ? u.x : __vmaxu2(c[0], u.x);
      c[1] = k == 0 ? u.y : __vmaxu2(c[1], u.y);
      c[2] = k == 0 ? u.z : __vmaxu2(c[2], u.z);
      c[3] = k == 0 ? u.w : __vmaxu2(c[3], u.w);
    }
    float inv[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      csc[k] = scale_of((c[k / 2] >> (16 * (k & 1))) & 0xffffu, fmax, &inv[k]);
    }
    if (rg == 0 && col_ok) {
      float4* dst = reinterpret_cast<float4*>(st + (m0 / kTile) * N + col);
      dst[0] = make_float4(inv[0], inv[1], inv[2], inv[3]);
      dst[1] = make_float4(inv[4], inv[5], inv[6], inv[7]);
    }
  }

  // column copy: 4 rows of one column -> one word; word (n = 8 cv + k, m-word p * 16 + rg) at
  // tsm[n * 32 + ((p * 16 + rg) ^ (cv << 1))]
#pragma unroll
  for (int p = 0; p < 2; ++p) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float f[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t w = d[p][j][k / 2];
        f[j] = ((k & 1) ? bf_hi(w) : bf_lo(w)) * csc[k];
      }
      const uint32_t word = cvt2<E5M2>(f[0], f[1]) | (cvt2<E5M2>(f[2], f[3]) << 16);
      tsm[(8 * cv + k) * 32 + ((p * 16 + rg) ^ (cv << 1))] = word;
    }
  }
  __syncthreads();

  // qt rows: 128 rows (n) x 8 chunks of 16 bytes (m); 4 chunks per thread
  const bool full_m = (M % 16) == 0 && m0 + kTile <= M;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int idx = r * kThreads + t;
    const int nl = idx >> 3, qc = idx & 7;
    const int swz = ((nl >> 3) & 15) << 1;
    const uint4 ph = *reinterpret_cast<const uint4*>(&tsm[nl * 32 + ((4 * qc) ^ (swz & 28))]);
    const uint4 u = (swz & 2) ? make_uint4(ph.z, ph.w, ph.x, ph.y) : ph;
    const int64_t nrow = n0 + nl;
    if (nrow >= N) continue;
    const int64_t mc = m0 + 16 * qc;
    uint8_t* dst = qt + nrow * M + mc;
    if (full_m) {
      *reinterpret_cast<uint4*>(dst) = u;
    } else {
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int b = 0; b < 16; ++b) {
        if (mc + b < M) dst[b] = static_cast<uint8_t>(w[b / 4] >> (8 * (b & 3)));
      }
    }
  }
}

// The thread's 8 vectors of tile `tile` into its own slots of `stg` (slot k at stg[k * 256 + t]:
// conflict-free, and no other thread reads them), zero-filled outside x; one cp.async group.
__device__ __forceinline__ void issue_tile(uint4* stg, const uint16_t* x, int64_t M, int64_t N,
                                           int tiles_n, int tile) {
  const int t = threadIdx.x;
  const int cv = t & 15, rg = t >> 4;
  const int64_t m0 = static_cast<int64_t>(tile / tiles_n) * kTile;
  const int64_t col = static_cast<int64_t>(tile % tiles_n) * kTile + 8 * cv;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int64_t row = m0 + (k >> 2) * 64 + rg * 4 + (k & 3);
    const bool ok = col < N && row < M;
    const uint16_t* src = ok ? x + row * N + col : x;
    const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(stg + k * kThreads + t));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(ok ? 16 : 0));
  }
  asm volatile("cp.async.commit_group;\n" ::);
}

// Persistent blocks (2 per SM) walking tiles blockIdx.x, + gridDim.x, ...
template <bool E5M2>
__global__ void __launch_bounds__(kThreads, 2)
    quant_dual_kernel(const uint16_t* __restrict__ x, uint8_t* __restrict__ q,
                      float* __restrict__ s, uint8_t* __restrict__ qt, float* __restrict__ st,
                      int64_t M, int64_t N, int tiles_n, int tiles, float fmax) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  extern __shared__ uint4 stage[];  // [2][8][kThreads]
  __shared__ uint32_t tsm[kTile * kTile / 4];  // qt tile: 128 rows (n) x 32 words (4 m each)
  __shared__ uint4 csm[kWarps][16];  // column key partials [warp][cv]
  const int t = threadIdx.x;
  int tile = blockIdx.x;
  if (tile < tiles) issue_tile(stage, x, M, N, tiles_n, tile);
  for (int i = 0; tile < tiles; ++i, tile += gridDim.x) {
    const int next = tile + gridDim.x;
    if (next < tiles) {
      issue_tile(stage + ((i + 1) & 1) * 8 * kThreads, x, M, N, tiles_n, next);
    } else {
      asm volatile("cp.async.commit_group;\n" ::);
    }
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    const uint4* cur = stage + (i & 1) * 8 * kThreads;
    uint32_t d[2][4][4];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint4 u = cur[k * kThreads + t];
      d[k >> 2][k & 3][0] = u.x;
      d[k >> 2][k & 3][1] = u.y;
      d[k >> 2][k & 3][2] = u.z;
      d[k >> 2][k & 3][3] = u.w;
    }
    const int64_t m0 = static_cast<int64_t>(tile / tiles_n) * kTile;
    const int64_t n0 = static_cast<int64_t>(tile % tiles_n) * kTile;
    tile_body<E5M2>(d, tsm, csm, q, s, qt, st, M, N, m0, n0, fmax);
  }
#endif
}

// ---- Variant t (PRIMUS_TURBO_QUANT_CUDA_B128=t): one 128 x 128 tile per 256-thread block, no
// persistence (the structure of quant_dual_mx.cu's a). 8 warp tiles of 32 rows x 64 columns (wm =
// warp % 4 along M, wn = warp / 4 along N); lane (rq = lane / 8, cv = lane % 8) holds the 8
// consecutive rows 32 wm + 8 rq .. +7 of the 8 columns 64 wn + 8 cv .. +7 (8 loads of 16 bytes).
// A row block (128 columns) spans 2 warps and a column block (128 rows) 4: per-row maxima reduce
// over the 8 lanes of a cv group (3 shuffle steps), per-column maxima over the 4 lanes of one cv
// (2 steps), then both partials meet in 1.5 KB of shared memory (barrier 1); thread t computes
// the multiplier and the stored inverse of row t (t < 128) or column t - 128 (coalesced stores
// of s / st) and publishes the multiplier in shared memory (barrier 2). Both copies then come
// from one walk over the thread's column pairs: a column's 8 rows are 8 consecutive bytes of a
// qt row, stored straight from registers (4 lanes fill a 32-byte sector; no shared qt tile), and
// the row bytes collect in registers and leave as 8 bytes per row. Same keys, scale math and
// conversions as the persistent kernel: bitwise identical outputs.

__device__ __forceinline__ uint32_t pick4(const uint32_t (&a)[4], int i) {
  return i == 0 ? a[0] : i == 1 ? a[1] : i == 2 ? a[2] : a[3];
}

// p, hidden from the optimizer (keeps it from precomputing a loop's 64-bit addresses at once).
__device__ __forceinline__ uint8_t* opaque(uint8_t* p) {
  asm volatile("" : "+l"(p));
  return p;
}

template <bool E5M2>
__global__ void __launch_bounds__(kThreads, 3)
    quant_dual_tile_kernel(const uint16_t* __restrict__ x, uint8_t* __restrict__ q,
                           float* __restrict__ s, uint8_t* __restrict__ qt,
                           float* __restrict__ st, int M, int N, int tiles_n, float fmax) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  __shared__ uint32_t rsm[2][kTile / 2];  // row keys (u16x2 per row pair) [wn][row / 2]
  __shared__ uint32_t csm[4][kTile / 2];  // column keys (u16x2 per column pair) [wm][col / 2]
  __shared__ __align__(16) float ssc[2 * kTile];  // multipliers: rows 0..127, columns 128..255
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  const int wm = warp & 3, wn = warp >> 2, rq = lane >> 3, cv = lane & 7;
  const int m0 = static_cast<int>(blockIdx.x / tiles_n) * kTile;  // 32-bit rows / columns
  const int n0 = static_cast<int>(blockIdx.x % tiles_n) * kTile;  // (64-bit offsets)
  const int lr = 32 * wm + 8 * rq, lc = 64 * wn + 8 * cv;  // first row / column in the tile
  const int row0 = m0 + lr, col = n0 + lc;
  const bool col_ok = col < N;  // N % 8 == 0: a vector is wholly in or out

  uint32_t d[8][4];
  load_lane_rows8(d, x, M, N, row0, col);

  uint32_t rk[4], cm[4];
  lane_amax<abs_key2<false>, 8>(d, rk, cm);
  {
    const uint32_t top = __vmaxu2(__vmaxu2(cm[0], cm[1]), __vmaxu2(cm[2], cm[3]));
    if (max(top & 0xffffu, top >> 16) >= kInfKey) lane_amax<abs_key2<true>, 8>(d, rk, cm);
  }
  // rows: the 8 lanes of one rq (cv); columns: the 4 lanes of one cv (rq)
#pragma unroll
  for (int off = 1; off < 8; off <<= 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) rk[i] = __vmaxu2(rk[i], __shfl_xor_sync(0xffffffffu, rk[i], off));
  }
#pragma unroll
  for (int off = 8; off < 32; off <<= 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) cm[i] = __vmaxu2(cm[i], __shfl_xor_sync(0xffffffffu, cm[i], off));
  }
  // lane cv = c < 4 writes row pair (2c, 2c + 1) of its 8 rows; lane rq = r column pair (2r, 2r + 1)
  if (cv < 4) rsm[wn][lr / 2 + cv] = pick4(rk, cv);
  csm[wm][lc / 2 + rq] = pick4(cm, rq);
  __syncthreads();

  {
    uint32_t key;
    if (t < kTile) {
      const uint32_t a = __vmaxu2(rsm[0][t >> 1], rsm[1][t >> 1]);
      key = (a >> (16 * (t & 1))) & 0xffffu;
    } else {
      const int c = t - kTile;
      const uint32_t a = __vmaxu2(__vmaxu2(csm[0][c >> 1], csm[1][c >> 1]),
                                  __vmaxu2(csm[2][c >> 1], csm[3][c >> 1]));
      key = (a >> (16 * (c & 1))) & 0xffffu;
    }
    float inv = 0.f;
    ssc[t] = scale_of(key, fmax, &inv);
    if (t < kTile) {
      if (m0 + t < M) s[int64_t{n0 / kTile} * M + m0 + t] = inv;
    } else if (n0 + (t - kTile) < N) {
      st[int64_t{m0 / kTile} * N + n0 + (t - kTile)] = inv;
    }
  }
  __syncthreads();

  // One walk over the 4 words (column pairs 2i, 2i + 1), each value unpacked once; the row bytes
  // collect in ra (row j: ra[j][0] columns 0..3, ra[j][1] columns 4..7) and leave at the end.
  const bool full_m = (M % 8) == 0 && row0 + 8 <= M;
  uint8_t* qp = q + int64_t{row0} * N + col;
  uint32_t ra[8][2];
  float rs[8];
  {
    const float4 a = *reinterpret_cast<const float4*>(&ssc[lr]);
    const float4 b = *reinterpret_cast<const float4*>(&ssc[lr + 4]);
    rs[0] = a.x, rs[1] = a.y, rs[2] = a.z, rs[3] = a.w;
    rs[4] = b.x, rs[5] = b.y, rs[6] = b.z, rs[7] = b.w;
  }
  uint8_t* tp = qt + int64_t{col} * M + row0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 cs = *reinterpret_cast<const float2*>(&ssc[kTile + lc + 2 * i]);
    uint32_t tl[4], th[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const uint32_t w0 = d[2 * p][i], w1 = d[2 * p + 1][i];
      const float a0 = bf_lo(w0), b0 = bf_hi(w0), a1 = bf_lo(w1), b1 = bf_hi(w1);
      tl[p] = cvt2<E5M2>(a0 * cs.x, a1 * cs.x);
      th[p] = cvt2<E5M2>(b0 * cs.y, b1 * cs.y);
      const float2 rp = make_float2(rs[2 * p], rs[2 * p + 1]);
      const uint32_t r0 = cvt2<E5M2>(a0 * rp.x, b0 * rp.x);
      const uint32_t r1 = cvt2<E5M2>(a1 * rp.y, b1 * rp.y);
      put_row_pair(ra, p, i, r0, r1);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t(&b)[4] = h ? th : tl;
      if (col_ok) {
        if (full_m) {
          *reinterpret_cast<uint2*>(tp) = make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            if (row0 + e < M) tp[e] = static_cast<uint8_t>(b[e / 2] >> (8 * (e & 1)));
          }
        }
      }
      tp = opaque(tp + M);
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (col_ok && row0 + j < M) *reinterpret_cast<uint2*>(qp) = make_uint2(ra[j][0], ra[j][1]);
    qp = opaque(qp + N);
  }
#endif
}

template <bool E5M2>
Status launch(const void* x, void* q, void* s, void* qt, void* st, int64_t m, int64_t n,
              float fmax, int variant, cudaStream_t stream) {
  const int64_t tiles_m = (m + kTile - 1) / kTile, tiles_n = (n + kTile - 1) / kTile;
  const int64_t tiles = tiles_m * tiles_n;
  if (tiles > 0x7fffffff) return kBadArgument;
  if (variant == 1) {  // t: one tile per block, 3 blocks per SM
    if (m > 0x7fffff00 || n > 0x7fffff00) return kBadArgument;  // 32-bit rows / columns
    quant_dual_tile_kernel<E5M2><<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(x), static_cast<uint8_t*>(q), static_cast<float*>(s),
        static_cast<uint8_t*>(qt), static_cast<float*>(st), static_cast<int>(m),
        static_cast<int>(n), static_cast<int>(tiles_n), fmax);
    PT_RETURN_LAUNCH_STATUS();
    return kOk;
  }
  auto* kern = quant_dual_kernel<E5M2>;  // 64 KB dynamic + 18 KB static shared memory
  // the opt-in once per device and instantiation (not again inside a CUDA graph capture)
  static std::atomic<bool> smem_set[64];
  int dev = 0;
  PT_RETURN_IF_ERROR(ptGetDevice(&dev));
  if (dev < 0 || dev >= 64 || !smem_set[dev].load(std::memory_order_relaxed)) {
    PT_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kStageSmem));
    if (dev >= 0 && dev < 64) smem_set[dev].store(true, std::memory_order_relaxed);
  }
  int sms = 1;
  const Status st_sm = device_sm_count(&sms);
  if (st_sm != kOk) return st_sm;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(tiles, 2 * int64_t{sms}));
  kern<<<blocks, kThreads, kStageSmem, stream>>>(
      static_cast<const uint16_t*>(x), static_cast<uint8_t*>(q), static_cast<float*>(s),
      static_cast<uint8_t*>(qt), static_cast<float*>(st), m, n, static_cast<int>(tiles_n),
      static_cast<int>(tiles), fmax);
  PT_RETURN_LAUNCH_STATUS();
  return kOk;
}

}  // namespace

bool quant_dual_gpu_available() noexcept { return true; }

Status quant_dual_fp8_gpu(const void* x, void* q, void* s, void* qt, void* st, int64_t m,
                          int64_t n, bool e5m2, float fmax, int variant, void* stream) noexcept {
  if (m < 0 || n < 0 || n % 8 != 0 || variant < 0 || variant > 1) return kBadArgument;
  if (m == 0 || n == 0) return kOk;
  auto* cs = static_cast<cudaStream_t>(stream);
  return e5m2 ? launch<true>(x, q, s, qt, st, m, n, fmax, variant, cs)
              : launch<false>(x, q, s, qt, st, m, n, fmax, variant, cs);
}

#endif  // PT_HIP

}  // namespace primus_turbo
