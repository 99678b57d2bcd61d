// RMSNorm on the GPU (CUDA, and HIP through hipify; math in primus_turbo/rmsnorm.h): the
// public entry points, the launch-plan choice (see "launch plans" below), the "persist" plan's
// kernels, the generic scalar kernels and the dw reduce. Nothing here throws: host functions
// return a Status (common.h).
//
// Persistent kernels (vector path: hidden % (16 / sizeof(T)) == 0, 16-byte aligned rows): a grid
// that fills the device walks the rows with a fixed stride; each thread keeps VPT 16-byte vectors
// of its row in registers (x, and dy in the backward, read once) and, in the backward, its fp32
// dw sums. Each backward block writes one dw partial row; dw_reduce_kernel sums the partial rows
// in a fixed order (deterministic for a given device and shape). Generic path (any hidden, e.g.
// 1 or 127): the same math with scalar loads.
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "primus_turbo/device.h"
#include "primus_turbo/rmsnorm.h"
#include "rmsnorm_gpu_plans.h"

namespace primus_turbo {
namespace {

constexpr int kMaxThreads = 512;  // 128 registers per thread on NVIDIA: no spills
constexpr int kScratch = kMaxThreads / kWarpSize;

// Persistent forward (plan "persist"): a grid that fills the device walks the rows with stride
// gridDim.x; the next row's x is loaded before the current row's reduction, so loads stay in
// flight across the block reduction and the stores (double buffering in registers). w is re-read
// per row from L1/L2 (small, hot); it is not __restrict__ so the compiler does not hoist it (and
// its fp32 conversion) into registers, which would halve the resident blocks.
template <typename T, int VPT>
__global__ void __launch_bounds__(kMaxThreads)
    fwd_persist_kernel(const T* __restrict__ x, const T* w, T* __restrict__ y,
                       float* __restrict__ rstd, int64_t rows, int64_t hidden, float eps) {
  __shared__ float scratch[kScratch];
  constexpr int N = Vec16<T>::N;
  const int nvec = static_cast<int>(hidden / N);
  const float inv_h = 1.f / static_cast<float>(hidden);
  Vec16<T> xv[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) xv[i].raw = make_uint4(0, 0, 0, 0);
  int64_t row = blockIdx.x;
  if (row < rows) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = static_cast<int>(threadIdx.x + i * blockDim.x);  // nvec <= 4096
      if (v < nvec) load16(xv[i], x + row * hidden + v * N);
    }
  }
  for (; row < rows; row += gridDim.x) {
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float f = to_float(xv[i].v()[j]);  // zero where v >= nvec
        ss += f * f;
      }
    }
    const int64_t next = row + gridDim.x;
    Vec16<T> xn[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = static_cast<int>(threadIdx.x + i * blockDim.x);  // nvec <= 4096
      xn[i].raw = make_uint4(0, 0, 0, 0);
      if (next < rows && v < nvec) load16(xn[i], x + next * hidden + v * N);
    }
    ss = block_sum(ss, scratch);
    const float rs = rsqrtf(ss * inv_h + eps);
    if (threadIdx.x == 0) rstd[row] = rs;
    T* yr = y + row * hidden;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = static_cast<int>(threadIdx.x + i * blockDim.x);  // nvec <= 4096
      if (v < nvec) {
        Vec16<T> wv, out;
        load16(wv, w + v * N);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          out.v()[j] = from_float<T>(to_float(xv[i].v()[j]) * rs * to_float(wv.v()[j]));
        }
        store16(yr + v * N, out);
      }
      xv[i] = xn[i];
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    fwd_generic_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                       float* __restrict__ rstd, int64_t hidden, float eps) {
  __shared__ float scratch[kScratch];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * hidden;
  float ss = 0.f;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    const float f = to_float(xr[h]);
    ss += f * f;
  }
  ss = block_sum(ss, scratch);
  const float rs = rsqrtf(ss / static_cast<float>(hidden) + eps);
  if (threadIdx.x == 0) rstd[row] = rs;
  T* yr = y + row * hidden;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    yr[h] = from_float<T>(to_float(xr[h]) * rs * to_float(w[h]));
  }
}

