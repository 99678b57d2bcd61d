// Device helpers shared by the NVIDIA fp8 cast kernels (quant_dual.cu, quant_dual_mx.cu,
// quant_tw_delayed.cu): bf16 halves of a 32-bit word to fp32, two fp32 to two fp8 bytes with the
// conversion Triton emits on sm_89+, the per-lane row / column maxima of a register tile
// (lane_amax), the 8-rows-per-lane tile load (load_lane_rows8) and the row-byte packing of the
// two-copy walks (put_row_pair). Include
// inside the kernels' anonymous namespace of the CUDA (non-HIP) branch.
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

// Per-lane maxima of a register tile d (R rows x 4 words, two bf16 per word) under the monotone
// u16x2 key KEY (|x| bits for the 1x128 recipe, exponent fields for MX): rk[p] = rows 2p and
// 2p + 1 as u16x2 halves, cm[i] = columns 2i and 2i + 1 over the R rows.
template <uint32_t (*KEY)(uint32_t), int R>
__device__ __forceinline__ void lane_amax(const uint32_t (&d)[R][4], uint32_t (&rk)[R / 2],
                                          uint32_t (&cm)[4]) {
  uint32_t r[R];
#pragma unroll
  for (int j = 0; j < R; ++j) {
    uint32_t k[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      k[i] = KEY(d[j][i]);
      cm[i] = j == 0 ? k[i] : __vmaxu2(cm[i], k[i]);
    }
    r[j] = __vmaxu2(__vmaxu2(k[0], k[1]), __vmaxu2(k[2], k[3]));
  }
#pragma unroll
  for (int p = 0; p < R / 2; ++p) {
    rk[p] = __vmaxu2(__byte_perm(r[2 * p], r[2 * p + 1], 0x5410),
                     __byte_perm(r[2 * p], r[2 * p + 1], 0x7632));
  }
}

// The 8 x 16-byte vectors of a lane in the 8-rows-per-lane tile layouts (quant_dual.cu's t,
// quant_tw_delayed.cu's dual kernel): rows row0 .. row0 + 7 of bf16 columns col .. col + 7 of a
// row-major [M, N] x (N % 8 == 0: a vector is wholly in or out), zero outside x.
__device__ __forceinline__ void load_lane_rows8(uint32_t (&d)[8][4], const uint16_t* __restrict__ x,
                                                int M, int N, int row0, int col) {
  const bool col_ok = col < N;
  const uint4* src = reinterpret_cast<const uint4*>(x + (col_ok ? int64_t{row0} * N + col : 0));
  const int step = N / 8;  // one row in uint4
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint4 u = make_uint4(0u, 0u, 0u, 0u);
    if (col_ok && row0 + j < M) u = src[j * step];
    d[j][0] = u.x;
    d[j][1] = u.y;
    d[j][2] = u.z;
    d[j][3] = u.w;
  }
}

// The row bytes of the two-copy walks (quant_dual.cu's t, quant_mx_tile.cuh): r0 / r1 hold rows
// 2p / 2p + 1's two fp8 bytes of column pair i; ra[row][h] collects columns 4h .. 4h + 3.
template <int R>
__device__ __forceinline__ void put_row_pair(uint32_t (&ra)[R][2], int p, int i, uint32_t r0,
                                             uint32_t r1) {
  if (i & 1) {
    ra[2 * p][i >> 1] |= r0 << 16;
    ra[2 * p + 1][i >> 1] |= r1 << 16;
  } else {
    ra[2 * p][i >> 1] = r0;
    ra[2 * p + 1][i >> 1] = r1;
  }
}

