// Dual-output FP8 quantization of a bf16 matrix on NVIDIA: q (along rows) and qt = x.T quantized
// along M, in one pass ("cast-transpose"; recipes and layouts in primus_turbo/quant_dual.h).
//
// One block of 256 threads per 128 x 128 tile of x. Thread t owns the 8 columns 8 * (t % 16) ..
// +7 of the 4 rows 4 * (t / 16) .. +3 in each of two 64-row passes: 8 loads of 16 bytes, all
// issued before any math. Amax is taken on the bf16 bit patterns (|x| = bits & 0x7fff, a
// monotone key; two values per 32-bit word with __vmaxu2); only a thread that saw an inf/NaN
// key redoes its maxima with the finite filter. Row blocks (128 or 32 columns) reduce with
// shuffles inside 16 or 4 lanes; column blocks (128 or 32 rows) through a 4 KB shared array.
// The row copy is stored straight from registers (8 bytes per row and thread). For the column
// copy each thread converts its 4 rows x 8 columns with the column scales, packs the 4 bytes of
// one column (4 consecutive rows) into a 32-bit word, and writes the words into a 16 KB shared
// tile holding qt's 128 x 128 bytes (XOR swizzle: the 32 lanes of a warp hit 32 banks); the tile
// is read back along M with 16-byte loads and stored as 16-byte rows of qt. ROCm builds skip the
// kernel (AMD keeps the Triton kernels). Nothing here throws.
#include <algorithm>
#include <atomic>

#include "primus_turbo/device.h"
#include "primus_turbo/quant_dual.h"

namespace primus_turbo {

#if PT_HIP

bool quant_dual_gpu_available() noexcept { return false; }

Status quant_dual_fp8_gpu(const void*, void*, void*, void*, void*, int64_t, int64_t, bool, bool,
                          float, int, int, void*) noexcept {
  return kBadArgument;
}

#else

namespace {

constexpr int kTile = 128;  // rows and columns of a block's tile
constexpr int kThreads = 256;
constexpr uint32_t kInfKey = 0x7f80u;  // |bf16| bit patterns >= this are inf or NaN

// Triton's fp32 division (checked in its sm_90 PTX): div.full.f32, not the IEEE div.rn.
__device__ __forceinline__ float div_full(float a, float b) {
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// Two fp32 -> two fp8 bytes (lo in the low byte), round to nearest even, finite values and inf
// saturated to +-max, NaN kept: the conversion Triton emits on sm_89+.
template <bool E5M2>
__device__ __forceinline__ uint32_t cvt2(float lo, float hi) {
  unsigned short r;
  if (E5M2) {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

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

// Per-thread maxima: rpk[2 p + j / 2] holds rows (p, j) and (p, j + 1) as u16x2 keys, cmx[p][i]
// columns 2i and 2i + 1 over the 4 rows of pass p.
template <bool FINITE>
__device__ __forceinline__ void thread_amax(const uint32_t (&d)[2][4][4], uint32_t (&rpk)[4],
                                            uint32_t (&cmx)[2][4]) {
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    uint32_t row[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t a[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = abs_key2<FINITE>(d[p][j][i]);
        cmx[p][i] = j == 0 ? a[i] : __vmaxu2(cmx[p][i], a[i]);
      }
      const uint32_t r = __vmaxu2(__vmaxu2(a[0], a[1]), __vmaxu2(a[2], a[3]));
      row[j] = max(r & 0xffffu, r >> 16);
    }
    rpk[2 * p] = row[0] | (row[1] << 16);
    rpk[2 * p + 1] = row[2] | (row[3] << 16);
  }
}

// (multiplier, stored scale) of a block whose amax key is `key` (bf16 bits of the finite amax).
template <bool MX>
__device__ __forceinline__ float scale_of(uint32_t key, float fmax, int emax, uint32_t* e8m0,
                                          float* inv) {
  if (MX) {
    // expfield(max(amax, 2^-126)) - emax, clamped to [0, 254]; scale 2^(127 - byte) from bits
    const int ef = max(static_cast<int>(key >> 7), 1);
    const int eb = min(max(ef - emax, 0), 254);
    *e8m0 = static_cast<uint32_t>(eb);
    return __uint_as_float(static_cast<uint32_t>(254 - eb) << 23);
  }
  const float scale = div_full(fmax, fmaxf(__uint_as_float(key << 16), 1e-12f));
  *inv = div_full(1.0f, scale);
  return scale;
}

// Everything after the loads of one tile: d holds the thread's 2 passes x 4 rows x 8 columns
// (zeros outside x). tsm / csm: the block's shared arrays (see the kernels).
template <bool MX, bool E5M2>
__device__ __forceinline__ void tile_body(const uint32_t (&d)[2][4][4], uint32_t* tsm,
                                          uint4 (*csm)[kThreads / kWarpSize][16],
                                          uint8_t* __restrict__ q, void* __restrict__ s_out,
                                          uint8_t* __restrict__ qt, void* __restrict__ st_out,
                                          int64_t M, int64_t N, int64_t m0, int64_t n0,
                                          float fmax, int emax) {
  const int t = threadIdx.x;
  const int cv = t & 15, rg = t >> 4, warp = t >> 5, lane = t & 31;
  const int64_t col = n0 + 8 * cv;
  const bool col_ok = col < N;  // N % 8 == 0: a vector is wholly in or out

  uint32_t rpk[4], cmx[2][4];
  thread_amax<false>(d, rpk, cmx);
  {
    const uint32_t top = __vmaxu2(__vmaxu2(rpk[0], rpk[1]), __vmaxu2(rpk[2], rpk[3]));
    if (max(top & 0xffffu, top >> 16) >= kInfKey) thread_amax<true>(d, rpk, cmx);
  }

  // column partials: the two row groups of a warp (lanes l and l + 16), then shared memory
  if (MX) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        cmx[p][i] = __vmaxu2(cmx[p][i], __shfl_xor_sync(0xffffffffu, cmx[p][i], 16));
      }
      if (lane < 16) csm[p][warp][cv] = make_uint4(cmx[p][0], cmx[p][1], cmx[p][2], cmx[p][3]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      cmx[0][i] = __vmaxu2(cmx[0][i], cmx[1][i]);
      cmx[0][i] = __vmaxu2(cmx[0][i], __shfl_xor_sync(0xffffffffu, cmx[0][i], 16));
    }
    if (lane < 16) csm[0][warp][cv] = make_uint4(cmx[0][0], cmx[0][1], cmx[0][2], cmx[0][3]);
  }

  // row blocks: 128 columns = 16 lanes, 32 columns = 4 lanes
#pragma unroll
  for (int off = 1; off < (MX ? 4 : 16); off <<= 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      rpk[i] = __vmaxu2(rpk[i], __shfl_xor_sync(0xffffffffu, rpk[i], off));
    }
  }