// minBlocks = 1: without it ptxas aims for more resident blocks and spills the dw sums.
template <typename T, int VPT>
__global__ void __launch_bounds__(kMaxThreads, 1)
    bwd_vec_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                   const float* __restrict__ rstd, T* __restrict__ dx, float* __restrict__ part,
                   int64_t rows, int64_t hidden) {
  __shared__ float scratch[kScratch];
  pdl_launch_dependents();
  constexpr int N = Vec16<T>::N;
  const int64_t nvec = hidden / N;
  const float inv_h = 1.f / static_cast<float>(hidden);
  Vec16<T> wv[VPT];  // packed: fewer registers than fp32 copies
  float acc[VPT][N];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    wv[i].raw = make_uint4(0, 0, 0, 0);
    if (v < nvec) load16(wv[i], w + v * N);
#pragma unroll
    for (int j = 0; j < N; ++j) acc[i][j] = 0.f;
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float rs = rstd[row];
    const T* xr = x + row * hidden;
    const T* gr = dy + row * hidden;
    Vec16<T> xv[VPT], gv[VPT];
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (v < nvec) {
        load16(xv[i], xr + v * N);
        load16(gv[i], gr + v * N);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float xh = to_float(xv[i].v()[j]) * rs;
          const float g = to_float(gv[i].v()[j]);
          dot += xh * g * to_float(wv[i].v()[j]);
          acc[i][j] += g * xh;
        }
      }
    }
    const float mean = block_sum(dot, scratch) * inv_h;
    T* dxr = dx + row * hidden;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (v < nvec) {
        Vec16<T> out;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float xh = to_float(xv[i].v()[j]) * rs;
          out.v()[j] = from_float<T>(
              rs * (to_float(wv[i].v()[j]) * to_float(gv[i].v()[j]) - xh * mean));
        }
        store16(dxr + v * N, out);
      }
    }
  }
  float* pb = part + static_cast<int64_t>(blockIdx.x) * hidden;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (v < nvec) {
#pragma unroll
      for (int j = 0; j < N; j += 4) {
        *reinterpret_cast<float4*>(pb + v * N + j) =
            make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
      }
    }
  }
}

