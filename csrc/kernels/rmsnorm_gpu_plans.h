// Internal to the kernels library: the launch-plan names (env parsing) and the "tiles"
// (rmsnorm_tiles.cu) and "rows" (rmsnorm_rows.cu) plans of the RMSNorm GPU kernels, called by the
// public entry points in rmsnorm.cu. Each returns kOk without launching when its vector path does
// not apply (*handled false / *nparts -1): unaligned pointers, hidden not a multiple of 16 bytes,
// or rows longer than the register-cached path holds.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "primus_turbo/device.h"

namespace primus_turbo {

// Re-reads the tiles plan's PRIMUS_TURBO_RMSNORM_CPP_TILES_* knobs at their next use.
void rmsnorm_tiles_reload_knobs() noexcept;
Status rmsnorm_fwd_tiles(const void* x, const void* w, void* y, float* rstd, int64_t rows,
                         int64_t hidden, float eps, DType dtype, ptStream_t s,
                         bool* handled) noexcept;
// Partial dw rows the tiles backward writes for an aligned call (0 when it does not apply).
Status rmsnorm_bwd_tiles_partials(int64_t rows, int64_t hidden, DType dtype,
                                  int64_t* nparts) noexcept;
// Launches dx and the partial dw rows; *nparts = partial rows written, -1 when not handled.
Status rmsnorm_bwd_tiles(const void* dy, const void* x, const void* w, const float* rstd,
                         void* dx, float* part, int64_t rows, int64_t hidden, DType dtype,
                         ptStream_t s, int64_t* nparts) noexcept;

// "rows" plan (one warp per row, narrow rows): the forward (*handled false: not applicable);
// whether the backward applies to `hidden` (vector path, at most 16 vectors per lane), the
// partial dw rows it writes, and its launch (*nparts -1: not handled, e.g. unaligned pointers).
void rmsnorm_rows_reload_knobs() noexcept;  // PRIMUS_TURBO_RMSNORM_CPP_ROWS_WARPS
Status rmsnorm_fwd_rows(const void* x, const void* w, void* y, float* rstd, int64_t rows,
                        int64_t hidden, float eps, DType dtype, ptStream_t s,
                        bool* handled) noexcept;
bool rmsnorm_bwd_rows_applies(int64_t hidden, DType dtype) noexcept;
Status rmsnorm_bwd_rows_partials(int64_t rows, int64_t hidden, DType dtype,
                                 int64_t* nparts) noexcept;
Status rmsnorm_bwd_rows(const void* dy, const void* x, const void* w, const float* rstd,
                        void* dx, float* part, int64_t rows, int64_t hidden, DType dtype,
                        ptStream_t s, int64_t* nparts) noexcept;

// ---- launch plans ----------------------------------------------------------------------------
// PRIMUS_TURBO_RMSNORM_CPP_FWD_PLAN / PRIMUS_TURBO_RMSNORM_CPP_BWD_PLAN, else
// PRIMUS_TURBO_RMSNORM_CPP_PLAN (both directions), read once per process:
//   auto (default): per shape, from the H200 A/B runs (bf16, x0.9 copy target):
//     forward: tiles everywhere (16384x8192 0.96x copy, 7168 0.95, 4096 0.94, 2880 0.83; persist
//     0.91 / 0.91 / 0.92 / 0.38);
//     backward: tiles for rows longer than 8 KB (its defaults VPT 4, 3 blocks per SM: 16384x8192
//     0.92 vs persist 0.91, 7168 0.86 vs 0.86), persist up to 8 KB (4096: 0.60 vs tiles 0.52-0.58,
//     rows 0.55; at 2880 every plan is host-bound in those runs, 0.3-0.6x; rows is a narrow-row
//     kernel and does not apply above 4096 bf16 on NVIDIA).
//     Run 4.2 (graph device time) at 8192x2880 bf16: persist bwd 0.84x copy. Its VPT-1 kernel took
//     64 registers (384 threads: 2 blocks per SM, 264 blocks: 256 walk 31 rows, 8 walk a 32nd
//     alone); now PERSIST_OCC (3 per SM) + BALANCE (391 blocks x <= 21 rows), knobs below.
//   tiles: rmsnorm_tiles.cu. persist: the persistent kernels of rmsnorm.cu. rows: rmsnorm_rows.cu
//   (backward only; the forward takes auto's choice). prev: forward = persist, backward = the
//   non-persistent bwd_vec_kernel (4 blocks per SM).
// (PRIMUS_TURBO_RMSNORM_CPP_PERSIST=0, the oldest switch, still means "prev".) Where a plan's
// vector path does not apply (unaligned pointers, hidden % (16 / sizeof(T)) != 0), the generic
// scalar kernels run.
enum class PlanKind { kAuto, kTiles, kPersist, kPrev, kRows };

inline bool plan_starts(const char* v, const char* word) {
  for (; *word != '\0'; ++v, ++word) {
    if (*v != *word) return false;
  }
  return true;
}

inline PlanKind parse_plan(const char* v) {
  if (v == nullptr) return PlanKind::kAuto;
  if (plan_starts(v, "tiles")) return PlanKind::kTiles;
  if (plan_starts(v, "persist")) return PlanKind::kPersist;
  if (plan_starts(v, "prev")) return PlanKind::kPrev;
  if (plan_starts(v, "rows")) return PlanKind::kRows;
  return PlanKind::kAuto;  // "auto", empty or unknown
}

inline PlanKind env_plan(const char* direction_var) {
  const char* v = std::getenv(direction_var);
  if (v != nullptr && v[0] != '\0') return parse_plan(v);
  const char* old = std::getenv("PRIMUS_TURBO_RMSNORM_CPP_PERSIST");
  if (old != nullptr && old[0] == '0') return PlanKind::kPrev;
  return parse_plan(std::getenv("PRIMUS_TURBO_RMSNORM_CPP_PLAN"));
}

constexpr int64_t kNarrowRowBytes = 8192;  // auto backward: persist up to here (bf16 <= 4096)

// The environment's plan per direction, cached (-1: read at the next call; see
// rmsnorm_gpu_reload_plans). A race between two first calls reads the same value twice.
inline std::atomic<int> g_fwd_env{-1}, g_bwd_env{-1};

inline PlanKind cached_plan(std::atomic<int>& slot, const char* var) {
  int v = slot.load(std::memory_order_relaxed);
  if (v < 0) {
    v = static_cast<int>(env_plan(var));
    slot.store(v, std::memory_order_relaxed);
  }
  return static_cast<PlanKind>(v);
}

// Backward knobs shared by the persistent grids (cached like the plans; -1: read at next use):
//   PRIMUS_TURBO_RMSNORM_CPP_BALANCE (default 1): a persistent grid of at most `cap` blocks over
//     `work` units (rows / row tiles / row blocks) is shrunk to ceil(work / ceil(work / cap))
//     blocks: every block walks the same number of units (no last lap in which a few blocks run
//     alone: 8192 rows on 264 blocks = 256 x 31 + 8 x 32), and fewer dw partial rows. 0 = cap.
//   PRIMUS_TURBO_RMSNORM_CPP_PERSIST_OCC (default 3): the persist backward at VPT 1 with at most
//     384 threads per block uses the kernel bounded to 3 blocks of 384 threads per SM (<= 56
//     registers on sm_90, no spills) instead of 1 block of 512 (64 registers: 2 blocks per SM at
//     2880 bf16); 4 = bounded to 4 per SM (40 registers, 12-24 bytes of spills in bf16/fp16);
//     1 = the old kernel.
//   PRIMUS_TURBO_RMSNORM_CPP_PERSIST_PER_SM (default 4): persist/prev backward blocks per SM at
//     most (1..8).
//   PRIMUS_TURBO_RMSNORM_CPP_PDL (default 0; CUDA sm_90+ only): the dw reduce kernel is launched as
//     a programmatic dependent of the backward kernel (cudaLaunchKernelEx with programmatic
//     stream serialization; the backward kernels allow it at their start, the reduce waits with
//     griddepcontrol.wait for the backward grid's completion and memory flush), so its launch
//     latency hides behind the backward's last rows. HIP: ignored.
inline std::atomic<int> g_balance{-1}, g_persist_occ{-1}, g_persist_per_sm{-1}, g_pdl{-1};
// The knobs' defaults (one place to flip after an A/B run).
constexpr int kDefaultBalance = 1, kDefaultPersistOcc = 3, kDefaultPersistPerSm = 4,
              kDefaultPdl = 0;

// Programmatic dependent launch (sm_90 PTX griddepcontrol; no-ops elsewhere and when the grid was
// launched without the attribute). launch_dependents: the dependent grid may be scheduled once
// every block of this grid has executed it (or exited); wait: blocks until the grids this one
// depends on have completed and their memory is visible.
__device__ __forceinline__ void pdl_launch_dependents() {
#if !PT_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if !PT_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Streaming (evict-first) 16-byte accesses for data touched once: ld.global.cs / st.global.cs on
// CUDA; plain accesses on HIP.
template <typename T>
__device__ __forceinline__ void load16_stream(Vec16<T>& dst, const T* src) {
#if PT_HIP
  load16(dst, src);
#else
  dst.raw = __ldcs(reinterpret_cast<const uint4*>(src));
#endif
}
template <typename T>
__device__ __forceinline__ void store16_stream(T* dst, const Vec16<T>& src) {
#if PT_HIP
  store16(dst, src);
#else
  __stcs(reinterpret_cast<uint4*>(dst), src.raw);
#endif
}

inline int cached_env_int(std::atomic<int>& slot, const char* var, int def, int lo, int hi) {
  int v = slot.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv(var);
    v = e != nullptr && e[0] != '\0' ? std::atoi(e) : def;
    if (v < lo || v > hi) v = def;
    slot.store(v, std::memory_order_relaxed);
  }
  return v;
}

inline int64_t balanced_grid(int64_t work, int64_t cap) {
  const int64_t g = std::max<int64_t>(1, std::min(work, cap));
  if (work <= 0) return g;  // zero rows: one (idle) block, as before
  if (cached_env_int(g_balance, "PRIMUS_TURBO_RMSNORM_CPP_BALANCE", kDefaultBalance, 0, 1) == 0) {
    return g;
  }
  const int64_t per = (work + g - 1) / g;  // units per block at the cap
  return std::max<int64_t>(1, (work + per - 1) / per);
}

template <typename T>
PlanKind fwd_plan(int64_t hidden) {
  const PlanKind env = cached_plan(g_fwd_env, "PRIMUS_TURBO_RMSNORM_CPP_FWD_PLAN");
  if (env == PlanKind::kTiles || env == PlanKind::kPersist || env == PlanKind::kRows) return env;
  if (env == PlanKind::kPrev) return PlanKind::kPersist;
  (void)hidden;
  return PlanKind::kTiles;  // auto (falls back to persist / generic where tiles does not apply)
}

template <typename T>
constexpr DType dtype_of() {
  return sizeof(T) == 4 ? DType::kFloat32
                        : (std::is_same<T, pt_half>::value ? DType::kFloat16 : DType::kBFloat16);
}

template <typename T>
PlanKind bwd_plan_kind(int64_t hidden) {
  const PlanKind env = cached_plan(g_bwd_env, "PRIMUS_TURBO_RMSNORM_CPP_BWD_PLAN");
  if (env != PlanKind::kAuto) return env;
  const bool narrow = hidden * static_cast<int64_t>(sizeof(T)) <= kNarrowRowBytes;
  return narrow ? PlanKind::kPersist : PlanKind::kTiles;
}

}  // namespace primus_turbo
