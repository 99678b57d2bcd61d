// Portability layer: one kernel source compiles as CUDA (nvcc) and as HIP (hipcc, after torch's
// hipify). Covers the runtime API names the kernels use, the warp/wavefront size (64 on AMD CDNA,
// 32 on NVIDIA: never assume 32), warp and block reductions, 16-byte vector loads, fp16/bf16
// conversions that do not rely on implicit operators (torch builds with __CUDA_NO_HALF_OPERATORS__
// and friends), and status-returning error checks (nothing here throws).
#pragma once

#include <cstdint>

#include "primus_turbo/common.h"

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#define PT_HIP 1
#include <hip/hip_bf16.h>
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
using ptStream_t = hipStream_t;
using ptError_t = hipError_t;
#define PT_SUCCESS hipSuccess
#define ptGetLastError hipGetLastError
#define ptGetErrorString hipGetErrorString
#define ptGetDevice hipGetDevice
#define ptDeviceGetAttribute hipDeviceGetAttribute
#define PT_ATTR_SM_COUNT hipDeviceAttributeMultiprocessorCount
#define PT_ATTR_SMEM_PER_BLOCK hipDeviceAttributeMaxSharedMemoryPerBlock
using pt_half = __half;
using pt_bf16 = __hip_bfloat16;
#else
#define PT_HIP 0
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
using ptStream_t = cudaStream_t;
using ptError_t = cudaError_t;
#define PT_SUCCESS cudaSuccess
#define ptGetLastError cudaGetLastError
#define ptGetErrorString cudaGetErrorString
#define ptGetDevice cudaGetDevice
#define ptDeviceGetAttribute cudaDeviceGetAttribute
#define PT_ATTR_SM_COUNT cudaDevAttrMultiProcessorCount
#define PT_ATTR_SMEM_PER_BLOCK cudaDevAttrMaxSharedMemoryPerBlockOptin  // with the opt-in
using pt_half = __half;
using pt_bf16 = __nv_bfloat16;
#endif

namespace primus_turbo {

// Compile-time warp size for shared-memory sizing and shuffle trees. All AMD targets we build
// for (gfx942, gfx950) run wave64.
#if PT_HIP
constexpr int kWarpSize = 64;
#else
constexpr int kWarpSize = 32;
#endif

// Error handling without exceptions (see common.h): a failing runtime call makes the enclosing
// host function return its error code as a Status; launches are checked the same way.
#define PT_RETURN_IF_ERROR(call)                                                           \
  do {                                                                                     \
    const ptError_t err__ = (call);                                                        \
    if (err__ != PT_SUCCESS) return static_cast<::primus_turbo::Status>(err__);            \
  } while (0)

#define PT_RETURN_LAUNCH_STATUS() PT_RETURN_IF_ERROR(ptGetLastError())

// Multiprocessor count of the current device (cached per device; runtime.cu).
Status device_sm_count(int* out) noexcept;
// Shared memory one block of the current device may use (CUDA: with the opt-in attribute).
Status device_max_smem_per_block(int* out) noexcept;

// ---- scalar conversions (explicit intrinsics: no implicit half/bf16 operators) -----------------
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(pt_half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(pt_bf16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ pt_half from_float<pt_half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ pt_bf16 from_float<pt_bf16>(float v) {
#if PT_HIP
  return __float2bfloat16(v);  // round to nearest even on HIP
#else
  return __float2bfloat16_rn(v);
#endif
}

// ---- element-type dispatch ---------------------------------------------------------------------
// Host side: f(T{}) with T the element type of ``dtype`` (float, pt_half, pt_bf16); the entry
// points of the kernels library use it as ``dispatch_dtype(dtype, [&](auto t) {
// return launch<decltype(t)>(...); })``.
template <typename F>
inline Status dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(float{});
    case DType::kFloat16: return f(pt_half{});
    case DType::kBFloat16: return f(pt_bf16{});
  }
  return kUnsupportedDType;
}

// ---- 16-byte vectors ---------------------------------------------------------------------------
// N elements of T packed into 16 bytes, loaded/stored with one 128-bit access (callers guarantee
// 16-byte alignment: contiguous rows whose length is a multiple of N, and aligned base pointers).
template <typename T>
struct Vec16 {
  static constexpr int N = 16 / sizeof(T);
  uint4 raw;
  __device__ __forceinline__ T* v() { return reinterpret_cast<T*>(&raw); }
  __device__ __forceinline__ const T* v() const { return reinterpret_cast<const T*>(&raw); }
};

template <typename T>
__device__ __forceinline__ void load16(Vec16<T>& dst, const T* src) {
  dst.raw = *reinterpret_cast<const uint4*>(src);
}

template <typename T>
__device__ __forceinline__ void store16(T* dst, const Vec16<T>& src) {
  *reinterpret_cast<uint4*>(dst) = src.raw;
}

// ---- reductions --------------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off >>= 1) {
#if PT_HIP
    v += __shfl_xor(v, off, kWarpSize);
#else
    v += __shfl_xor_sync(0xffffffffu, v, off, kWarpSize);
#endif
  }
  return v;
}

// Sum over the whole block (blockDim.x a multiple of kWarpSize, at most 1024); every thread gets
// the result. `scratch` holds at least 1024 / kWarpSize floats. Fixed tree: deterministic.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int nwarps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.f;
  return warp_sum(v);
}

}  // namespace primus_turbo