  // row copy: scale, convert, 8 bytes per row; lane cv % 4 == j (MX) / cv == j writes row j's scale
#pragma unroll
  for (int p = 0; p < 2; ++p) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t row = m0 + p * 64 + rg * 4 + j;
      const uint32_t key = (rpk[2 * p + j / 2] >> (16 * (j & 1))) & 0xffffu;
      uint32_t e8 = 0;
      float inv = 0.f;
      const float sc = scale_of<MX>(key, fmax, emax, &e8, &inv);
      uint32_t b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        b[i] = cvt2<E5M2>(bf_lo(d[p][j][i]) * sc, bf_hi(d[p][j][i]) * sc);
      }
      if (col_ok && row < M) {
        *reinterpret_cast<uint2*>(q + row * N + col) =
            make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
        // MX: N % 32 == 0, so the 4 lanes of a 32-column group are all in or all out
        if (MX && (cv & 3) == j) static_cast<uint8_t*>(s_out)[row * (N / 32) + col / 32] = e8;
      }
      // 1x128: lanes 0..3 hold the block's scale even where their own columns are past N
      if (!MX && cv == j && row < M) static_cast<float*>(s_out)[(n0 / kTile) * M + row] = inv;
    }
  }
  __syncthreads();

  // column blocks: combine the warps' partials (128 rows: all 8 warps; 32 rows: 4 warps of a pass)
  float csc[2][8];
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    if (!MX && p == 1) break;
    uint32_t c[4];
    const int w0 = MX ? (warp & 4) : 0;
