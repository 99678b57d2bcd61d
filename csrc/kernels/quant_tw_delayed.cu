// Delayed-scaling tensorwise FP8 cast of a bf16 matrix on NVIDIA (recipe and layouts in
// primus_turbo/quant_tw_delayed.h): one read of x, the given scale, the amax folded into the
// history slot with one atomicMax per block.
//
// Dual (q and qt = x.T quantized): the tile structure of quant_dual.cu's variant t (one 128 x
// 128 tile per 256-thread block; 8 warp tiles of 32 rows x 64 columns, wm = warp % 4 along M,
// wn = warp / 4 along N; lane (rq = lane / 8, cv = lane % 8) holds the 8 consecutive rows
// 32 wm + 8 rq .. +7 of the 8 columns 64 wn + 8 cv .. +7 in 8 loads of 16 bytes). One scale for
// everything, so every value is converted ONCE: the row bytes (8 per row, stored straight from
// registers) are byte-transposed in registers (4 x 4 blocks, 8 prmt each) into the column bytes,
// a column's 8 rows being 8 consecutive bytes of a qt row (4 lanes fill a 32-byte sector). No
// shared tile, no barrier before the stores.
// Plain (q only): flat, 8 vectors of 16 bytes per thread (16384 values per block, like a dual
// tile), coalesced 16-byte loads and 8-byte stores.
// Amax (both): |x| keys on the bf16 bits (bits & 0x7fff, monotone; two per word with __vmaxu2),
// a thread that saw an inf/NaN key redoes its maximum with the finite filter (Triton's FAST
// walk gives the same value), warp redux, one 32-byte shared array and a barrier after the
// stores, then thread 0 does ONE atomicMax of the block's amax (fp32 bits of a bf16 value, >= 0:
// the integer order is the float order) on the slot, always (Triton's programs do it even for an
// all-zero max; same effect on a slot holding -0.0 or a negative value). Max is order-free: the
// result is deterministic and equals Triton's per-program atomics.
// Conversions: fp32 x * scale (bf16 -> fp32 exact, one mul.rn) and cvt.rn.satfinite, as the
// Triton kernel's NVIDIA path (SAT); 1 / scale with div.rn (Triton's tl.div_rn), written by
// block 0. Needs sm_89+ (fp8 conversions; older archs compile empty kernels and the Python gate
// never calls them). ROCm builds compile a stub. Nothing here throws.
// Measured (H200 call 10.1, graph timing, x of copy, geomean 8192/6144/4096/28672 x 4096, two
// interleaved repeats): plain 0.913 vs Triton 0.865 (28672: 0.979 vs 0.872), dual 0.910 vs
// 0.861, so it is the default (PRIMUS_TURBO_QUANT_CUDA_TWD unset). Streaming st.global.cs stores
// (Triton's CS; removed) tied on plain (0.915) and lost on dual (0.886).
#include "primus_turbo/device.h"
#include "primus_turbo/quant_tw_delayed.h"