// Persistent backward (plan "persist"): like bwd_vec_kernel, but the next row's x and dy are loaded
// before the current row's reduction (double buffering in registers, loads in flight across the
// reduction and the dx stores). w is re-read per row from L1/L2 (it is small and hot) instead of
// held in registers, which keeps the two row buffers plus the fp32 dw sums without spills.
// MAXT/MINB: the launch bounds (512, 1 by default; (384, 3) = the PERSIST_OCC variant for rows of
// at most 384 threads, three resident blocks per SM on sm_90 instead of two).
template <typename T, int VPT, int MAXT = kMaxThreads, int MINB = 1>
__global__ void __launch_bounds__(MAXT, MINB)
    bwd_persist_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* w,
                       const float* __restrict__ rstd, T* __restrict__ dx,
                       float* __restrict__ part, int64_t rows, int64_t hidden) {
  __shared__ float scratch[kScratch];
  pdl_launch_dependents();  // the dw reduce (PRIMUS_TURBO_RMSNORM_CPP_PDL); a no-op otherwise
  constexpr int N = Vec16<T>::N;
  const int nvec = static_cast<int>(hidden / N);
  const float inv_h = 1.f / static_cast<float>(hidden);
  float acc[VPT][N];
  Vec16<T> xv[VPT], gv[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
#pragma unroll
    for (int j = 0; j < N; ++j) acc[i][j] = 0.f;
    xv[i].raw = make_uint4(0, 0, 0, 0);
    gv[i].raw = make_uint4(0, 0, 0, 0);
  }
  int64_t row = blockIdx.x;
  float rs = 0.f;  // rstd of `row`, loaded with the row (prefetched like x and dy)
  if (row < rows) {
    rs = rstd[row];
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = static_cast<int>(threadIdx.x + i * blockDim.x);  // nvec <= 2048
      if (v < nvec) {
        load16(xv[i], x + row * hidden + v * N);
        load16(gv[i], dy + row * hidden + v * N);
      }
    }
  }
  for (; row < rows; row += gridDim.x) {
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = static_cast<int>(threadIdx.x + i * blockDim.x);  // nvec <= 2048
      Vec16<T> wv;
      wv.raw = make_uint4(0, 0, 0, 0);
      if (v < nvec) load16(wv, w + v * N);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float xh = to_float(xv[i].v()[j]) * rs;  // zero where v >= nvec
        const float g = to_float(gv[i].v()[j]);
        dot += xh * g * to_float(wv.v()[j]);
        acc[i][j] += g * xh;
      }
    }
    const int64_t next = row + gridDim.x;
    Vec16<T> xn[VPT], gn[VPT];
    const float rs_next = next < rows ? rstd[next] : 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = static_cast<int>(threadIdx.x + i * blockDim.x);  // nvec <= 2048
      xn[i].raw = make_uint4(0, 0, 0, 0);
      gn[i].raw = make_uint4(0, 0, 0, 0);
      if (next < rows && v < nvec) {
        load16(xn[i], x + next * hidden + v * N);
        load16(gn[i], dy + next * hidden + v * N);
      }
    }
    const float mean = block_sum(dot, scratch) * inv_h;
    T* dxr = dx + row * hidden;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = static_cast<int>(threadIdx.x + i * blockDim.x);  // nvec <= 2048
      if (v < nvec) {
        Vec16<T> wv, out;
        load16(wv, w + v * N);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float xh = to_float(xv[i].v()[j]) * rs;
          out.v()[j] = from_float<T>(
              rs * (to_float(wv.v()[j]) * to_float(gv[i].v()[j]) - xh * mean));
        }
        store16(dxr + v * N, out);
      }
      xv[i] = xn[i];
      gv[i] = gn[i];
    }
    rs = rs_next;
  }
  float* pb = part + static_cast<int64_t>(blockIdx.x) * hidden;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = static_cast<int>(threadIdx.x + i * blockDim.x);  // nvec <= 2048
    if (v < nvec) {
#pragma unroll
      for (int j = 0; j < N; j += 4) {
        *reinterpret_cast<float4*>(pb + v * N + j) =
            make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    bwd_generic_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                       const float* __restrict__ rstd, T* __restrict__ dx,
                       float* __restrict__ part, int64_t rows, int64_t hidden) {
  __shared__ float scratch[kScratch];
  pdl_launch_dependents();
  float* pb = part + static_cast<int64_t>(blockIdx.x) * hidden;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) pb[h] = 0.f;
  const float inv_h = 1.f / static_cast<float>(hidden);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float rs = rstd[row];
    const T* xr = x + row * hidden;
    const T* gr = dy + row * hidden;
    float dot = 0.f;
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      const float xh = to_float(xr[h]) * rs;
      const float g = to_float(gr[h]);
      dot += xh * g * to_float(w[h]);
      pb[h] += g * xh;  // column h of this block's partial row: only this thread touches it
    }
    const float mean = block_sum(dot, scratch) * inv_h;
    T* dxr = dx + row * hidden;
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      const float xh = to_float(xr[h]) * rs;
      dxr[h] = from_float<T>(rs * (to_float(w[h]) * to_float(gr[h]) - xh * mean));
    }
  }
}

// dw[h] = sum_b part[b, h] in a fixed order: block (32 columns x 32 lanes of partial rows); lane
// k sums rows k, k+32, ... (a few independent loads per thread, not a long serial chain); then
// lane 0 adds the 32 lane sums in order.
constexpr int kRedCols = 32, kRedLanes = 32;
template <typename T>
__global__ void dw_reduce_kernel(const float* __restrict__ part, T* __restrict__ dw,
                                 int64_t nparts, int64_t hidden) {
  __shared__ float sums[kRedLanes][kRedCols];
  pdl_wait();  // launched as a programmatic dependent (PDL knob): the partial rows are complete
  const int64_t h = static_cast<int64_t>(blockIdx.x) * kRedCols + threadIdx.x;
  float s = 0.f;
  if (h < hidden) {
#pragma unroll 4
    for (int64_t b = threadIdx.y; b < nparts; b += kRedLanes) s += part[b * hidden + h];
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && h < hidden) {
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < kRedLanes; ++k) t += sums[k][threadIdx.x];
    dw[h] = from_float<T>(t);
  }
}

