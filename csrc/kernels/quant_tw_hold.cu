// Dynamic tensorwise FP8 quantization of a bf16 tensor in one cooperative launch that keeps most
// of the input ON CHIP across a grid barrier (recipe and API in primus_turbo/quant_tw_hold.h).
//
// Why: the tensorwise scale needs the amax of the whole tensor before the first value is cast,
// so the Triton kernels read x twice (amax pass, cast pass; H200: 0.63-0.65 of copy, the bound
// for two HBM reads is 0.60). Here the grid is exactly the co-resident block count (one block of
// T threads per SM, launched cooperatively) and block b owns one contiguous range of x's 16-byte
// vectors (8 bf16 each):
//   [start, start + hs)          held in shared memory: 14 bulk copies of 16 KB (cp.async.bulk,
//                                one mbarrier each, L2 evict_first), issued by thread 0 first;
//   [.. + hs, .. + hs + hr)      held in registers: RV vectors per thread (ld.global.v4);
//   [r0, start + len)            the remainder (inputs above ~45 MB on 132 SMs): streamed for the
//                                amax only, read LAST with an L2 evict_last hint (newest in L2).
// Phase 1: per-thread max of the |x| bit patterns (bits & 0x7fff: a monotone key, two per word
// with __vmaxu2) over the registers, the chunks (each waited on its mbarrier inside the
// remainder loop, so the smem reduction hides under the remainder's loads) and the remainder;
// a thread that saw an inf/NaN key redoes its values with the finite filter (Triton's FAST walk:
// same result). Block max -> parts[b]; grid.sync(); every block reduces all partials (max is
// exact and order-free: deterministic, no atomics) -> scale = fmax / max(amax, 1e-12) and
// scale_inv = 1 / scale, both div.full.f32 as Triton. Phase 2: the remainder FIRST, newest batch
// first (L2 evict_first; its last reads are still in L2), interleaved with the casts and stores
// of the shared-memory chunks; then the register-held vectors; then the < 8-element tail.
// q = cvt.rn.satfinite(x * scale) (fp8_convert.cuh's cvt2, the conversion Triton emits), stored
// 8 bytes per vector (a warp: 256 contiguous bytes), streaming (.cs) when flags & 2.
// sm_90+ only (bulk copies; other archs compile an empty kernel and the host refuses them).
// ROCm builds compile a stub. Nothing here throws.
#include <algorithm>
#include <atomic>

#include "primus_turbo/device.h"
#include "primus_turbo/quant_tw_hold.h"

#if !PT_HIP
#include <cooperative_groups.h>
#endif

namespace primus_turbo {

#if PT_HIP

Status quant_tw_hold_blocks(int, bool, int* blocks) noexcept {
  *blocks = 0;
  return kBadArgument;
}

Status quant_tw_hold_fp8_gpu(const void*, void*, void*, void*, int64_t, bool, float, int, int,
                             int, void*) noexcept {
  return kBadArgument;
}

#else

namespace {

constexpr int kChunkVec = 1024;  // 16-byte vectors per bulk copy (16 KB, one mbarrier)
constexpr int kChunks = 14;      // 224 KB of dynamic shared memory per block
constexpr int kSmemVec = kChunks * kChunkVec;
constexpr int kSmemBytes = kSmemVec * 16;

#include "primus_turbo/fp8_convert.cuh"  // cvt2, bf_lo, bf_hi

#include "primus_turbo/quant_tw_hold.cuh"  // policies, loads, keys, cast8, block_max

// See the file comment. T threads, RV register-held vectors per thread, U remainder vectors per
// thread in flight per loop step. x/q as 16-byte / 8-byte vectors: nvec full vectors, then
// `tail` (< 8) single elements; parts: gridDim.x words.
template <bool E5M2, int T, int RV, int U>
__global__ void __launch_bounds__(T, 1)
    quant_tw_hold_kernel(const uint4* __restrict__ x, uint2* __restrict__ q, float* __restrict__ s,
                         uint32_t* __restrict__ parts, int64_t nvec, int tail, float fmax,
                         int flags) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint4 sm[];
  __shared__ uint64_t bars[kChunks];
  __shared__ uint32_t red[32];
  const int t = threadIdx.x;
  const int nblk = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
  const int64_t per = nvec / nblk;  // the host keeps per + 1 < 2**31
  const int extra = static_cast<int>(nvec % nblk);
  const int64_t start = b * per + min(b, extra);
  const int len = static_cast<int>(per) + (b < extra ? 1 : 0);
  const int hs = min(len, kSmemVec);
  const int hr = min(len - hs, RV * T);
  const int rest = len - hs - hr;  // the streamed remainder: [start + hs + hr, start + len)
  const int nch = (hs + kChunkVec - 1) / kChunkVec;
  const bool evict = (flags & kQuantTwHoldEvict) != 0;
  const bool cs = (flags & kQuantTwHoldStreamStores) != 0;
  const uint4* xb = x + start;