namespace primus_turbo {

#if PT_HIP

Status quant_tw_delayed_fp8_gpu(const void*, void*, void*, const float*, float*, float*, int64_t,
                                int64_t, bool, bool, bool, int, void*) noexcept {
  return kBadArgument;
}

#else

namespace {

constexpr int kTile = 128;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kFlatVecs = 8;  // 16-byte vectors per thread of the plain kernel
constexpr uint32_t kInfKey = 0x7f80u;  // |bf16| bit patterns >= this are inf or NaN

#include "primus_turbo/fp8_convert.cuh"  // cvt2, bf_lo, bf_hi

// Largest |x| key (bf16 bits with the sign cleared) of R x 4 words; FINITE: inf/NaN keys are 0.
template <bool FINITE, int R>
__device__ __forceinline__ uint32_t words_max(const uint32_t (&d)[R][4]) {
  uint32_t k = 0;
#pragma unroll
  for (int j = 0; j < R; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t w = d[j][i] & 0x7fff7fffu;
      if (FINITE) {
        const uint32_t lo = w & 0xffffu, hi = w >> 16;
        w = (lo < kInfKey ? lo : 0u) | ((hi < kInfKey ? hi : 0u) << 16);
      }
      k = __vmaxu2(k, w);
    }
  }
  return max(k & 0xffffu, k >> 16);
}

template <int R>
__device__ __forceinline__ uint32_t thread_key(const uint32_t (&d)[R][4]) {
  const uint32_t k = words_max<false>(d);
  return k >= kInfKey ? words_max<true>(d) : k;
}

// Block maximum of the threads' keys -> one atomicMax of its fp32 bits on *amax (thread 0).
__device__ __forceinline__ void block_amax(uint32_t key, uint32_t* wsm, float* amax) {
  key = __reduce_max_sync(0xffffffffu, key);
  const int t = threadIdx.x;
  if ((t & 31) == 0) wsm[t >> 5] = key;
  __syncthreads();
  if (t == 0) {
    uint32_t k = wsm[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) k = max(k, wsm[w]);
    atomicMax(reinterpret_cast<int*>(amax), static_cast<int>(k << 16));
  }
}

// Four fp8 bytes of the 2 words (4 bf16 values) w0, w1 times sc, first value in the low byte.
template <bool E5M2>
__device__ __forceinline__ uint32_t cvt4(uint32_t w0, uint32_t w1, float sc) {
  return cvt2<E5M2>(bf_lo(w0) * sc, bf_hi(w0) * sc) |
         (cvt2<E5M2>(bf_lo(w1) * sc, bf_hi(w1) * sc) << 16);
}

__device__ __forceinline__ void store8(uint8_t* p, uint32_t lo, uint32_t hi) {
  *reinterpret_cast<uint2*>(p) = make_uint2(lo, hi);
}

// p, hidden from the optimizer (keeps it from precomputing a loop's 64-bit addresses at once).
__device__ __forceinline__ uint8_t* opaque(uint8_t* p) {
  asm volatile("" : "+l"(p));
  return p;
}

// 4 x 4 byte transpose: a[r] holds row r's 4 bytes (column c in byte c); t[c] gets column c's
// 4 bytes (row r in byte r).
__device__ __forceinline__ void transpose4(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                           uint32_t (&t)[4]) {
  const uint32_t b0 = __byte_perm(a0, a1, 0x5140), b1 = __byte_perm(a0, a1, 0x7362);
  const uint32_t c0 = __byte_perm(a2, a3, 0x5140), c1 = __byte_perm(a2, a3, 0x7362);
  t[0] = __byte_perm(b0, c0, 0x5410);
  t[1] = __byte_perm(b0, c0, 0x7632);
  t[2] = __byte_perm(b1, c1, 0x5410);
  t[3] = __byte_perm(b1, c1, 0x7632);
}

template <bool E5M2, bool STORE>
__global__ void __launch_bounds__(kThreads, 4)
    twd_dual_kernel(const uint16_t* __restrict__ x, uint8_t* __restrict__ q,
                    uint8_t* __restrict__ qt, const float* __restrict__ scale,
                    float* __restrict__ sinv, float* __restrict__ amax, int M, int N,
                    int tiles_n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  __shared__ uint32_t wsm[kWarps];
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  const int wm = warp & 3, wn = warp >> 2, rq = lane >> 3, cv = lane & 7;
  const int m0 = static_cast<int>(blockIdx.x / tiles_n) * kTile;  // 32-bit rows / columns
  const int n0 = static_cast<int>(blockIdx.x % tiles_n) * kTile;  // (64-bit offsets)
  const int row0 = m0 + 32 * wm + 8 * rq, col = n0 + 64 * wn + 8 * cv;
  const bool col_ok = col < N;  // N % 8 == 0: a vector is wholly in or out
  const float sc = STORE ? __ldg(scale) : 0.f;

  uint32_t d[8][4];
  load_lane_rows8(d, x, M, N, row0, col);
  const uint32_t key = thread_key(d);

  if (STORE) {
    if (blockIdx.x == 0 && t == 0) *sinv = __fdiv_rn(1.0f, sc);
    // rb[j][h]: row j's bytes of columns 4h .. 4h + 3, each value converted once
    uint32_t rb[8][2];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      rb[j][0] = cvt4<E5M2>(d[j][0], d[j][1], sc);
      rb[j][1] = cvt4<E5M2>(d[j][2], d[j][3], sc);
    }
    uint8_t* qp = q + int64_t{row0} * N + col;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (col_ok && row0 + j < M) store8(qp, rb[j][0], rb[j][1]);
      qp = opaque(qp + N);
    }
    const bool full_m = (M % 8) == 0 && row0 + 8 <= M;
    uint8_t* tp = qt + int64_t{col} * M + row0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // columns 4h .. 4h + 3
      uint32_t lo[4], hi[4];  // rows 0..3 / 4..7 of each column
      transpose4(rb[0][h], rb[1][h], rb[2][h], rb[3][h], lo);
      transpose4(rb[4][h], rb[5][h], rb[6][h], rb[7][h], hi);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (col_ok) {
          if (full_m) {
            store8(tp, lo[c], hi[c]);
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              const uint32_t w = e < 4 ? lo[c] : hi[c];
              if (row0 + e < M) tp[e] = static_cast<uint8_t>(w >> (8 * (e & 3)));
            }
          }
        }
        tp = opaque(tp + M);
      }
    }
  }
  block_amax(key, wsm, amax);
