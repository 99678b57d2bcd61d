// The MX dual tile math of the NVIDIA cast-transpose kernels (quant_dual_mx.cu): the 128 x 128
// tile layout (8 warp tiles of 32 rows x 64 columns, a lane holding 8 rows x 8 columns),
// warp-local E8M0 amaxes, both copies stored from registers, the scales through 1 KB of shared
// memory (tile_body), and their stores to s / st (store_scales, outer-dim-major). Include inside
// the kernels' anonymous namespace of the CUDA (non-HIP) branch, after primus_turbo/device.h.
#pragma once

constexpr int kTile = 128;  // rows and columns of a block tile
constexpr uint32_t kExpMask = 0x7f807f80u;  // the exponent fields of two bf16

#include "primus_turbo/fp8_convert.cuh"  // cvt2, bf_lo, bf_hi

// Exponent keys of two bf16 (bits 7..14 of each half); FINITE: exponent 255 (inf/NaN) -> 0.
template <bool FINITE>
__device__ __forceinline__ uint32_t ekey2(uint32_t w) {
  const uint32_t k = w & kExpMask;
  if (!FINITE) return k;
  const uint32_t f = (k + 0x00800080u) & 0x80008000u;  // bit 15 / 31: that half was 255
  return k & ~(f | (f - (f >> 15)));                   // 0xffff over each such half
}

// Stored E8M0 bytes of two blocks with keys `key` (u16x2): max(e - EMAX, 0) in each half.
template <int EMAX>
__device__ __forceinline__ uint32_t eb2(uint32_t key) {
  constexpr uint32_t kE = EMAX * 0x00010001u;
  return __vmaxu2((key >> 7) & 0x00ff00ffu, kE) - kE;
}

// Multipliers 2^(127 - eb) of the low / high half of an eb2 result.
__device__ __forceinline__ float mul_lo(uint32_t e) {
  return __uint_as_float(0x7f000000u - (e << 23));
}
__device__ __forceinline__ float mul_hi(uint32_t e) {
  return __uint_as_float(0x7f000000u - ((e >> 16) << 23));
}

// p, hidden from the optimizer (keeps it from precomputing a loop's addresses all at once).
__device__ __forceinline__ uint8_t* opaque(uint8_t* p) {
  asm volatile("" : "+l"(p));
  return p;
}

// 2 R / 2 bytes (R / 2 converted pairs) at p.
template <int R>
__device__ __forceinline__ void st_pairs(uint8_t* p, const uint32_t (&b)[R / 2]) {
  if constexpr (R == 8) {
    *reinterpret_cast<uint2*>(p) = make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
  } else {
    *reinterpret_cast<uint32_t*>(p) = b[0] | (b[1] << 16);
  }
}

__device__ __forceinline__ uint32_t pick4(const uint32_t (&a)[4], int i) {
  return i == 0 ? a[0] : i == 1 ? a[1] : i == 2 ? a[2] : a[3];
}

// Thread layout of the R-rows-per-lane kernels (R = 8: 256 threads, R = 4: 512 threads per
// 128 x 128 block tile): 4 x (16 / R) warps of 32 rows x 8R columns; lane (rq = lane / R,
// cv = lane % R) holds rows R rq .. + R - 1 of columns 8 cv .. + 7.
template <int R>
struct Layout {
  static constexpr int kThreads = 2048 / R;
  int wm, wn, rq, cv;
  __device__ __forceinline__ Layout() {
    const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
    wm = warp & 3;
    wn = warp >> 2;
    rq = lane / R;
    cv = lane % R;
  }
};

// The R vectors of this thread in tile (tm, tn), zero outside x (M % 32 == 0: a warp tile's
// rows are all in or all out; N % 32 == 0: a vector is all in or out).
template <int R>
__device__ __forceinline__ void load_tile(uint32_t (&d)[R][4], const uint16_t* __restrict__ x,
                                          int M, int N, int tm, int tn) {
  const Layout<R> L;
  const int row = tm * kTile + 32 * L.wm + R * L.rq;
  const int col = tn * kTile + 8 * R * L.wn + 8 * L.cv;
  const bool ok = row < M && col < N;
  const uint4* src = reinterpret_cast<const uint4*>(x + (ok ? int64_t{row} * N + col : 0));
  const int step = N / 8;  // one row in uint4
#pragma unroll
  for (int j = 0; j < R; ++j) {
    uint4 u = make_uint4(0u, 0u, 0u, 0u);
    if (ok) u = src[j * step];
    d[j][0] = u.x;
    d[j][1] = u.y;
    d[j][2] = u.z;
    d[j][3] = u.w;
  }
}

