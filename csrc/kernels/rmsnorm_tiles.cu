// RMSNorm on the GPU, "tiles" launch plan (auto's forward, and backward above 8 KB rows; math in
// primus_turbo/rmsnorm.h).
//
// A row is handled by a group of TPR threads (a multiple of the warp size); a block holds RPB
// such row groups (blockDim = (TPR, RPB)). Each thread keeps VPT 16-byte vectors of its row in
// registers, so x (and dy) are read once. VPT is chosen large (4-8 forward, 4 backward) and
// TPR small, so every thread has several independent 16-byte loads in flight and a row needs at
// most a few warps: the row reduction is a warp shuffle plus, across the group's warps, one shared
// memory exchange. Compared with one 512-thread block per row (one vector per thread), this keeps
// about 4-8x more bytes in flight per SM at hidden 2880-8192, which is what a bandwidth-bound
// kernel needs (Little's law: ~30 KB per SM on an H200).
//
// Forward: one row per group, grid = rows / RPB (no persistence: enough resident blocks hide the
// reduction). Backward: a persistent grid (resident blocks x SMs, capped by the row tiles) walks
// row tiles with stride gridDim.x; the next tile's x/dy/rstd are loaded before the current row's
// reduction (VPT <= 2). dw: each group keeps fp32 sums in registers; at the end the block adds its
// groups in a fixed order through shared memory and writes ONE partial row per block (fewer
// partial rows than one per group: less fp32 traffic); rmsnorm.cu's reduce kernel sums the
// partial rows in a fixed order. Deterministic for a given device and shape.
#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "primus_turbo/device.h"
#include "rmsnorm_gpu_plans.h"

namespace primus_turbo {
namespace {

constexpr int kMaxThreads = 512;
constexpr int kScratch = kMaxThreads / kWarpSize;
constexpr int kBlockTarget = 256;  // threads per block the row groups are packed up to

// Sum over one row group (the blockDim.x threads of this threadIdx.y); every thread of the group
// gets it. Fixed order: deterministic. Called by every thread of the block (it may synchronise).
__device__ __forceinline__ float group_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int nw = blockDim.x / kWarpSize;
  if (nw == 1) return v;  // uniform over the block
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  float* s = scratch + threadIdx.y * nw;
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) s[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int k = 0; k < nw; ++k) t += s[k];
  return t;
}

// MODE (PRIMUS_TURBO_RMSNORM_CPP_TILES_FWD_MODE, a bit set; 0 = the original kernel):
//   1: the weight vectors are loaded with x, before the row reduction (their latency hides behind
//      the reduction instead of sitting between it and the stores; + 4 x VPT registers);
//   2: streaming cache hints: x read once with ld.global.cs (evict first), y written with
//      st.global.cs (CUDA; plain accesses on HIP), so the L2 keeps the weight.
//   4: the kernel is compiled for blocks of at most kFwdBoundThreads threads, kFwdBoundBlocks of
//      them per SM (48 registers on sm_90 instead of 60 for bf16 VPT 4, no spills: 5 blocks of 256
//      per SM instead of 4); used only at VPT <= 4 with blocks of at most kFwdBoundThreads
//      threads. With bit 4, bit 1 is dropped (5 -> 4, 7 -> 6: the bounded kernel would spill the
//      preloaded weight, 130-200 bytes).
constexpr int kFwdBoundThreads = 256, kFwdBoundBlocks = 5;
template <typename T, int VPT, int MODE>
__global__ void __launch_bounds__((MODE & 4) != 0 ? kFwdBoundThreads : kMaxThreads,
                                  (MODE & 4) != 0 ? kFwdBoundBlocks : 1)
    fwd_tile_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                    float* __restrict__ rstd, int64_t rows, int nvec, float inv_h, float eps) {
  __shared__ float scratch[kScratch];
  constexpr int N = Vec16<T>::N;
  constexpr bool kPreW = (MODE & 1) != 0, kStream = (MODE & 2) != 0;
  const int64_t hidden = static_cast<int64_t>(nvec) * N;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool valid = row < rows;
  Vec16<T> xv[VPT], wv[kPreW ? VPT : 1];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = static_cast<int>(threadIdx.x) + i * static_cast<int>(blockDim.x);
    xv[i].raw = make_uint4(0, 0, 0, 0);
    if (valid && v < nvec) {
      const T* src = x + row * hidden + static_cast<int64_t>(v) * N;
      if (kStream) {
        load16_stream(xv[i], src);
      } else {
        load16(xv[i], src);
      }
    }
    if (kPreW) {
      wv[i % (kPreW ? VPT : 1)].raw = make_uint4(0, 0, 0, 0);
      if (valid && v < nvec) load16(wv[i % (kPreW ? VPT : 1)], w + static_cast<int64_t>(v) * N);
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float f = to_float(xv[i].v()[j]);  // zero where v >= nvec
      ss += f * f;
    }
  }
