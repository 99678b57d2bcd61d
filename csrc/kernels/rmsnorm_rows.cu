// RMSNorm on the GPU, "rows" launch plan, for narrow rows (hidden <= 16 vectors per lane of one
// warp: bf16/fp16 <= 4096 on NVIDIA, <= 8192 on AMD; math in primus_turbo/rmsnorm.h).
//
// One warp (wavefront on AMD) per row: each lane keeps VPT 16-byte vectors of x (and dy) in
// registers (x and dy are read once, y / dx written once), and the row reduction is a warp shuffle:
// no block barrier in the row loop, so the warps of an SM run independently and hide each other's
// load latency. A block holds G warps and walks the rows persistently (row = block * G + warp,
// stride gridDim.x * G). dw: each warp adds g * x_hat into its own fp32 row of shared memory
// (lane-owned columns: no atomics); at the end the block adds its G warp rows in order 0..G-1 and
// writes ONE partial row; rmsnorm.cu's reduce kernel sums the partial rows in a fixed order.
// The grid is the resident blocks of the device (capped by the row count), so the partial rows
// are a few hundred at most (a few percent of the traffic). Deterministic for a given device and
// shape. Nothing here throws.
#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "primus_turbo/device.h"
#include "rmsnorm_gpu_plans.h"

namespace primus_turbo {
namespace {

// Shared memory the G warp rows of one block may use (fp32, hidden floats per warp): two blocks
// per SM on an H100/H200 (228 KB); AMD CDNA has 64 KB of LDS per CU.
#if PT_HIP
constexpr int64_t kRowsSmemBudget = 64 * 1024;
#else
constexpr int64_t kRowsSmemBudget = 100 * 1024;
#endif
constexpr int kRowsMaxWarps = 8;  // warps per block at most
constexpr int kRowsMaxVpt = 16;

// Forward: one warp per row, persistent (row = block * G + warp, stride gridDim.x * G); the next
// row's x is loaded before the current row's warp reduction and stores (VPT <= 8; above, the
// second buffer would cost too many registers; 8 warps per SM still hold ~100 KB in flight).
template <typename T, int VPT>
__global__ void __launch_bounds__(kRowsMaxWarps * kWarpSize)
    fwd_rows_kernel(const T* __restrict__ x, const T* w, T* __restrict__ y,
                    float* __restrict__ rstd, int64_t rows, int nvec, float inv_h, float eps) {
  constexpr int N = Vec16<T>::N;
  constexpr bool kPrefetch = VPT <= 8;
  const int64_t hidden = static_cast<int64_t>(nvec) * N;
  const int lane = static_cast<int>(threadIdx.x);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.y;
  auto load_row = [&](int64_t r, Vec16<T>* xb) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = lane + i * kWarpSize;
      xb[i].raw = make_uint4(0, 0, 0, 0);
      if (r < rows && v < nvec) load16(xb[i], x + r * hidden + static_cast<int64_t>(v) * N);
    }
  };
  Vec16<T> xv[VPT];
  int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (kPrefetch) load_row(r, xv);
  for (; r < rows; r += stride) {
    if (!kPrefetch) load_row(r, xv);
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float f = to_float(xv[i].v()[j]);  // zero where v >= nvec
        ss += f * f;
      }
    }
    Vec16<T> xn[kPrefetch ? VPT : 1];
    if (kPrefetch) load_row(r + stride, xn);
    const float rs = rsqrtf(warp_sum(ss) * inv_h + eps);
    if (lane == 0) rstd[r] = rs;
    T* yr = y + r * hidden;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = lane + i * kWarpSize;
      if (v < nvec) {
        Vec16<T> wv, out;
        load16(wv, w + static_cast<int64_t>(v) * N);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          out.v()[j] = from_float<T>(to_float(xv[i].v()[j]) * rs * to_float(wv.v()[j]));
        }
        store16(yr + static_cast<int64_t>(v) * N, out);
      }
    }
    if (kPrefetch) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) xv[i] = xn[kPrefetch ? i : 0];
    }
  }
}