// Everything after the loads of tile (tm, tn) up to the scales: q and qt stored, this tile's
// 128 x 4 scale bytes of s rows / st rows in ssm / csm (shared memory), ending with the block's
// barrier (store_scales follows).
template <bool E5M2, int R>
__device__ __forceinline__ void tile_body(const uint32_t (&d)[R][4], uint32_t* ssm, uint32_t* csm,
                                          uint8_t* __restrict__ q, uint8_t* __restrict__ qt, int M,
                                          int N, int tm, int tn) {
  constexpr int EMAX = E5M2 ? 15 : 8;
  constexpr int H = R / 2;  // row pairs per lane
  const Layout<R> L;
  const int wm = L.wm, wn = L.wn, rq = L.rq, cv = L.cv;
  const int m0 = tm * kTile, n0 = tn * kTile;
  const int row0 = m0 + 32 * wm + R * rq;  // the thread's first row
  const int col = n0 + 8 * R * wn + 8 * cv;  // its first column
  const bool ok = row0 < M && col < N;

  uint32_t rk[H], cm[4];
  lane_amax<ekey2<false>, R>(d, rk, cm);
  {
    const uint32_t top = __vmaxu2(__vmaxu2(cm[0], cm[1]), __vmaxu2(cm[2], cm[3]));
    if ((top & 0x7f80u) == 0x7f80u || (top & 0x7f800000u) == 0x7f800000u) {
      lane_amax<ekey2<true>, R>(d, rk, cm);
    }
  }
  // row blocks: the 4 lanes of a quad (cv % 4); column blocks: the 32 / R lanes of one cv (rq)
#pragma unroll
  for (int i = 0; i < H; ++i) {
    rk[i] = __vmaxu2(rk[i], __shfl_xor_sync(0xffffffffu, rk[i], 1));
    rk[i] = __vmaxu2(rk[i], __shfl_xor_sync(0xffffffffu, rk[i], 2));
  }
#pragma unroll
  for (int sh = R; sh < 32; sh <<= 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) cm[i] = __vmaxu2(cm[i], __shfl_xor_sync(0xffffffffu, cm[i], sh));
  }
  uint32_t er[H], ec[4];
#pragma unroll
  for (int i = 0; i < H; ++i) er[i] = eb2<EMAX>(rk[i]);
#pragma unroll
  for (int i = 0; i < 4; ++i) ec[i] = eb2<EMAX>(cm[i]);

  // scale bytes into shared memory: row (32 wm + R rq + j) byte (8R wn + 8 cv) / 32 of ssm, lane
  // cv % 4 == c < R / 2 writing rows 2c, 2c + 1; column (8R wn + 8 cv + k) byte wm of csm, lane
  // rq < 4 writing columns 2 rq, 2 rq + 1
  {
    auto* sb = reinterpret_cast<uint8_t*>(ssm);
    auto* cb = reinterpret_cast<uint8_t*>(csm);
    const int c = cv & 3;
    if (c < H) {
      uint32_t rw;
      if constexpr (H == 4) {
        rw = pick4(er, c);
      } else {
        rw = c == 0 ? er[0] : er[1];
      }
      const int ri = (32 * wm + R * rq + 2 * c) * 4 + (8 * R * wn + 8 * cv) / 32;
      sb[ri] = static_cast<uint8_t>(rw);
      sb[ri + 4] = static_cast<uint8_t>(rw >> 16);
    }
    if (rq < 4) {
      const uint32_t cw = pick4(ec, rq);
      const int ci = (8 * R * wn + 8 * cv + 2 * rq) * 4 + wm;
      cb[ci] = static_cast<uint8_t>(cw);
      cb[ci + 4] = static_cast<uint8_t>(cw >> 16);
    }
  }

  // both copies in one walk over the 4 words (column pairs 2i, 2i + 1): each value is unpacked
  // once and multiplied by its row and its column scale. Column 2i / 2i + 1's R rows are R
  // consecutive bytes of qt row col + 2i / + 1 (stored at once); the row bytes collect in ra
  // (row j: ra[j][0] columns 0..3, ra[j][1] columns 4..7) and are stored at the end, 8 bytes per
  // row. Store addresses advance one row at a time, opaque to the compiler (hoisted 64-bit
  // addresses would cost registers).
  uint32_t ra[R][2];
  uint8_t* tp = qt + int64_t{col} * M + row0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float cl = mul_lo(ec[i]), ch = mul_hi(ec[i]);
    uint32_t tl[H], th[H];