inline int round_up(int64_t v, int m) { return static_cast<int>((v + m - 1) / m * m); }

// Launch shape of one call: VPT (0 = generic path) and threads per block.
struct Plan {
  int vpt;
  int threads;
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// `aligned`: every row pointer is 16-byte aligned (base pointers aligned, hidden % N == 0).
// `max_vpt`: 8 for the forward (it holds only x); 4 for the backward, which also holds w, dy and
// the fp32 dw sums per vector and would spill at 8. `fill`: the thread count a block grows to
// before VPT doubles (256 for the non-persistent backward; 512 for the persistent kernels, whose
// double buffers make a smaller VPT with more threads the better use of registers).
template <typename T>
Plan make_plan(bool aligned, int64_t hidden, int max_vpt, int fill) {
  constexpr int N = Vec16<T>::N;
  const int64_t nvec = hidden / N;
  if (aligned && hidden % N == 0 && nvec <= static_cast<int64_t>(max_vpt) * kMaxThreads) {
    for (int vpt = 1; vpt <= max_vpt; vpt *= 2) {
      if (nvec <= static_cast<int64_t>(vpt) * fill || vpt == max_vpt) {
        return {vpt, std::max(kWarpSize, round_up((nvec + vpt - 1) / vpt, kWarpSize))};
      }
    }
  }
  return {0, std::max(kWarpSize, round_up(std::min<int64_t>(hidden, kMaxThreads), kWarpSize))};
}

constexpr int kFwdMaxVpt = 8, kBwdMaxVpt = 4;

// Resident blocks of `k` on the whole device (at most `max_per_sm` per SM), into *out.
template <typename Kernel>
Status resident_blocks(Kernel k, int threads, int max_per_sm, int64_t* out) {
  int per_sm = 0, sms = 1;
#if PT_HIP
  PT_RETURN_IF_ERROR(hipOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, threads, 0));
#else
  PT_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, threads, 0));
#endif
  const Status st = device_sm_count(&sms);
  if (st != kOk) return st;
  *out = static_cast<int64_t>(std::min(std::max(per_sm, 1), max_per_sm)) * sms;
  return kOk;
}

// Forward of the "persist" plan (and the generic fallback of both plans).
template <typename T>
Status fwd_launch(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t hidden,
                  float eps, ptStream_t s) {
  const bool al = aligned16(x) && aligned16(w) && aligned16(y);
  const Plan p = make_plan<T>(al, hidden, kFwdMaxVpt, kMaxThreads);
  auto X = static_cast<const T*>(x);
  auto W = static_cast<const T*>(w);
  auto Y = static_cast<T*>(y);
  dim3 block(p.threads);
  if (p.vpt > 0) {
    int64_t cap = 1;
    Status st = kOk;
    switch (p.vpt) {
      case 1: st = resident_blocks(fwd_persist_kernel<T, 1>, p.threads, 32, &cap); break;
      case 2: st = resident_blocks(fwd_persist_kernel<T, 2>, p.threads, 32, &cap); break;
      case 4: st = resident_blocks(fwd_persist_kernel<T, 4>, p.threads, 32, &cap); break;
      default: st = resident_blocks(fwd_persist_kernel<T, 8>, p.threads, 32, &cap); break;
    }
    if (st != kOk) return st;
    dim3 grid(static_cast<unsigned>(std::max<int64_t>(1, std::min(rows, cap))));
    switch (p.vpt) {
      case 1: fwd_persist_kernel<T, 1><<<grid, block, 0, s>>>(X, W, Y, rstd, rows, hidden, eps); break;
      case 2: fwd_persist_kernel<T, 2><<<grid, block, 0, s>>>(X, W, Y, rstd, rows, hidden, eps); break;
      case 4: fwd_persist_kernel<T, 4><<<grid, block, 0, s>>>(X, W, Y, rstd, rows, hidden, eps); break;
      default: fwd_persist_kernel<T, 8><<<grid, block, 0, s>>>(X, W, Y, rstd, rows, hidden, eps);
    }
    PT_RETURN_LAUNCH_STATUS();
    return kOk;
  }
  dim3 grid(static_cast<unsigned>(rows));
  fwd_generic_kernel<T><<<grid, block, 0, s>>>(X, W, Y, rstd, hidden, eps);
  PT_RETURN_LAUNCH_STATUS();
  return kOk;
}