#if !PT_HIP
  if ((MODE & 4) != 0) {
    // The packed x registers are "redefined" here, so the compiler cannot carry the fp32
    // conversions of the sum across the reduction (2x the registers for 16-bit types): the
    // epilogue converts again from the packed values.
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      asm volatile("" : "+r"(xv[i].raw.x), "+r"(xv[i].raw.y), "+r"(xv[i].raw.z), "+r"(xv[i].raw.w));
    }
  }
#endif
  ss = group_sum(ss, scratch);
  if (!valid) return;  // after the last barrier
  const float rs = rsqrtf(ss * inv_h + eps);
  if (threadIdx.x == 0) rstd[row] = rs;
  T* yr = y + row * hidden;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = static_cast<int>(threadIdx.x) + i * static_cast<int>(blockDim.x);
    if (v < nvec) {
      Vec16<T> wl, out;
      if (kPreW) {
        wl = wv[i % (kPreW ? VPT : 1)];
      } else {
        load16(wl, w + static_cast<int64_t>(v) * N);
      }
#pragma unroll
      for (int j = 0; j < N; ++j) {
        out.v()[j] = from_float<T>(to_float(xv[i].v()[j]) * rs * to_float(wl.v()[j]));
      }
      if (kStream) {
        store16_stream(yr + static_cast<int64_t>(v) * N, out);
      } else {
        store16(yr + static_cast<int64_t>(v) * N, out);
      }
    }
  }
}