#pragma unroll
    for (int k = 0; k < (MX ? 4 : 8); ++k) {
      const uint4 u = csm[p][w0 + k][cv];
      c[0] = k == 0 ? u.x : __vmaxu2(c[0], u.x);
      c[1] = k == 0 ? u.y : __vmaxu2(c[1], u.y);
      c[2] = k == 0 ? u.z : __vmaxu2(c[2], u.z);
      c[3] = k == 0 ? u.w : __vmaxu2(c[3], u.w);
    }
    uint32_t e8[8];
    float inv[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t key = (c[k / 2] >> (16 * (k & 1))) & 0xffffu;
      e8[k] = 0;
      inv[k] = 0.f;
      csc[p][k] = scale_of<MX>(key, fmax, emax, &e8[k], &inv[k]);
    }
    if (MX) {
      const int64_t grp = m0 / 32 + 2 * p + (warp >> 2);
      if ((rg & 7) == 0 && col_ok && grp * 32 < M) {
        uint8_t* st = static_cast<uint8_t*>(st_out);
#pragma unroll
        for (int k = 0; k < 8; ++k) st[(col + k) * (M / 32) + grp] = static_cast<uint8_t>(e8[k]);
      }
    } else if (rg == 0 && col_ok) {
      float4* st = reinterpret_cast<float4*>(static_cast<float*>(st_out) + (m0 / kTile) * N + col);
      st[0] = make_float4(inv[0], inv[1], inv[2], inv[3]);
      st[1] = make_float4(inv[4], inv[5], inv[6], inv[7]);
    }
  }

  // column copy: 4 rows of one column -> one word; word (n = 8 cv + k, m-word p * 16 + rg) at
  // tsm[n * 32 + ((p * 16 + rg) ^ (cv << 1))]
#pragma unroll
  for (int p = 0; p < 2; ++p) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float sc = csc[MX ? p : 0][k];
      float f[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t w = d[p][j][k / 2];
        f[j] = ((k & 1) ? bf_hi(w) : bf_lo(w)) * sc;
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

// One block per tile: the thread's 8 loads of 16 bytes, then the tile.
template <bool MX, bool E5M2, int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    quant_dual_kernel(const uint16_t* __restrict__ x, uint8_t* __restrict__ q,
                      void* __restrict__ s_out, uint8_t* __restrict__ qt,
                      void* __restrict__ st_out, int64_t M, int64_t N, int tiles_n, float fmax,
                      int emax) {
  __shared__ uint32_t tsm[kTile * kTile / 4];  // qt tile: 128 rows (n) x 32 words (4 m each)
  __shared__ uint4 csm[2][kThreads / kWarpSize][16];  // column key partials [pass][warp][cv]
  const int t = threadIdx.x;
  const int cv = t & 15, rg = t >> 4;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x / tiles_n) * kTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x % tiles_n) * kTile;
  const int64_t col = n0 + 8 * cv;
  const bool col_ok = col < N;
  uint32_t d[2][4][4];
#pragma unroll
  for (int p = 0; p < 2; ++p) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t row = m0 + p * 64 + rg * 4 + j;
      uint4 u = make_uint4(0u, 0u, 0u, 0u);
      if (col_ok && row < M) u = __ldg(reinterpret_cast<const uint4*>(x + row * N + col));
      d[p][j][0] = u.x;
      d[p][j][1] = u.y;
      d[p][j][2] = u.z;
      d[p][j][3] = u.w;
    }
  }
  tile_body<MX, E5M2>(d, tsm, csm, q, s_out, qt, st_out, M, N, m0, n0, fmax, emax);
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

constexpr int kPipeSmem = 2 * 8 * kThreads * 16;  // two stages of the bf16 tile (dynamic smem)

// Persistent blocks (2 per SM) walking tiles blockIdx.x, + gridDim.x, ...: the next tile's loads
// (cp.async into a second shared stage) are in flight while the current tile is processed.
template <bool MX, bool E5M2>
__global__ void __launch_bounds__(kThreads, 2)
    quant_dual_pipe_kernel(const uint16_t* __restrict__ x, uint8_t* __restrict__ q,
                           void* __restrict__ s_out, uint8_t* __restrict__ qt,
                           void* __restrict__ st_out, int64_t M, int64_t N, int tiles_n,
                           int tiles, float fmax, int emax) {
  extern __shared__ uint4 stage[];  // [2][8][kThreads]
  __shared__ uint32_t tsm[kTile * kTile / 4];
  __shared__ uint4 csm[2][kThreads / kWarpSize][16];
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
    tile_body<MX, E5M2>(d, tsm, csm, q, s_out, qt, st_out, M, N, m0, n0, fmax, emax);
  }
}