#endif
}

template <bool E5M2, bool STORE>
__global__ void __launch_bounds__(kThreads)
    twd_flat_kernel(const uint4* __restrict__ x, uint8_t* __restrict__ q,
                    const float* __restrict__ scale, float* __restrict__ sinv,
                    float* __restrict__ amax, int64_t nvec) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  __shared__ uint32_t wsm[kWarps];
  const int t = threadIdx.x;
  const int64_t v0 = static_cast<int64_t>(blockIdx.x) * (kFlatVecs * kThreads) + t;
  const float sc = STORE ? __ldg(scale) : 0.f;
  uint32_t d[kFlatVecs][4];
#pragma unroll
  for (int k = 0; k < kFlatVecs; ++k) {
    uint4 u = make_uint4(0u, 0u, 0u, 0u);
    if (v0 + k * kThreads < nvec) u = x[v0 + k * kThreads];
    d[k][0] = u.x;
    d[k][1] = u.y;
    d[k][2] = u.z;
    d[k][3] = u.w;
  }
  const uint32_t key = thread_key(d);
  if (STORE) {
    if (blockIdx.x == 0 && t == 0) *sinv = __fdiv_rn(1.0f, sc);
#pragma unroll
    for (int k = 0; k < kFlatVecs; ++k) {
      const int64_t v = v0 + k * kThreads;
      if (v < nvec) {
        store8(q + 8 * v, cvt4<E5M2>(d[k][0], d[k][1], sc), cvt4<E5M2>(d[k][2], d[k][3], sc));
      }
    }
  }
  block_amax(key, wsm, amax);
#endif
}

template <bool E5M2, bool STORE>
Status launch(const void* x, void* q, void* qt, const float* scale, float* sinv, float* amax,
              int64_t m, int64_t n, bool dual, cudaStream_t stream) {
  if (dual) {
    if (m > 0x7fffff00 || n > 0x7fffff00) return kBadArgument;  // 32-bit rows / columns
    const int64_t tiles_n = (n + kTile - 1) / kTile;
    const int64_t tiles = ((m + kTile - 1) / kTile) * tiles_n;
    if (tiles > 0x7fffffff) return kBadArgument;
    twd_dual_kernel<E5M2, STORE><<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(x), static_cast<uint8_t*>(q), static_cast<uint8_t*>(qt),
        scale, sinv, amax, static_cast<int>(m), static_cast<int>(n), static_cast<int>(tiles_n));
  } else {
    const int64_t nvec = m * n / 8;
    const int64_t per_block = int64_t{kFlatVecs} * kThreads;
    const int64_t blocks = (nvec + per_block - 1) / per_block;
    if (blocks > 0x7fffffff) return kBadArgument;
    twd_flat_kernel<E5M2, STORE><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const uint4*>(x), static_cast<uint8_t*>(q), scale, sinv, amax, nvec);
  }
  PT_RETURN_LAUNCH_STATUS();
  return kOk;
}

}  // namespace

Status quant_tw_delayed_fp8_gpu(const void* x, void* q, void* qt, const float* scale, float* sinv,
                                float* amax, int64_t m, int64_t n, bool dual, bool store,
                                bool e5m2, int variant, void* stream) noexcept {
  if (m < 0 || n < 0 || variant != 1) return kBadArgument;
  if (dual ? n % 8 != 0 : (m * n) % 8 != 0) return kBadArgument;
  if (m == 0 || n == 0) return kOk;
  auto* cs = static_cast<cudaStream_t>(stream);
  if (!store) {  // amax only: no stores, the conversion type does not matter
    return launch<false, false>(x, q, qt, scale, sinv, amax, m, n, dual, cs);
  }
  return e5m2 ? launch<true, true>(x, q, qt, scale, sinv, amax, m, n, dual, cs)
              : launch<false, true>(x, q, qt, scale, sinv, amax, m, n, dual, cs);
}

#endif  // PT_HIP

}  // namespace primus_turbo