template <typename T>
Status fwd_dispatch(const void* x, const void* w, void* y, float* rstd, int64_t rows,
                    int64_t hidden, float eps, ptStream_t s) {
  const PlanKind kind = fwd_plan<T>(hidden);
  if (kind == PlanKind::kTiles || kind == PlanKind::kRows) {
    bool handled = false;
    const Status st =
        kind == PlanKind::kTiles
            ? rmsnorm_fwd_tiles(x, w, y, rstd, rows, hidden, eps, dtype_of<T>(), s, &handled)
            : rmsnorm_fwd_rows(x, w, y, rstd, rows, hidden, eps, dtype_of<T>(), s, &handled);
    if (st != kOk || handled) return st;
  }
  return fwd_launch<T>(x, w, y, rstd, rows, hidden, eps, s);
}

// dw from `nparts` partial rows (0: dw = 0).
template <typename T>
Status dw_reduce(const float* part, void* dw, int64_t nparts, int64_t hidden, ptStream_t s) {
  dim3 rgrid(static_cast<unsigned>((hidden + kRedCols - 1) / kRedCols)), rblock(kRedCols, kRedLanes);
#if !PT_HIP
  const int pdl = cached_env_int(g_pdl, "PRIMUS_TURBO_RMSNORM_CPP_PDL", kDefaultPdl, 0, 1);
  if (nparts > 0 && pdl == 1) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = rgrid;
    cfg.blockDim = rblock;
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const float* P = part;
    T* DW = static_cast<T*>(dw);
    if (cudaLaunchKernelEx(&cfg, dw_reduce_kernel<T>, P, DW, nparts, hidden) == cudaSuccess) {
      return kOk;
    }
    (void)cudaGetLastError();  // not supported here: the plain launch below
  }
#endif
  dw_reduce_kernel<T><<<rgrid, rblock, 0, s>>>(part, static_cast<T*>(dw), nparts, hidden);
  PT_RETURN_LAUNCH_STATUS();
  return kOk;
}

// Backward of the "persist" and "prev" plans (and the generic fallback of every plan): grid =
// number of dw partial rows = every SM filled with resident blocks, at most 4 per SM (enough
// loads in flight, while the fp32 dw partial rows stay a few percent of the traffic). The
// persistent kernel runs for VPT 1 and 2 (at VPT 4 its two row buffers plus the dw sums spill on
// sm_90), bwd_vec_kernel otherwise. The same functions size the scratch and the launch.
template <typename T>
Plan bwd_plan(bool aligned, int64_t hidden, PlanKind kind) {
  return make_plan<T>(aligned, hidden, kBwdMaxVpt, kind == PlanKind::kPersist ? kMaxThreads : 256);
}
inline bool bwd_persist(const Plan& p, PlanKind kind) {
  return kind == PlanKind::kPersist && (p.vpt == 1 || p.vpt == 2);
}

// The PERSIST_OCC kernels' launch bounds: 384 threads, 3 blocks per SM (56 registers on sm_90,
// no spills) or 4 (40 registers, a few bytes of spills in bf16/fp16).
constexpr int kOccThreads = 384;
// Blocks per SM the persist backward kernel is bounded to: 3 or 4, 0 = the 512-thread kernel.
inline int bwd_persist_occ(const Plan& p, PlanKind kind) {
  if (!bwd_persist(p, kind) || p.vpt != 1 || p.threads > kOccThreads) return 0;
  const int occ =
      cached_env_int(g_persist_occ, "PRIMUS_TURBO_RMSNORM_CPP_PERSIST_OCC", kDefaultPersistOcc, 1, 4);
  return occ >= 3 ? occ : 0;
}