// `red` (dynamic shared memory, hidden floats) is used only when blockDim.y > 1.
template <typename T, int VPT>
__global__ void __launch_bounds__(kMaxThreads)
    bwd_tile_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* w,
                    const float* __restrict__ rstd, T* __restrict__ dx,
                    float* __restrict__ part, int64_t rows, int nvec, float inv_h) {
  __shared__ float scratch[kScratch];
  extern __shared__ float red[];
  pdl_launch_dependents();  // the dw reduce (PRIMUS_TURBO_RMSNORM_CPP_PDL); a no-op otherwise
  constexpr int N = Vec16<T>::N;
  constexpr bool kPrefetch = VPT <= 2;  // at VPT 4 the second buffer would spill
  const int64_t hidden = static_cast<int64_t>(nvec) * N;
  const int64_t tiles = (rows + blockDim.y - 1) / blockDim.y;
  const int tx = static_cast<int>(threadIdx.x), bx = static_cast<int>(blockDim.x);
  float acc[VPT][N];
  Vec16<T> xv[VPT], gv[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
#pragma unroll
    for (int j = 0; j < N; ++j) acc[i][j] = 0.f;
  }
  auto load_row = [&](int64_t tile, Vec16<T>* xb, Vec16<T>* gb, float& rs) {
    const int64_t r = tile * blockDim.y + threadIdx.y;
    const bool ok = tile < tiles && r < rows;
    rs = ok ? rstd[r] : 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = tx + i * bx;
      xb[i].raw = make_uint4(0, 0, 0, 0);
      gb[i].raw = make_uint4(0, 0, 0, 0);
      if (ok && v < nvec) {
        load16(xb[i], x + r * hidden + static_cast<int64_t>(v) * N);
        load16(gb[i], dy + r * hidden + static_cast<int64_t>(v) * N);
      }
    }
  };
  float rs = 0.f;
  int64_t tile = blockIdx.x;
  if (kPrefetch) load_row(tile, xv, gv, rs);
  for (; tile < tiles; tile += gridDim.x) {  // uniform over the block: barriers are safe
    if (!kPrefetch) load_row(tile, xv, gv, rs);
    const int64_t r = tile * blockDim.y + threadIdx.y;
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = tx + i * bx;
      Vec16<T> wv;
      wv.raw = make_uint4(0, 0, 0, 0);
      if (v < nvec) load16(wv, w + static_cast<int64_t>(v) * N);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float xh = to_float(xv[i].v()[j]) * rs;  // zero for a missing row or v >= nvec
        const float g = to_float(gv[i].v()[j]);
        dot += xh * g * to_float(wv.v()[j]);
        acc[i][j] += g * xh;
      }
    }
    Vec16<T> xn[kPrefetch ? VPT : 1], gn[kPrefetch ? VPT : 1];
    float rs_next = 0.f;
    if (kPrefetch) load_row(tile + gridDim.x, xn, gn, rs_next);
    const float mean = group_sum(dot, scratch) * inv_h;
    if (r < rows) {
      T* dxr = dx + r * hidden;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int v = tx + i * bx;
        if (v < nvec) {
          Vec16<T> wv, out;
          load16(wv, w + static_cast<int64_t>(v) * N);
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const float xh = to_float(xv[i].v()[j]) * rs;
            out.v()[j] = from_float<T>(
                rs * (to_float(wv.v()[j]) * to_float(gv[i].v()[j]) - xh * mean));
          }
          store16(dxr + static_cast<int64_t>(v) * N, out);
        }
      }
    }
    if (kPrefetch) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        xv[i] = xn[i % (kPrefetch ? VPT : 1)];
        gv[i] = gn[i % (kPrefetch ? VPT : 1)];
      }
      rs = rs_next;
    }
  }
  // Block partial row = sum of the groups' sums, groups added in order 0, 1, ... (deterministic).
  float* pb = part + static_cast<int64_t>(blockIdx.x) * hidden;
  for (int g = 1; g < static_cast<int>(blockDim.y); ++g) {
    __syncthreads();
    if (static_cast<int>(threadIdx.y) == g) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int v = tx + i * bx;
        if (v < nvec) {
#pragma unroll
          for (int j = 0; j < N; ++j) red[v * N + j] = acc[i][j];
        }
      }
    }
    __syncthreads();
    if (threadIdx.y == 0) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int v = tx + i * bx;
        if (v < nvec) {
#pragma unroll
          for (int j = 0; j < N; ++j) acc[i][j] += red[v * N + j];
        }
      }
    }
  }
  if (threadIdx.y != 0) return;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = tx + i * bx;
    if (v < nvec) {
#pragma unroll
      for (int j = 0; j < N; j += 4) {
        *reinterpret_cast<float4*>(pb + static_cast<int64_t>(v) * N + j) =
            make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
      }
    }
  }
}

inline int round_up(int64_t v, int m) { return static_cast<int>((v + m - 1) / m * m); }
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

struct TilePlan {
  int vpt = 0;  // 0: the tiles path does not apply
  int tpr = 0;  // threads per row group
  int rpb = 1;  // row groups per block
};

// VPT: the largest power of two <= pref_vpt whose row group fits kMaxThreads and leaves under 1/8
// of the vector slots idle (2880 bf16 = 360 vectors: VPT 4 -> 96 threads, 384 slots), else the
// one with the fewest idle slots; rows longer than pref_vpt * kMaxThreads vectors take the
// smallest VPT <= max_vpt that fits. Then as many row groups per block as fit kBlockTarget.
// (pref_vpt 4 forward: 60 registers for bf16, so ~1000 resident threads x 64 B in flight per SM;
// VPT 8 needs 105. Backward 4: no row prefetch, which at VPT 4 would spill; VPT 2 prefetches.)
template <typename T>
TilePlan tile_plan(int64_t hidden, int pref_vpt, int max_vpt, int block_target) {
  constexpr int N = Vec16<T>::N;
  TilePlan p;
  if (hidden <= 0 || hidden % N != 0) return p;
  const int64_t nvec = hidden / N;
  if (nvec > static_cast<int64_t>(max_vpt) * kMaxThreads) return p;
  if (nvec > static_cast<int64_t>(pref_vpt) * kMaxThreads) {
    int vpt = pref_vpt;
    while (nvec > static_cast<int64_t>(vpt) * kMaxThreads) vpt *= 2;
    p.vpt = vpt, p.tpr = round_up((nvec + vpt - 1) / vpt, kWarpSize);
  } else {
    int64_t best_idle = -1;
    for (int vpt = pref_vpt; vpt >= 1; vpt /= 2) {
      const int tpr = std::max(kWarpSize, round_up((nvec + vpt - 1) / vpt, kWarpSize));
      if (tpr > kMaxThreads) break;  // smaller VPTs need even more threads
      const int64_t idle = static_cast<int64_t>(tpr) * vpt - nvec;
      if (idle * 8 < static_cast<int64_t>(tpr) * vpt) {
        p.vpt = vpt, p.tpr = tpr;
        break;
      }
      if (best_idle < 0 || idle < best_idle) best_idle = idle, p.vpt = vpt, p.tpr = tpr;
    }
  }
  p.rpb = std::max(1, block_target / p.tpr);
  return p;
}