  if (t == 0) {
    for (int c = 0; c < nch; ++c) mbar_init(&bars[c]);
    mbar_init_fence();
  }
  __syncthreads();
  if (t == 0) {
    const uint64_t pol = policy_evict_first();
    for (int c = 0; c < nch; ++c) {
      const int n = min(hs - c * kChunkVec, int{kChunkVec});
      bulk_load(&sm[c * kChunkVec], xb + c * kChunkVec, static_cast<uint32_t>(n) * 16u, &bars[c],
                pol);
    }
  }
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  uint4 h[RV];
  {
    const uint64_t pol = policy_evict_first();
#pragma unroll
    for (int j = 0; j < RV; ++j) {
      const int i = j * T + t;
      h[j] = i < hr ? ld_vec(xb + hs + i, pol) : zero;
    }
  }

  // this thread's remainder vectors: xt[k * T] for k < nr
  const int nr = rest > t ? (rest - t + T - 1) / T : 0;
  const int nit = (nr + U - 1) / U;
  const uint4* xt = xb + hs + hr + t;
  uint32_t m2 = 0;
  for (int it = 0; it < max(nit, nch); ++it) {
    const uint64_t pol = evict ? policy_evict_last() : policy_evict_normal();
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = it * U + u;
      v[u] = k < nr ? ld_vec(xt + k * T, pol) : zero;
    }
    if (it < nch) {  // a held chunk while the remainder's loads are in flight
      mbar_wait0(&bars[it]);
      const int end = min(hs, (it + 1) * kChunkVec);
      for (int i = it * kChunkVec + t; i < end; i += T) m2 = vmax<false>(sm[i], m2);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) m2 = vmax<false>(v[u], m2);
  }
#pragma unroll
  for (int j = 0; j < RV; ++j) m2 = vmax<false>(h[j], m2);
  uint32_t key = max(m2 & 0xffffu, m2 >> 16);
  if (key >= kInfKey) {  // an inf or NaN among this thread's values: again, finite values only
    m2 = 0;
#pragma unroll
    for (int j = 0; j < RV; ++j) m2 = vmax<true>(h[j], m2);
    for (int i = t; i < hs; i += T) m2 = vmax<true>(sm[i], m2);
    const uint64_t pol = policy_evict_normal();
    for (int k = 0; k < nr; ++k) m2 = vmax<true>(ld_vec(xt + k * T, pol), m2);
    key = max(m2 & 0xffffu, m2 >> 16);
  }
  const uint16_t* xe = reinterpret_cast<const uint16_t*>(x + nvec);  // the tail elements
  if (tail > 0 && b == nblk - 1 && t == 0) {
    for (int e = 0; e < tail; ++e) {
      const uint32_t k = xe[e] & 0x7fffu;
      if (k < kInfKey) key = max(key, k);
    }
  }
  key = block_max<T>(key, red);
  if (t == 0) parts[b] = key;

  cooperative_groups::this_grid().sync();

  uint32_t g = 0;
  for (int i = t; i < nblk; i += T) g = max(g, __ldcg(parts + i));
  g = block_max<T>(g, red);
  const float scale = div_full(fmax, fmaxf(__uint_as_float(g << 16), 1e-12f));
  if (b == 0 && t == 0) *s = div_full(1.0f, scale);

  // Phase 2: the remainder newest batch first, each step also casting one held chunk
  uint2* qb = q + start;
  for (int n = 0; n < max(nit, nch); ++n) {
    const int it = nit - 1 - n;  // < 0: no remainder left
    const uint64_t pol = evict ? policy_evict_first() : policy_evict_normal();
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = it * U + u;
      v[u] = it >= 0 && k < nr ? ld_vec(xt + k * T, pol) : zero;
    }
    if (n < nch) {
      const int end = min(hs, (n + 1) * kChunkVec);
      for (int i = n * kChunkVec + t; i < end; i += T) {
        store8(qb + i, cast8<E5M2>(sm[i], scale), cs);
      }
    }
    uint2* qt = qb + hs + hr + t;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = it * U + u;
      if (it >= 0 && k < nr) store8(qt + k * T, cast8<E5M2>(v[u], scale), cs);
    }
  }