// Shared layout of a warp's dw row: slot (i * N + j) * kWarpSize + lane holds column
// (lane + i * kWarpSize) * N + j, so the lanes of a warp touch consecutive words (no bank
// conflicts); VPT * N * kWarpSize slots per warp (idle lanes' slots stay unused).
template <typename T, int VPT>
__global__ void __launch_bounds__(kRowsMaxWarps * kWarpSize)
    bwd_rows_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* w,
                    const float* __restrict__ rstd, T* __restrict__ dx,
                    float* __restrict__ part, int64_t rows, int nvec, float inv_h) {
  extern __shared__ float acc[];  // [blockDim.y][VPT * N * kWarpSize]
  pdl_launch_dependents();  // the dw reduce (PRIMUS_TURBO_RMSNORM_CPP_PDL); a no-op otherwise
  constexpr int N = Vec16<T>::N;
  constexpr int kSlots = VPT * N * kWarpSize;
  const int64_t hidden = static_cast<int64_t>(nvec) * N;
  const int lane = static_cast<int>(threadIdx.x), warp = static_cast<int>(threadIdx.y);
  const int warps = static_cast<int>(blockDim.y);
  float* mine = acc + warp * kSlots + lane;
#pragma unroll
  for (int k = 0; k < VPT * N; ++k) mine[k * kWarpSize] = 0.f;  // only this lane reads them
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * warps + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * warps) {
    const float rs = rstd[r];
    const T* xr = x + r * hidden;
    const T* gr = dy + r * hidden;
    Vec16<T> xv[VPT], gv[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = lane + i * kWarpSize;
      xv[i].raw = make_uint4(0, 0, 0, 0);
      gv[i].raw = make_uint4(0, 0, 0, 0);
      if (v < nvec) {
        load16(xv[i], xr + static_cast<int64_t>(v) * N);
        load16(gv[i], gr + static_cast<int64_t>(v) * N);
      }
    }
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = lane + i * kWarpSize;
      if (v < nvec) {
        Vec16<T> wv;
        load16(wv, w + static_cast<int64_t>(v) * N);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float xh = to_float(xv[i].v()[j]) * rs;
          const float g = to_float(gv[i].v()[j]);
          dot += xh * g * to_float(wv.v()[j]);
          mine[(i * N + j) * kWarpSize] += g * xh;
        }
      }
    }
    const float mean = warp_sum(dot) * inv_h;
    T* dxr = dx + r * hidden;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = lane + i * kWarpSize;
      if (v < nvec) {
        Vec16<T> wv, out;
        load16(wv, w + static_cast<int64_t>(v) * N);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float xh = to_float(xv[i].v()[j]) * rs;
          out.v()[j] =
              from_float<T>(rs * (to_float(wv.v()[j]) * to_float(gv[i].v()[j]) - xh * mean));
        }
        store16(dxr + static_cast<int64_t>(v) * N, out);
      }
    }
  }
  __syncthreads();
  // Block partial row: the warp rows added in order 0, 1, ..., G-1 (deterministic).
  float* pb = part + static_cast<int64_t>(blockIdx.x) * hidden;
  for (int q = warp * kWarpSize + lane; q < kSlots; q += warps * kWarpSize) {
    const int l = q % kWarpSize, ij = q / kWarpSize;
    const int v = l + (ij / N) * kWarpSize;
    if (v >= nvec) continue;
    float s = 0.f;
    for (int g = 0; g < warps; ++g) s += acc[g * kSlots + q];
    pb[static_cast<int64_t>(v) * N + ij % N] = s;
  }
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

struct RowsPlan {
  int vpt = 0;    // 0: the rows path does not apply
  int warps = 0;  // warps per block
  size_t smem = 0;
};

// Experiment knob: PRIMUS_TURBO_RMSNORM_CPP_ROWS_WARPS (1..8) caps the backward's warps per
// block (unset: as many as the shared-memory budget allows); cached until
// rmsnorm_gpu_reload_plans.
std::atomic<int> g_rows_warps{-1};

inline int rows_warps_knob() {
  int n = g_rows_warps.load(std::memory_order_relaxed);
  if (n < 0) {
    const char* v = std::getenv("PRIMUS_TURBO_RMSNORM_CPP_ROWS_WARPS");
    n = v != nullptr && v[0] != '\0' ? std::atoi(v) : 0;
    n = n >= 1 && n <= kRowsMaxWarps ? n : kRowsMaxWarps;
    g_rows_warps.store(n, std::memory_order_relaxed);
  }
  return n;
}

// Shared memory for one block's warp rows on the current device (kRowsSmemBudget at most).
inline int64_t rows_smem_budget() {
  int dev_max = 0;
  if (device_max_smem_per_block(&dev_max) != kOk) return 48 * 1024;
  return std::min<int64_t>(kRowsSmemBudget, dev_max);
}

