// Device helpers shared by the NVIDIA fp8 cast kernels (quant_dual.cu, quant_dual_mx.cu):
// bf16 halves of a 32-bit word to fp32, and two fp32 to two fp8 bytes with the conversion Triton
// emits on sm_89+. Include inside the kernels' anonymous namespace of the CUDA (non-HIP) branch.
#pragma once

// Two fp32 -> two fp8 bytes (lo in the low byte), round to nearest even, finite values and inf
// saturated to +-max, NaN kept: the conversion Triton emits on sm_89+ (older archs get 0; the
// Python gates never call these kernels there).
template <bool E5M2>
__device__ __forceinline__ uint32_t cvt2(float lo, float hi) {
  unsigned short r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (E5M2) {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  }
#endif
  return r;
}

// The low / high bf16 of a 32-bit word as fp32 (exact).
__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