// Backward VPT 4 (no row prefetch) with at most 3 blocks per SM: the H200 A/B best (16384x8192
// 0.92x copy vs 0.88 at VPT 2 / 2 per SM; 8192x7168 0.86 vs 0.83). Each block writes one fp32
// partial dw row (3 per SM at 8192x7168: ~2% of the bytes).
constexpr int kFwdPrefVpt = 4, kFwdMaxVpt = 8, kBwdPrefVpt = 4, kBwdMaxVpt = 4;
constexpr int kBwdMaxPerSm = 3;

// Experiment knobs of this plan (benchmarks; unset = the constants above), cached until
// rmsnorm_gpu_reload_plans: PRIMUS_TURBO_RMSNORM_CPP_TILES_FWD_VPT / _TILES_BWD_VPT (preferred
// VPT, a power of two <= 8 / <= 4), _TILES_BLOCK (threads a block packs row groups up to,
// 32..512) and _TILES_BWD_PER_SM (backward blocks per SM at most, 1..8).
// _TILES_FWD_MODE (0..7, default kDefaultFwdMode): the forward kernel's MODE bits (see
// fwd_tile_kernel: 1 = weight loaded before the reduction, 2 = streaming x loads / y stores,
// 4 = register-bounded kernel, 5 blocks of 256 per SM; 5 and 7 run as 4 and 6).
std::atomic<int> g_knobs[5] = {{-1}, {-1}, {-1}, {-1}, {-1}};  // -1: read at the next use
const char* const kKnobVars[5] = {
    "PRIMUS_TURBO_RMSNORM_CPP_TILES_FWD_VPT", "PRIMUS_TURBO_RMSNORM_CPP_TILES_BWD_VPT",
    "PRIMUS_TURBO_RMSNORM_CPP_TILES_BLOCK", "PRIMUS_TURBO_RMSNORM_CPP_TILES_BWD_PER_SM",
    "PRIMUS_TURBO_RMSNORM_CPP_TILES_FWD_MODE"};
constexpr int kDefaultFwdMode = 0;  // the H200 A/B of modes 1-6 is pending
inline int env_int(int knob, int def, int lo, int hi) {
  int n = g_knobs[knob].load(std::memory_order_relaxed);
  if (n < 0) {
    const char* v = std::getenv(kKnobVars[knob]);
    n = v != nullptr && v[0] != '\0' ? std::atoi(v) : 0;  // 0: unset
    g_knobs[knob].store(n < 0 ? 0 : n, std::memory_order_relaxed);
  }
  return n < lo || n > hi ? def : n;
}
inline int pow2_floor(int v) {
  int p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}
template <typename T>
TilePlan fwd_tile_plan(int64_t hidden) {
  const int vpt = pow2_floor(env_int(0, kFwdPrefVpt, 1, 8));
  const int block = env_int(2, kBlockTarget, 32, kMaxThreads);
  return tile_plan<T>(hidden, vpt, kFwdMaxVpt, block);
}
template <typename T>
TilePlan bwd_tile_plan(int64_t hidden) {
  const int vpt = pow2_floor(env_int(1, kBwdPrefVpt, 1, 4));
  const int block = env_int(2, kBlockTarget, 32, kMaxThreads);
  return tile_plan<T>(hidden, vpt, kBwdMaxVpt, block);
}