template <typename T>
RowsPlan rows_plan(int64_t hidden) {
  constexpr int N = Vec16<T>::N;
  RowsPlan p;
  if (hidden <= 0 || hidden % N != 0) return p;
  const int64_t per_lane = (hidden / N + kWarpSize - 1) / kWarpSize;
  if (per_lane > kRowsMaxVpt) return p;
  p.vpt = per_lane <= 4 ? 4 : per_lane <= 8 ? 8 : per_lane <= 12 ? 12 : 16;
  const int64_t warp_bytes = static_cast<int64_t>(p.vpt) * N * kWarpSize * sizeof(float);
  // VPT 16 needs ~180 registers on sm_90: 5 warps per block keep two blocks per SM resident.
  const int64_t cap = std::min(p.vpt >= 16 ? 5 : kRowsMaxWarps, rows_warps_knob());
  const int64_t budget = rows_smem_budget();
  if (warp_bytes > budget) return RowsPlan{};  // not even one warp row fits: not applicable
  p.warps = static_cast<int>(std::clamp<int64_t>(budget / warp_bytes, 1, cap));
  p.smem = static_cast<size_t>(p.warps) * static_cast<size_t>(warp_bytes);
  return p;
}

template <typename T, int VPT>
Status rows_grid_of(const RowsPlan& p, int64_t rows, int64_t* grid) {
  auto k = bwd_rows_kernel<T, VPT>;
  const int threads = p.warps * kWarpSize;
  int per_sm = 0, sms = 1;
#if PT_HIP
  PT_RETURN_IF_ERROR(hipFuncSetAttribute(reinterpret_cast<const void*>(k),
                                         hipFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(p.smem)));
  PT_RETURN_IF_ERROR(hipOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, threads, p.smem));
#else
  PT_RETURN_IF_ERROR(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(p.smem)));
  PT_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, threads, p.smem));
#endif
  const Status st = device_sm_count(&sms);
  if (st != kOk) return st;
  const int64_t blocks_needed = (rows + p.warps - 1) / p.warps;
  *grid = balanced_grid(blocks_needed, static_cast<int64_t>(std::max(per_sm, 1)) * sms);
  return kOk;
}

template <typename T>
Status rows_grid(const RowsPlan& p, int64_t rows, int64_t* grid) {
  switch (p.vpt) {
    case 4: return rows_grid_of<T, 4>(p, rows, grid);
    case 8: return rows_grid_of<T, 8>(p, rows, grid);
    case 12: return rows_grid_of<T, 12>(p, rows, grid);
    default: return rows_grid_of<T, 16>(p, rows, grid);
  }
}

template <typename T>
Status bwd_rows_partials(int64_t rows, int64_t hidden, int64_t* nparts) {
  *nparts = 0;
  const RowsPlan p = rows_plan<T>(hidden);
  if (p.vpt == 0 || rows <= 0) return kOk;
  return rows_grid<T>(p, rows, nparts);
}

template <typename T>
Status bwd_rows(const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                float* part, int64_t rows, int64_t hidden, ptStream_t s, int64_t* nparts) {
  *nparts = -1;  // not handled
  const RowsPlan p = rows_plan<T>(hidden);
  if (p.vpt == 0 || rows <= 0 || !aligned16(dy) || !aligned16(x) || !aligned16(w) ||
      !aligned16(dx)) {
    return kOk;
  }
  int64_t g = 1;
  const Status st = rows_grid<T>(p, rows, &g);  // also raises the kernel's shared memory limit
  if (st != kOk) return st;
  *nparts = g;
  const int nvec = static_cast<int>(hidden / Vec16<T>::N);
  const float inv_h = 1.f / static_cast<float>(hidden);
  auto DY = static_cast<const T*>(dy);
  auto X = static_cast<const T*>(x);
  auto W = static_cast<const T*>(w);
  auto DX = static_cast<T*>(dx);
  const dim3 block(kWarpSize, p.warps), grid(static_cast<unsigned>(g));
  switch (p.vpt) {
    case 4: bwd_rows_kernel<T, 4><<<grid, block, p.smem, s>>>(DY, X, W, rstd, DX, part, rows, nvec, inv_h); break;
    case 8: bwd_rows_kernel<T, 8><<<grid, block, p.smem, s>>>(DY, X, W, rstd, DX, part, rows, nvec, inv_h); break;
    case 12: bwd_rows_kernel<T, 12><<<grid, block, p.smem, s>>>(DY, X, W, rstd, DX, part, rows, nvec, inv_h); break;
    default: bwd_rows_kernel<T, 16><<<grid, block, p.smem, s>>>(DY, X, W, rstd, DX, part, rows, nvec, inv_h);
  }
  PT_RETURN_LAUNCH_STATUS();
  return kOk;
}