template <typename T>
Status bwd_grid(const Plan& p, PlanKind kind, int64_t rows, int64_t* grid) {
  int64_t cap = 1;
  Status st = kOk;
  const bool persist = bwd_persist(p, kind);
  const int m = cached_env_int(g_persist_per_sm, "PRIMUS_TURBO_RMSNORM_CPP_PERSIST_PER_SM",
                               kDefaultPersistPerSm, 1, 8);
  switch (p.vpt) {
    case 1:
      switch (bwd_persist_occ(p, kind)) {
        case 3: st = resident_blocks(bwd_persist_kernel<T, 1, kOccThreads, 3>, p.threads, m, &cap); break;
        case 4: st = resident_blocks(bwd_persist_kernel<T, 1, kOccThreads, 4>, p.threads, m, &cap); break;
        default: st = persist ? resident_blocks(bwd_persist_kernel<T, 1>, p.threads, m, &cap)
                              : resident_blocks(bwd_vec_kernel<T, 1>, p.threads, m, &cap);
      }
      break;
    case 2: st = persist ? resident_blocks(bwd_persist_kernel<T, 2>, p.threads, m, &cap)
                         : resident_blocks(bwd_vec_kernel<T, 2>, p.threads, m, &cap); break;
    case 4: st = resident_blocks(bwd_vec_kernel<T, 4>, p.threads, m, &cap); break;
    default: st = resident_blocks(bwd_generic_kernel<T>, p.threads, m, &cap);
  }
  if (st != kOk) return st;
  *grid = balanced_grid(rows, cap);
  return kOk;
}

// Scratch rows for dw: the larger grid of the plan's vector path and the generic fallback, so a
// caller can size it before knowing which path the pointers allow.
template <typename T>
Status bwd_partials(int64_t rows, int64_t hidden, int64_t* nparts) {
  const PlanKind kind = bwd_plan_kind<T>(hidden);
  int64_t a = 1, b = 1;
  Status st = bwd_grid<T>(bwd_plan<T>(false, hidden, kind), kind, rows, &b);  // generic
  if (st != kOk) return st;
  if (kind == PlanKind::kTiles) {
    st = rmsnorm_bwd_tiles_partials(rows, hidden, dtype_of<T>(), &a);
  } else if (kind == PlanKind::kRows) {
    st = rmsnorm_bwd_rows_partials(rows, hidden, dtype_of<T>(), &a);
  } else {
    st = bwd_grid<T>(bwd_plan<T>(true, hidden, kind), kind, rows, &a);
  }
  if (st != kOk) return st;
  *nparts = std::max(a, b);
  return kOk;
}

