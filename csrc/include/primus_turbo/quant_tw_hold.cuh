// Device helpers of the tensorwise "hold" kernels (quant_tw_hold.cu: flat; quant_tw_hold_dual.cu:
// 64 x 64 tiles with the transposed copy): L2 cache policies, 16-byte loads with a policy, the
// mbarrier / bulk-copy / cp.async wrappers, |x| keys and their maxima, the 8-value fp8 cast, the
// block maximum. Include inside the kernels' anonymous namespace of the CUDA (non-HIP) branch,
// after fp8_convert.cuh. sm_90+ only (the host refuses other archs).
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

constexpr uint32_t kInfKey = 0x7f80u;  // |bf16| bit patterns >= this are inf or NaN

// Triton's fp32 division (checked in its sm_90 PTX): div.full.f32, not the IEEE div.rn.
__device__ __forceinline__ float div_full(float a, float b) {
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ uint64_t policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t policy_evict_last() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t policy_evict_normal() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// 16 bytes of x (read-only for the whole kernel), not kept in L1, L2 priority `pol`.
__device__ __forceinline__ uint4 ld_vec(const uint4* p, uint64_t pol) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(pol));
  return v;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Thread 0: the chunk's transaction count, then its bulk copy (completes the count on `bar`).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar, uint64_t pol) {
  const uint32_t b = smem_u32(bar);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(b), "l"(pol)
      : "memory");
}

// 16 bytes global -> shared, asynchronous (cp.async.cg: L2 only), L2 priority `pol`.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, uint64_t pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)),
               "l"(src), "l"(pol)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

__device__ __forceinline__ void mbar_wait0(uint64_t* bar) {  // phase 0 (one use per launch)
  const uint32_t b = smem_u32(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(b)
        : "memory");
  } while (!done);
}

// u16x2 maxima of |x| keys; FINITE: inf/NaN keys count as 0 (left out of the amax).
template <bool FINITE>
__device__ __forceinline__ uint32_t key2(uint32_t w) {
  w &= 0x7fff7fffu;
  if (FINITE) {
    const uint32_t lo = w & 0xffffu, hi = w >> 16;
    w = (lo < kInfKey ? lo : 0u) | ((hi < kInfKey ? hi : 0u) << 16);
  }
  return w;
}

template <bool FINITE>
__device__ __forceinline__ uint32_t vmax(uint4 v, uint32_t m) {
  return __vmaxu2(__vmaxu2(m, __vmaxu2(key2<FINITE>(v.x), key2<FINITE>(v.y))),
                  __vmaxu2(key2<FINITE>(v.z), key2<FINITE>(v.w)));
}

// 8 bf16 -> 8 fp8 bytes (element e in byte e).
template <bool E5M2>
__device__ __forceinline__ uint2 cast8(uint4 v, float sc) {
  const uint32_t c0 = cvt2<E5M2>(bf_lo(v.x) * sc, bf_hi(v.x) * sc);
  const uint32_t c1 = cvt2<E5M2>(bf_lo(v.y) * sc, bf_hi(v.y) * sc);
  const uint32_t c2 = cvt2<E5M2>(bf_lo(v.z) * sc, bf_hi(v.z) * sc);
  const uint32_t c3 = cvt2<E5M2>(bf_lo(v.w) * sc, bf_hi(v.w) * sc);
  return make_uint2(c0 | (c1 << 16), c2 | (c3 << 16));
}

__device__ __forceinline__ void store8(uint2* p, uint2 v, bool cs) {
  if (cs) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

// Max of `v` over the block, returned to every thread (red: 32 words of shared memory).
template <int T>
__device__ __forceinline__ uint32_t block_max(uint32_t v, uint32_t* red) {
  constexpr int kWarps = T / kWarpSize;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = __reduce_max_sync(0xffffffffu, v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = __reduce_max_sync(0xffffffffu, lane < kWarps ? red[lane] : 0u);
    if (lane == 0) red[0] = v;
  }
  __syncthreads();
  return red[0];
}

#endif  // __CUDA_ARCH__ >= 900