#pragma unroll
  for (int j = 0; j < RV; ++j) {
    const int i = j * T + t;
    if (i < hr) store8(qb + hs + i, cast8<E5M2>(h[j], scale), cs);
  }
  if (tail > 0 && b == nblk - 1 && t == 0) {
    uint8_t* qe = reinterpret_cast<uint8_t*>(q + nvec);
    for (int e = 0; e < tail; ++e) {
      qe[e] = static_cast<uint8_t>(cvt2<E5M2>(__uint_as_float(uint32_t{xe[e]} << 16) * scale,
                                              0.0f));
    }
  }
#endif  // __CUDA_ARCH__ >= 900
}

struct Variant {
  int threads;
  const void* fn[2];  // e4m3, e5m2
};

template <int T, int RV, int U>
Variant make_variant() {
  return {T,
          {reinterpret_cast<const void*>(&quant_tw_hold_kernel<false, T, RV, U>),
           reinterpret_cast<const void*>(&quant_tw_hold_kernel<true, T, RV, U>)}};
}

const Variant& variant_of(int v) {
  static const Variant table[kQuantTwHoldVariants] = {
      make_variant<512, 16, 8>(), make_variant<1024, 8, 1>(), make_variant<1024, 7, 2>()};
  return table[v];
}

// Co-resident blocks of (variant, e5m2) on the current device, cached per device (the shared
// memory opt-in set once, outside any later CUDA graph capture); 0 where it cannot run.
Status resident_blocks(int variant, bool e5m2, int* blocks) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices][kQuantTwHoldVariants][2];  // blocks + 1, 0 = unset
  int dev = 0;
  PT_RETURN_IF_ERROR(ptGetDevice(&dev));
  std::atomic<int>* slot =
      dev >= 0 && dev < kMaxDevices ? &cache[dev][variant][e5m2 ? 1 : 0] : nullptr;
  if (slot != nullptr) {
    const int c = slot->load(std::memory_order_relaxed);
    if (c > 0) {
      *blocks = c - 1;
      return kOk;
    }
  }
  int major = 0, coop = 0, sms = 0, per_sm = 0;
  PT_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  PT_RETURN_IF_ERROR(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  PT_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  int n = 0;
  if (major >= 9 && coop != 0) {
    const Variant& var = variant_of(variant);
    const void* fn = var.fn[e5m2 ? 1 : 0];
    PT_RETURN_IF_ERROR(
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    PT_RETURN_IF_ERROR(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, var.threads, kSmemBytes));
    n = per_sm * sms;
  }
  if (slot != nullptr) slot->store(n + 1, std::memory_order_relaxed);
  *blocks = n;
  return kOk;
}

}  // namespace

Status quant_tw_hold_blocks(int variant, bool e5m2, int* blocks) noexcept {
  *blocks = 0;
  if (variant < 0 || variant >= kQuantTwHoldVariants) return kBadArgument;
  return resident_blocks(variant, e5m2, blocks);
}

Status quant_tw_hold_fp8_gpu(const void* x, void* q, void* s, void* parts, int64_t numel,
                             bool e5m2, float fmax, int variant, int flags, int blocks,
                             void* stream) noexcept {
  if (variant < 0 || variant >= kQuantTwHoldVariants || numel < 1 || blocks < 1) {
    return kBadArgument;
  }
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(q) % 8 != 0) {
    return kBadArgument;
  }
  int resident = 0;
  const Status st = resident_blocks(variant, e5m2, &resident);
  if (st != kOk) return st;
  if (blocks > resident) return kBadArgument;  // the cooperative grid must be co-resident
  const Variant& var = variant_of(variant);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(static_cast<unsigned>(var.threads));
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const uint4* xv = static_cast<const uint4*>(x);
  uint2* qv = static_cast<uint2*>(q);
  float* sf = static_cast<float*>(s);
  uint32_t* pw = static_cast<uint32_t*>(parts);
  int64_t nvec = numel / 8;
  int tail = static_cast<int>(numel % 8);
  void* args[] = {&xv, &qv, &sf, &pw, &nvec, &tail, &fmax, &flags};
  PT_RETURN_IF_ERROR(cudaLaunchKernelExC(&cfg, var.fn[e5m2 ? 1 : 0], args));
  return kOk;
}

#endif  // PT_HIP

}  // namespace primus_turbo