template <typename T, int MODE>
void launch_fwd_tiles(const TilePlan& p, dim3 grid, dim3 block, ptStream_t s, const T* X,
                      const T* W, T* Y, float* rstd, int64_t rows, int nvec, float inv_h,
                      float eps) {
  if ((MODE & 4) != 0 && (p.vpt > 4 || p.tpr * p.rpb > kFwdBoundThreads)) {
    launch_fwd_tiles<T, MODE & 3>(p, grid, block, s, X, W, Y, rstd, rows, nvec, inv_h, eps);
    return;
  }
  constexpr int kV8 = (MODE & 4) != 0 ? 4 : 8;  // bounded kernels: VPT <= 4 only
  switch (p.vpt) {
    case 1: fwd_tile_kernel<T, 1, MODE><<<grid, block, 0, s>>>(X, W, Y, rstd, rows, nvec, inv_h, eps); break;
    case 2: fwd_tile_kernel<T, 2, MODE><<<grid, block, 0, s>>>(X, W, Y, rstd, rows, nvec, inv_h, eps); break;
    case 4: fwd_tile_kernel<T, 4, MODE><<<grid, block, 0, s>>>(X, W, Y, rstd, rows, nvec, inv_h, eps); break;
    default: fwd_tile_kernel<T, kV8, MODE><<<grid, block, 0, s>>>(X, W, Y, rstd, rows, nvec, inv_h, eps);
  }
}

template <typename T>
Status fwd_tiles(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t hidden,
                 float eps, ptStream_t s, bool* handled) {
  *handled = false;
  const TilePlan p = fwd_tile_plan<T>(hidden);
  if (p.vpt == 0 || !aligned16(x) || !aligned16(w) || !aligned16(y)) return kOk;
  *handled = true;
  const int nvec = static_cast<int>(hidden / Vec16<T>::N);
  const float inv_h = 1.f / static_cast<float>(hidden);
  auto X = static_cast<const T*>(x);
  auto W = static_cast<const T*>(w);
  auto Y = static_cast<T*>(y);
  const dim3 block(p.tpr, p.rpb);
  const dim3 grid(static_cast<unsigned>((rows + p.rpb - 1) / p.rpb));
  const int mode = env_int(4, kDefaultFwdMode, 0, 7);
  switch (mode) {
    case 7:  // bit 1 is dropped with bit 4: the bounded kernel would spill its weight registers
    case 6: launch_fwd_tiles<T, 6>(p, grid, block, s, X, W, Y, rstd, rows, nvec, inv_h, eps); break;
    case 5:
    case 4: launch_fwd_tiles<T, 4>(p, grid, block, s, X, W, Y, rstd, rows, nvec, inv_h, eps); break;
    case 1: launch_fwd_tiles<T, 1>(p, grid, block, s, X, W, Y, rstd, rows, nvec, inv_h, eps); break;
    case 2: launch_fwd_tiles<T, 2>(p, grid, block, s, X, W, Y, rstd, rows, nvec, inv_h, eps); break;
    case 3: launch_fwd_tiles<T, 3>(p, grid, block, s, X, W, Y, rstd, rows, nvec, inv_h, eps); break;
    default: launch_fwd_tiles<T, 0>(p, grid, block, s, X, W, Y, rstd, rows, nvec, inv_h, eps);
  }
  PT_RETURN_LAUNCH_STATUS();
  return kOk;
}

template <typename T, int VPT>
Status bwd_grid_of(const TilePlan& p, int64_t rows, size_t smem, int64_t* grid) {
  int per_sm = 0, sms = 1;
#if PT_HIP
  PT_RETURN_IF_ERROR(hipOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, bwd_tile_kernel<T, VPT>, p.tpr * p.rpb, smem));
#else
  PT_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, bwd_tile_kernel<T, VPT>, p.tpr * p.rpb, smem));
#endif
  const Status st = device_sm_count(&sms);
  if (st != kOk) return st;
  const int64_t tiles = (rows + p.rpb - 1) / p.rpb;
  const int per_sm_cap = env_int(3, kBwdMaxPerSm, 1, 8);
  const int64_t per = std::min(std::max(per_sm, 1), per_sm_cap);
  *grid = balanced_grid(tiles, per * sms);  // PRIMUS_TURBO_RMSNORM_CPP_BALANCE
  return kOk;
}