#pragma unroll
    for (int p = 0; p < H; ++p) {
      const uint32_t w0 = d[2 * p][i], w1 = d[2 * p + 1][i];
      const float a0 = bf_lo(w0), b0 = bf_hi(w0), a1 = bf_lo(w1), b1 = bf_hi(w1);
      tl[p] = cvt2<E5M2>(a0 * cl, a1 * cl);
      th[p] = cvt2<E5M2>(b0 * ch, b1 * ch);
      const float rl = mul_lo(er[p]), rh = mul_hi(er[p]);  // rows 2p, 2p + 1
      const uint32_t r0 = cvt2<E5M2>(a0 * rl, b0 * rl);
      const uint32_t r1 = cvt2<E5M2>(a1 * rh, b1 * rh);
      put_row_pair(ra, p, i, r0, r1);
    }
    if (ok) st_pairs<R>(tp, tl);
    tp = opaque(tp + M);
    if (ok) st_pairs<R>(tp, th);
    tp = opaque(tp + M);
  }
  uint8_t* qp = q + int64_t{row0} * N + col;
#pragma unroll
  for (int j = 0; j < R; ++j) {
    if (ok) *reinterpret_cast<uint2*>(qp) = make_uint2(ra[j][0], ra[j][1]);
    qp = opaque(qp + N);
  }
  __syncthreads();
}

// The tile's scales, outer-dim-major (after tile_body's barrier): s is stored as
// [N / 32][M] (logical [M, N / 32] with strides (1, M)) and st as [M / 32][N], so a tile's 4
// blocks of s are 4 runs of 128 consecutive bytes (likewise st): 32 full L2 sectors per tile
// instead of 256 partial ones. Thread t < 128 packs 4 rows (4 (t % 32) .. + 3) of s block
// t / 32, thread 128 + t the same for st; one 4-byte store each (M % 32 == N % 32 == 0: a
// thread's 4 rows are all in or all out, and the store is aligned).
__device__ __forceinline__ void store_scales(const uint32_t* ssm, const uint32_t* csm,
                                             uint8_t* __restrict__ s, uint8_t* __restrict__ st,
                                             int M, int N, int tm, int tn) {
  const int t = threadIdx.x, m0 = tm * kTile, n0 = tn * kTile;
  const int b = (t >> 5) & 3, r0 = 4 * (t & 31);
  const bool rows = t < kTile;  // s (x rows) or st (x columns)
  const uint32_t* src = rows ? ssm : csm;
  const int inner0 = rows ? m0 : n0, outer0 = rows ? n0 : m0;
  const int inner = rows ? M : N, outer = rows ? N : M;
  if (t >= 2 * kTile || outer0 + 32 * b >= outer || inner0 + r0 >= inner) return;
  const int sh = 8 * b;
  const uint32_t v = ((src[r0] >> sh) & 0xffu) | (((src[r0 + 1] >> sh) & 0xffu) << 8) |
                     (((src[r0 + 2] >> sh) & 0xffu) << 16) | (((src[r0 + 3] >> sh) & 0xffu) << 24);
  uint8_t* dst = (rows ? s : st) + int64_t{outer0 / 32 + b} * inner + inner0 + r0;
  *reinterpret_cast<uint32_t*>(dst) = v;
}
