// Torch glue shared by the GPU and Meta registrations of primus_turbo_cpp::grouped_gemm_bf16_nt_hopper
// (primus_turbo/grouped_gemm_hopper.h): argument checks. The output is the caller's.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "primus_turbo/grouped_gemm_hopper.h"

namespace primus_turbo::pytorch {

#define PT_GGH_CHECK(cond, ...) \
  TORCH_CHECK(cond, "primus_turbo_cpp.grouped_gemm_bf16_nt_hopper: ", __VA_ARGS__)

// a: bf16 [M, K] contiguous; b: bf16 [G, N, K] contiguous; offs: int64 [G + 1]; out: bf16 [M, N]
// contiguous; all on one device; N % 8 == 0, K % 8 == 0, G in [1, 1024], M and G * N < 2^31 - 256;
// cluster 1 or 2.
inline void check_grouped_gemm_hopper(const at::Tensor& a, const at::Tensor& b,
                                      const at::Tensor& offs, const at::Tensor& out,
                                      int64_t cluster, int64_t variant) {
  PT_GGH_CHECK(a.dim() == 2 && a.scalar_type() == at::kBFloat16 && a.is_contiguous(),
               "argument 'a' expected a contiguous 2-D bfloat16 tensor, got ", a.scalar_type(),
               " ", a.sizes());
  PT_GGH_CHECK(b.dim() == 3 && b.scalar_type() == at::kBFloat16 && b.is_contiguous(),
               "argument 'b' expected a contiguous 3-D bfloat16 tensor [G, N, K], got ",
               b.scalar_type(), " ", b.sizes());
  const int64_t m = a.size(0), k = a.size(1), g = b.size(0), n = b.size(1);
  PT_GGH_CHECK(b.size(2) == k, "argument 'b' expected K = ", k, " (a's columns), got ", b.size(2));
  PT_GGH_CHECK(g >= 1 && g <= kGroupedGemmHopperMaxGroups, "argument 'b' expected 1 to ",
               kGroupedGemmHopperMaxGroups, " groups, got ", g);
  PT_GGH_CHECK(n % 8 == 0 && k % 8 == 0 && k > 0, "expected N and K multiples of 8 (K > 0), got N=",
               n, " K=", k);
  constexpr int64_t kLimit = (int64_t{1} << 31) - 256;
  PT_GGH_CHECK(m < kLimit && g * n < kLimit, "expected M and G * N below 2^31 - 256, got M=", m,
               " G*N=", g * n);
  PT_GGH_CHECK(offs.dim() == 1 && offs.scalar_type() == at::kLong && offs.size(0) == g + 1,
               "argument 'offs' expected an int64 [", g + 1, "] tensor, got ", offs.scalar_type(),
               " ", offs.sizes());
  PT_GGH_CHECK(out.dim() == 2 && out.scalar_type() == at::kBFloat16 && out.is_contiguous() &&
                   out.size(0) == m && out.size(1) == n,
               "argument 'out' expected a contiguous bfloat16 [", m, ", ", n, "] tensor, got ",
               out.scalar_type(), " ", out.sizes());
  PT_GGH_CHECK(b.device() == a.device() && offs.device() == a.device() &&
                   out.device() == a.device(),
               "expected every tensor on ", a.device());
  PT_GGH_CHECK(cluster == 1 || cluster == 2, "argument 'cluster' expected 1 or 2, got ", cluster);
  PT_GGH_CHECK(variant >= 0 && variant <= 7, "argument 'variant' expected 0 to 7, got ", variant);
}

}  // namespace primus_turbo::pytorch