template <typename T>
size_t bwd_smem(const TilePlan& p, int64_t hidden) {
  return p.rpb > 1 ? static_cast<size_t>(hidden) * sizeof(float) : 0;
}

template <typename T>
Status bwd_grid(const TilePlan& p, int64_t rows, int64_t hidden, int64_t* grid) {
  const size_t smem = bwd_smem<T>(p, hidden);
  switch (p.vpt) {
    case 1: return bwd_grid_of<T, 1>(p, rows, smem, grid);
    case 2: return bwd_grid_of<T, 2>(p, rows, smem, grid);
    default: return bwd_grid_of<T, 4>(p, rows, smem, grid);
  }
}

template <typename T>
Status bwd_tiles_partials(int64_t rows, int64_t hidden, int64_t* nparts) {
  *nparts = 0;
  const TilePlan p = bwd_tile_plan<T>(hidden);
  if (p.vpt == 0 || rows <= 0) return kOk;
  return bwd_grid<T>(p, rows, hidden, nparts);
}

template <typename T>
Status bwd_tiles(const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                 float* part, int64_t rows, int64_t hidden, ptStream_t s, int64_t* nparts) {
  *nparts = -1;  // not handled
  const TilePlan p = bwd_tile_plan<T>(hidden);
  if (p.vpt == 0 || rows <= 0 || !aligned16(dy) || !aligned16(x) || !aligned16(w) ||
      !aligned16(dx)) {
    return kOk;
  }
  int64_t g = 1;
  const Status st = bwd_grid<T>(p, rows, hidden, &g);
  if (st != kOk) return st;
  *nparts = g;
  const int nvec = static_cast<int>(hidden / Vec16<T>::N);
  const float inv_h = 1.f / static_cast<float>(hidden);
  auto DY = static_cast<const T*>(dy);
  auto X = static_cast<const T*>(x);
  auto W = static_cast<const T*>(w);
  auto DX = static_cast<T*>(dx);
  const dim3 block(p.tpr, p.rpb), grid(static_cast<unsigned>(g));
  const size_t smem = bwd_smem<T>(p, hidden);
  switch (p.vpt) {
    case 1: bwd_tile_kernel<T, 1><<<grid, block, smem, s>>>(DY, X, W, rstd, DX, part, rows, nvec, inv_h); break;
    case 2: bwd_tile_kernel<T, 2><<<grid, block, smem, s>>>(DY, X, W, rstd, DX, part, rows, nvec, inv_h); break;
    default: bwd_tile_kernel<T, 4><<<grid, block, smem, s>>>(DY, X, W, rstd, DX, part, rows, nvec, inv_h);
  }
  PT_RETURN_LAUNCH_STATUS();
  return kOk;
}

}  // namespace

void rmsnorm_tiles_reload_knobs() noexcept {
  for (auto& k : g_knobs) k.store(-1, std::memory_order_relaxed);
}

Status rmsnorm_fwd_tiles(const void* x, const void* w, void* y, float* rstd, int64_t rows,
                         int64_t hidden, float eps, DType dtype, ptStream_t s,
                         bool* handled) noexcept {
  return dispatch_dtype(dtype, [&](auto t) {
    return fwd_tiles<decltype(t)>(x, w, y, rstd, rows, hidden, eps, s, handled);
  });
}

Status rmsnorm_bwd_tiles_partials(int64_t rows, int64_t hidden, DType dtype,
                                  int64_t* nparts) noexcept {
  return dispatch_dtype(dtype, [&](auto t) {
    return bwd_tiles_partials<decltype(t)>(rows, hidden, nparts);
  });
}

Status rmsnorm_bwd_tiles(const void* dy, const void* x, const void* w, const float* rstd,
                         void* dx, float* part, int64_t rows, int64_t hidden, DType dtype,
                         ptStream_t s, int64_t* nparts) noexcept {
  return dispatch_dtype(dtype, [&](auto t) {
    return bwd_tiles<decltype(t)>(dy, x, w, rstd, dx, part, rows, hidden, s, nparts);
  });
}

}  // namespace primus_turbo