template <typename T>
Status bwd_launch(const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                  void* dw, float* part, int64_t rows, int64_t hidden, ptStream_t s) {
  const PlanKind kind = bwd_plan_kind<T>(hidden);
  if (kind == PlanKind::kTiles || kind == PlanKind::kRows) {
    int64_t n = -1;
    const Status st =
        kind == PlanKind::kTiles
            ? rmsnorm_bwd_tiles(dy, x, w, rstd, dx, part, rows, hidden, dtype_of<T>(), s, &n)
            : rmsnorm_bwd_rows(dy, x, w, rstd, dx, part, rows, hidden, dtype_of<T>(), s, &n);
    if (st != kOk) return st;
    if (n >= 0) return dw_reduce<T>(part, dw, n, hidden, s);
  }
  const bool al = aligned16(dy) && aligned16(x) && aligned16(w) && aligned16(dx);
  // tiles/rows plan, path not applicable: the generic kernel (as sized by bwd_partials)
  const bool own = kind == PlanKind::kPersist || kind == PlanKind::kPrev;
  const Plan p = bwd_plan<T>(own && al, hidden, kind);
  int64_t g = 1;
  const Status st = bwd_grid<T>(p, kind, rows, &g);
  if (st != kOk) return st;
  auto DY = static_cast<const T*>(dy);
  auto X = static_cast<const T*>(x);
  auto W = static_cast<const T*>(w);
  auto DX = static_cast<T*>(dx);
  dim3 grid(static_cast<unsigned>(g)), block(p.threads);
  if (rows > 0) {
    const int occ = bwd_persist_occ(p, kind);
    if (occ == 3) {
      bwd_persist_kernel<T, 1, kOccThreads, 3><<<grid, block, 0, s>>>(DY, X, W, rstd, DX, part, rows, hidden);
    } else if (occ == 4) {
      bwd_persist_kernel<T, 1, kOccThreads, 4><<<grid, block, 0, s>>>(DY, X, W, rstd, DX, part, rows, hidden);
    } else if (bwd_persist(p, kind)) {
      if (p.vpt == 1) {
        bwd_persist_kernel<T, 1><<<grid, block, 0, s>>>(DY, X, W, rstd, DX, part, rows, hidden);
      } else {
        bwd_persist_kernel<T, 2><<<grid, block, 0, s>>>(DY, X, W, rstd, DX, part, rows, hidden);
      }
    } else {
      switch (p.vpt) {
        case 1: bwd_vec_kernel<T, 1><<<grid, block, 0, s>>>(DY, X, W, rstd, DX, part, rows, hidden); break;
        case 2: bwd_vec_kernel<T, 2><<<grid, block, 0, s>>>(DY, X, W, rstd, DX, part, rows, hidden); break;
        case 4: bwd_vec_kernel<T, 4><<<grid, block, 0, s>>>(DY, X, W, rstd, DX, part, rows, hidden); break;
        default: bwd_generic_kernel<T><<<grid, block, 0, s>>>(DY, X, W, rstd, DX, part, rows, hidden);
      }
    }
    PT_RETURN_LAUNCH_STATUS();
  }
  return dw_reduce<T>(part, dw, rows > 0 ? g : 0, hidden, s);
}

}  // namespace

Status rmsnorm_fwd_gpu(const void* x, const void* w, void* y, float* rstd, int64_t rows,
                       int64_t hidden, float eps, DType dtype, void* stream) noexcept {
  if (rows < 0 || hidden < 0) return kBadArgument;
  if (rows == 0 || hidden == 0) return kOk;
  auto s = static_cast<ptStream_t>(stream);
  return dispatch_dtype(dtype, [&](auto t) {
    return fwd_dispatch<decltype(t)>(x, w, y, rstd, rows, hidden, eps, s);
  });
}

void rmsnorm_gpu_reload_plans() noexcept {
  g_fwd_env.store(-1, std::memory_order_relaxed);
  g_bwd_env.store(-1, std::memory_order_relaxed);
  g_balance.store(-1, std::memory_order_relaxed);
  g_persist_occ.store(-1, std::memory_order_relaxed);
  g_persist_per_sm.store(-1, std::memory_order_relaxed);
  g_pdl.store(-1, std::memory_order_relaxed);
  rmsnorm_tiles_reload_knobs();
  rmsnorm_rows_reload_knobs();
}

Status rmsnorm_bwd_gpu_partials(int64_t rows, int64_t hidden, DType dtype,
                                int64_t* nparts) noexcept {
  *nparts = 1;
  if (rows < 0 || hidden < 0) return kBadArgument;
  if (rows == 0 || hidden == 0) return kOk;
  return dispatch_dtype(dtype, [&](auto t) {
    return bwd_partials<decltype(t)>(rows, hidden, nparts);
  });
}

Status rmsnorm_bwd_gpu(const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                       void* dw, float* dw_partial, int64_t rows, int64_t hidden, DType dtype,
                       void* stream) noexcept {
  if (rows < 0 || hidden < 0) return kBadArgument;
  if (hidden == 0) return kOk;
  auto s = static_cast<ptStream_t>(stream);
  return dispatch_dtype(dtype, [&](auto t) {
    return bwd_launch<decltype(t)>(dy, x, w, rstd, dx, dw, dw_partial, rows, hidden, s);
  });
}

}  // namespace primus_turbo