template <typename T, int VPT>
Status fwd_rows_launch(const T* X, const T* W, T* Y, float* rstd, int64_t rows, int nvec,
                       float inv_h, float eps, ptStream_t s) {
  auto k = fwd_rows_kernel<T, VPT>;
  constexpr int kThreads = kRowsMaxWarps * kWarpSize;
  int per_sm = 0, sms = 1;
#if PT_HIP
  PT_RETURN_IF_ERROR(hipOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, 0));
#else
  PT_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, 0));
#endif
  const Status st = device_sm_count(&sms);
  if (st != kOk) return st;
  const int64_t needed = (rows + kRowsMaxWarps - 1) / kRowsMaxWarps;
  const int64_t cap = static_cast<int64_t>(std::max(per_sm, 1)) * sms;
  const dim3 grid(static_cast<unsigned>(std::max<int64_t>(1, std::min(needed, cap))));
  k<<<grid, dim3(kWarpSize, kRowsMaxWarps), 0, s>>>(X, W, Y, rstd, rows, nvec, inv_h, eps);
  PT_RETURN_LAUNCH_STATUS();
  return kOk;
}

template <typename T>
Status fwd_rows(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t hidden,
                float eps, ptStream_t s, bool* handled) {
  *handled = false;
  const RowsPlan p = rows_plan<T>(hidden);
  if (p.vpt == 0 || rows <= 0 || !aligned16(x) || !aligned16(w) || !aligned16(y)) return kOk;
  *handled = true;
  const int nvec = static_cast<int>(hidden / Vec16<T>::N);
  const float inv_h = 1.f / static_cast<float>(hidden);
  auto X = static_cast<const T*>(x);
  auto W = static_cast<const T*>(w);
  auto Y = static_cast<T*>(y);
  switch (p.vpt) {
    case 4: return fwd_rows_launch<T, 4>(X, W, Y, rstd, rows, nvec, inv_h, eps, s);
    case 8: return fwd_rows_launch<T, 8>(X, W, Y, rstd, rows, nvec, inv_h, eps, s);
    case 12: return fwd_rows_launch<T, 12>(X, W, Y, rstd, rows, nvec, inv_h, eps, s);
    default: return fwd_rows_launch<T, 16>(X, W, Y, rstd, rows, nvec, inv_h, eps, s);
  }
}

}  // namespace

void rmsnorm_rows_reload_knobs() noexcept { g_rows_warps.store(-1, std::memory_order_relaxed); }

bool rmsnorm_bwd_rows_applies(int64_t hidden, DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat32: return rows_plan<float>(hidden).vpt > 0;
    case DType::kFloat16: return rows_plan<pt_half>(hidden).vpt > 0;
    case DType::kBFloat16: return rows_plan<pt_bf16>(hidden).vpt > 0;
  }
  return false;
}

Status rmsnorm_fwd_rows(const void* x, const void* w, void* y, float* rstd, int64_t rows,
                        int64_t hidden, float eps, DType dtype, ptStream_t s,
                        bool* handled) noexcept {
  return dispatch_dtype(dtype, [&](auto t) {
    return fwd_rows<decltype(t)>(x, w, y, rstd, rows, hidden, eps, s, handled);
  });
}

Status rmsnorm_bwd_rows_partials(int64_t rows, int64_t hidden, DType dtype,
                                 int64_t* nparts) noexcept {
  return dispatch_dtype(dtype, [&](auto t) {
    return bwd_rows_partials<decltype(t)>(rows, hidden, nparts);
  });
}

Status rmsnorm_bwd_rows(const void* dy, const void* x, const void* w, const float* rstd,
                        void* dx, float* part, int64_t rows, int64_t hidden, DType dtype,
                        ptStream_t s, int64_t* nparts) noexcept {
  return dispatch_dtype(dtype, [&](auto t) {
    return bwd_rows<decltype(t)>(dy, x, w, rstd, dx, part, rows, hidden, s, nparts);
  });
}

}  // namespace primus_turbo
