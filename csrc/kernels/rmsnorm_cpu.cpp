// RMSNorm on the CPU (see primus_turbo/rmsnorm.h for the math). Rows are split across OpenMP
// threads; dw uses fixed row blocks (their size depends only on `rows`), so the result does not
// depend on the thread count.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "primus_turbo/rmsnorm.h"

namespace primus_turbo {
namespace {

// bf16: the upper half of an fp32; stores round to nearest even (NaN kept quiet).
inline float bf16_to_float(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

struct F32 {
  using T = float;
  static float load(T v) { return v; }
  static T store(float v) { return v; }
};
struct F16 {
  using T = _Float16;
  static float load(T v) { return static_cast<float>(v); }
  static T store(float v) { return static_cast<T>(v); }
};
struct BF16 {
  using T = uint16_t;
  static float load(T v) { return bf16_to_float(v); }
  static T store(float v) { return float_to_bf16(v); }
};

constexpr int64_t kRowsPerBlock = 64;

template <typename C>
void fwd(const void* xp, const void* wp, void* yp, float* rstd, int64_t rows, int64_t hidden,
         float eps) {
  using T = typename C::T;
  const T* x = static_cast<const T*>(xp);
  const T* w = static_cast<const T*>(wp);
  T* y = static_cast<T*>(yp);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * hidden;
    T* yr = y + r * hidden;
    float ss = 0.f;
    for (int64_t h = 0; h < hidden; ++h) {
      float v = C::load(xr[h]);
      ss += v * v;
    }
    const float rs = 1.f / std::sqrt(ss / static_cast<float>(hidden) + eps);
    rstd[r] = rs;
    for (int64_t h = 0; h < hidden; ++h) yr[h] = C::store(C::load(xr[h]) * rs * C::load(w[h]));
  }
}

template <typename C>
void bwd(const void* dyp, const void* xp, const void* wp, const float* rstd, void* dxp, void* dwp,
         float* part, int64_t rows, int64_t hidden) {
  using T = typename C::T;
  const T* dy = static_cast<const T*>(dyp);
  const T* x = static_cast<const T*>(xp);
  const T* w = static_cast<const T*>(wp);
  T* dx = static_cast<T*>(dxp);
  const int64_t nblocks = rmsnorm_bwd_cpu_partials(rows);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nblocks; ++b) {
    float* pb = part + b * hidden;
    for (int64_t h = 0; h < hidden; ++h) pb[h] = 0.f;
    const int64_t r_end = (b + 1) * kRowsPerBlock < rows ? (b + 1) * kRowsPerBlock : rows;
    for (int64_t r = b * kRowsPerBlock; r < r_end; ++r) {
      const T* xr = x + r * hidden;
      const T* gr = dy + r * hidden;
      const float rs = rstd[r];
      float dot = 0.f;
      for (int64_t h = 0; h < hidden; ++h) {
        const float xh = C::load(xr[h]) * rs;
        const float g = C::load(gr[h]);
        dot += xh * g * C::load(w[h]);
        pb[h] += g * xh;
      }
      const float mean = dot / static_cast<float>(hidden);
      T* dxr = dx + r * hidden;
      for (int64_t h = 0; h < hidden; ++h) {
        const float xh = C::load(xr[h]) * rs;
        dxr[h] = C::store(rs * (C::load(w[h]) * C::load(gr[h]) - xh * mean));
      }
    }
  }
  T* dw = static_cast<T*>(dwp);
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < hidden; ++h) {
    float s = 0.f;
    for (int64_t b = 0; b < nblocks; ++b) s += part[b * hidden + h];  // fixed order
    dw[h] = C::store(s);
  }
}

}  // namespace

int64_t rmsnorm_bwd_cpu_partials(int64_t rows) noexcept {
  const int64_t n = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  return n > 0 ? n : 1;
}

Status rmsnorm_fwd_cpu(const void* x, const void* w, void* y, float* rstd, int64_t rows,
                       int64_t hidden, float eps, DType dtype) noexcept {
  if (rows < 0 || hidden < 0) return kBadArgument;
  switch (dtype) {
    case DType::kFloat32: fwd<F32>(x, w, y, rstd, rows, hidden, eps); return kOk;
    case DType::kFloat16: fwd<F16>(x, w, y, rstd, rows, hidden, eps); return kOk;
    case DType::kBFloat16: fwd<BF16>(x, w, y, rstd, rows, hidden, eps); return kOk;
  }
  return kUnsupportedDType;
}

Status rmsnorm_bwd_cpu(const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                       void* dw, float* dw_partial, int64_t rows, int64_t hidden,
                       DType dtype) noexcept {
  if (rows < 0 || hidden < 0) return kBadArgument;
  switch (dtype) {
    case DType::kFloat32: bwd<F32>(dy, x, w, rstd, dx, dw, dw_partial, rows, hidden); return kOk;
    case DType::kFloat16: bwd<F16>(dy, x, w, rstd, dx, dw, dw_partial, rows, hidden); return kOk;
    case DType::kBFloat16:
      bwd<BF16>(dy, x, w, rstd, dx, dw, dw_partial, rows, hidden);
      return kOk;
  }
  return kUnsupportedDType;
}

}  // namespace primus_turbo