// occ: blocks per SM the registers are capped for (2: 128 registers, no spill; 3: 80, ~56 bytes
// spilled; 4: 64, ~200 bytes spilled); 1: the persistent cp.async-pipelined kernel (2 per SM).
template <bool MX, bool E5M2>
Status launch(const void* x, void* q, void* s, void* qt, void* st, int64_t m, int64_t n,
              float fmax, int emax, int occ, cudaStream_t stream) {
  const int64_t tiles_m = (m + kTile - 1) / kTile, tiles_n = (n + kTile - 1) / kTile;
  if (tiles_m * tiles_n > 0x7fffffff) return kBadArgument;
  const dim3 grid(static_cast<unsigned>(tiles_m * tiles_n));
  const auto* X = static_cast<const uint16_t*>(x);
  auto* Q = static_cast<uint8_t*>(q);
  auto* QT = static_cast<uint8_t*>(qt);
  const int tn = static_cast<int>(tiles_n);
  if (occ == 1) {
    auto* kern = quant_dual_pipe_kernel<MX, E5M2>;  // 64 KB dynamic + 20 KB static shared
    // the opt-in once per device and instantiation (not again inside a CUDA graph capture)
    static std::atomic<bool> smem_set[64];
    int dev = 0;
    PT_RETURN_IF_ERROR(ptGetDevice(&dev));
    if (dev < 0 || dev >= 64 || !smem_set[dev].load(std::memory_order_relaxed)) {
      PT_RETURN_IF_ERROR(
          cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kPipeSmem));
      if (dev >= 0 && dev < 64) smem_set[dev].store(true, std::memory_order_relaxed);
    }
    int sms = 1;
    const Status st_sm = device_sm_count(&sms);
    if (st_sm != kOk) return st_sm;
    const int64_t tiles = tiles_m * tiles_n;
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(tiles, 2 * int64_t{sms}));
    kern<<<blocks, kThreads, kPipeSmem, stream>>>(X, Q, s, QT, st, m, n, tn,
                                                   static_cast<int>(tiles), fmax, emax);
  } else if (occ >= 4) {
    quant_dual_kernel<MX, E5M2, 4><<<grid, kThreads, 0, stream>>>(X, Q, s, QT, st, m, n, tn, fmax,
                                                                  emax);
  } else if (occ == 3) {
    quant_dual_kernel<MX, E5M2, 3><<<grid, kThreads, 0, stream>>>(X, Q, s, QT, st, m, n, tn, fmax,
                                                                  emax);
  } else {
    quant_dual_kernel<MX, E5M2, 2><<<grid, kThreads, 0, stream>>>(X, Q, s, QT, st, m, n, tn, fmax,
                                                                  emax);
  }
  PT_RETURN_LAUNCH_STATUS();
  return kOk;
}

}  // namespace

bool quant_dual_gpu_available() noexcept { return true; }

Status quant_dual_fp8_gpu(const void* x, void* q, void* s, void* qt, void* st, int64_t m,
                          int64_t n, bool mx, bool e5m2, float fmax, int emax, int occ,
                          void* stream) noexcept {
  if (m < 0 || n < 0 || n % 8 != 0) return kBadArgument;
  if (mx && (m % 32 != 0 || n % 32 != 0)) return kBadArgument;
  if (m == 0 || n == 0) return kOk;
  auto* cs = static_cast<cudaStream_t>(stream);
  if (mx) {
    return e5m2 ? launch<true, true>(x, q, s, qt, st, m, n, fmax, emax, occ, cs)
                : launch<true, false>(x, q, s, qt, st, m, n, fmax, emax, occ, cs);
  }
  return e5m2 ? launch<false, true>(x, q, s, qt, st, m, n, fmax, emax, occ, cs)
              : launch<false, false>(x, q, s, qt, st, m, n, fmax, emax, occ, cs);
}

#endif  // PT_HIP

}  // namespace primus_turbo
