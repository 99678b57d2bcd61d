"""Fused gated activations (SwiGLU / GeGLU) with optional per-token router probs.

Math, per row ``t`` of ``x: [T, 2H]`` (first half gate ``g``, second half up ``u``):
    ``y[t] = act(g) * u * p[t]``  with ``act`` = SiLU or erf-GELU and ``p`` = 1 without probs.
Backward, with ``dy: [T, H]``:
    ``dg = dy * u * p * act'(g)``, ``du = dy * act(g) * p``, ``dp[t] = sum_h dy * act(g) * u``.
All math in fp32; x/y/dy in fp16/bf16/fp32, probs fp32. Rows with ``row_mask[t] == 0`` are
skipped (their outputs are written as zeros so nothing stale is read downstream).

Grid: one program per ``ROWS`` rows (``glu_tile``: a 2-D tile of 512 elements); each
loops over ``H`` in ``BLOCK_H`` chunks, so the probs gradient is a plain in-register reduction
(no atomics: bitwise deterministic). Row offsets are int64.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from primus_turbo.triton.aot import AotSpec, triton_dtype_name
from primus_turbo.triton.quantization.quant_kernel import _cast, _finite_abs, _scale_of

ACT_SILU = 0
ACT_GELU = 1


@triton.jit
def _act_fwd(g, ACT: tl.constexpr):
    if ACT == 0:
        s = 1.0 / (1.0 + tl.exp(-g))
        return g * s
    else:
        return 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))


@triton.jit
def _act_fwd_bwd(g, ACT: tl.constexpr):
    """``(act(g), act'(g))``."""
    if ACT == 0:
        s = 1.0 / (1.0 + tl.exp(-g))
        return g * s, s * (1.0 + g * (1.0 - s))
    else:
        cdf = 0.5 * (1.0 + tl.erf(g * 0.7071067811865476))
        pdf = tl.exp(-0.5 * g * g) * 0.3989422804014327
        return g * cdf, cdf + g * pdf


@triton.jit
def _row_scale(probs_ptr, mask_ptr, rows, in_rows, HAS_PROBS: tl.constexpr,
               HAS_MASK: tl.constexpr):  # fmt: skip
    """``(keep, p)`` per row: the mask as 0/1 and the probs times it (1 without probs)."""
    keep = in_rows.to(tl.float32)
    if HAS_MASK:
        keep = (tl.load(mask_ptr + rows, mask=in_rows, other=0) != 0).to(tl.float32)
    p = keep
    if HAS_PROBS:
        p = tl.load(probs_ptr + rows, mask=in_rows, other=0.0).to(tl.float32) * keep
    return keep, p


@triton.jit
def _load_gate_up(x_rows, h0, in_rows, H, BLOCK_H: tl.constexpr):
    """``(cols, mask, g, u)`` of one ``BLOCK_H`` step: the gate and up halves in fp32."""
    cols = h0 + tl.arange(0, BLOCK_H)
    m = in_rows[:, None] & (cols < H)[None, :]
    g = tl.load(x_rows + cols[None, :], mask=m, other=0.0).to(tl.float32)
    u = tl.load(x_rows + H + cols[None, :], mask=m, other=0.0).to(tl.float32)
    return cols, m, g, u


@triton.jit
def glu_fwd_kernel(
    x_ptr,
    probs_ptr,
    mask_ptr,
    y_ptr,
    T,
    H,
    stride_x,
    stride_y,
    ACT: tl.constexpr,
    HAS_PROBS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ROWS: tl.constexpr = 1,
):
    """``ROWS`` rows per program, ``BLOCK_H`` columns per step."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    in_rows = rows < T
    _, p = _row_scale(probs_ptr, mask_ptr, rows, in_rows, HAS_PROBS, HAS_MASK)
    x_rows = x_ptr + rows[:, None] * stride_x
    y_rows = y_ptr + rows[:, None] * stride_y
    for h0 in range(0, H, BLOCK_H):
        cols, m, g, u = _load_gate_up(x_rows, h0, in_rows, H, BLOCK_H)
        y = _act_fwd(g, ACT) * u * p[:, None]
        tl.store(y_rows + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def glu_fwd_quant_kernel(
    x_ptr,
    probs_ptr,
    q_ptr,
    s_ptr,
    T,
    H,
    stride_x,
    stride_q,
    ACT: tl.constexpr,
    HAS_PROBS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    FMAX: tl.constexpr,
    FMT: tl.constexpr,
):
    """The gated activation fused with its rowwise fp8 quantization: ``ROWS`` whole rows per
    program (``BLOCK_H >= H``), each computed in fp32, rounded to x's dtype (what the unfused
    ``glu_fwd_kernel`` stores), then amax / scale / cast exactly as the rowwise quantization
    kernel (``quant_kernel._scale_of`` / ``_cast``), so ``q``, ``s`` are bitwise those of
    quantizing the unfused output."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_H)
    in_rows = rows < T
    m = in_rows[:, None] & (cols < H)[None, :]
    ptr = x_ptr + rows[:, None] * stride_x + cols[None, :]
    g = tl.load(ptr, mask=m, other=0.0).to(tl.float32)
    u = tl.load(ptr + H, mask=m, other=0.0).to(tl.float32)
    y = _act_fwd(g, ACT) * u
    if HAS_PROBS:
        p = tl.load(probs_ptr + rows, mask=in_rows, other=0.0).to(tl.float32)
        y = y * p[:, None]
    y = y.to(x_ptr.dtype.element_ty).to(tl.float32)
    amax = tl.max(_finite_abs(y), axis=1)
    scale, sinv = _scale_of(amax, FMAX, False, 0)
    q = _cast(y, scale[:, None], FMAX, q_ptr.dtype.element_ty, FMT)
    tl.store(q_ptr + rows[:, None] * stride_q + cols[None, :], q, mask=m)
    tl.store(s_ptr + rows, sinv, mask=in_rows)


@triton.jit
def glu_bwd_kernel(
    x_ptr,
    probs_ptr,
    mask_ptr,
    dy_ptr,
    dx_ptr,
    dprobs_ptr,
    T,
    H,
    stride_x,
    stride_dy,
    stride_dx,
    ACT: tl.constexpr,
    HAS_PROBS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ROWS: tl.constexpr = 1,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    in_rows = rows < T
    keep, p = _row_scale(probs_ptr, mask_ptr, rows, in_rows, HAS_PROBS, HAS_MASK)
    x_rows = x_ptr + rows[:, None] * stride_x
    dy_rows = dy_ptr + rows[:, None] * stride_dy
    dx_rows = dx_ptr + rows[:, None] * stride_dx
    acc = tl.zeros([ROWS, BLOCK_H], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        cols, m, g, u = _load_gate_up(x_rows, h0, in_rows, H, BLOCK_H)
        dy = tl.load(dy_rows + cols[None, :], mask=m, other=0.0).to(tl.float32) * keep[:, None]
        a, da = _act_fwd_bwd(g, ACT)
        pc = p[:, None]
        tl.store(dx_rows + cols[None, :], (dy * u * pc * da).to(dx_ptr.dtype.element_ty), mask=m)
        tl.store(dx_rows + H + cols[None, :], (dy * a * pc).to(dx_ptr.dtype.element_ty), mask=m)
        if HAS_PROBS:
            acc += dy * a * u
    if HAS_PROBS:
        tl.store(dprobs_ptr + rows, tl.sum(acc, axis=1), mask=in_rows)


def _block_h(h: int, cap: int = 8192) -> tuple[int, int]:
    """A whole row (up to ``cap``) per iteration, ~8-16 elements per thread: many bytes in
    flight per program is what a memory-bound row kernel needs. At most 16 warps: on AMD a
    "warp" is a 64-wide wavefront and a workgroup holds at most 1024 threads."""
    block = min(max(triton.next_power_of_2(h), 64), cap)
    return block, min(max(block // 256, 4), 16)


GLU_TILE_ENV = "PRIMUS_TURBO_GLU_TILE"
# elements per program and step of the 2-D tile: 4 per thread over 4 warps (sm_90: 30 / 40
# registers for the GeGLU forward / backward at 4 x 128; 8 per thread in a 16 x 128 tile took
# 101 / 172, a quarter of the occupancy)
_TILE_ELEMS = 512


def _tile_2d(h: int, elems: int) -> tuple[int, int, int]:
    """``elems`` elements on 4 warps: the width (128 .. ``elems``) padding H least, widest on a
    tie; ``ROWS`` rows fill the rest."""
    widths = [1 << i for i in range(7, elems.bit_length())]
    block = min(widths, key=lambda b: (-(-h // b) * b, -b))
    return elems // block, block, 4


def _swiglu_elems(h: int, forward: bool) -> int:
    """SwiGLU's tile size under ``auto`` (H200 call 13.7, graph, vs copy, 512 -> chosen):
    rows that need the 128-wide block (H not a multiple of 256, gpt-oss-20b's 2880) keep 512
    elements (1024: forward 0.911-0.918 -> 0.892-0.895); else 1024 (8 per thread: Qwen3 H = 768
    forward 0.937-0.943 -> 0.958-0.959, backward 1.036-1.042 -> 1.069-1.070, Mixtral backward
    0.977 -> 0.986, dense 8192 0.995 -> 1.005), and 2048 for the forward where H is a multiple
    of 2048 (DeepSeek-V3 forward 0.983-0.986 -> 1.021, 0.97 -> 1.00x torch.compile; Mixtral /
    dense 0.987 / 0.982 -> 0.991 / 0.990; its backward lost on DeepSeek-V3: 0.988)."""
    if _tile_2d(h, 1024)[1] == 128:
        return 512
    return 2048 if forward and h % 2048 == 0 else 1024


def glu_tile(h: int, act: int, forward: bool = True) -> tuple[int, int, int]:
    """``(ROWS, BLOCK_H, num_warps)`` of the GLU kernels, read per call.

    ``PRIMUS_TURBO_GLU_TILE``: ``auto`` (default since session 13) = ``2d`` for GeGLU and, for
    SwiGLU, 2-D tiles of ``_swiglu_elems`` elements; ``2d`` a 2-D tile of ``_TILE_ELEMS``
    elements whose width wastes the fewest masked lanes (the power of two from 128 to
    ``_TILE_ELEMS`` with the least padding of H, the widest on a tie; ``ROWS`` rows fill the
    rest; session 12's default); ``2d:E`` (E = 512, 1024, 2048) the same with E elements on the
    same 4 warps; ``row`` the one-row block of ``_block_h`` (up to 8192 wide, the default until
    session 12). H200 call 12.8, graph, vs copy, ``row`` -> ``2d``: GeGLU forward 0.627 ->
    0.830 (gpt-oss-20b, H = 2880: the 4096-wide block computed 30 % masked lanes of a
    compute-bound erf), 0.681 -> 0.840 (Qwen3, H = 768), 0.815 -> 0.859 (DeepSeek-V3),
    backward 0.62-0.86 -> 0.80-0.95; SwiGLU forward 0.79-1.02 -> 0.91-0.99, backward 0.77-1.03
    -> 0.90-1.04 (Mixtral-8x7B 0.82 -> 0.985). GeGLU keeps 4 elements per thread (its erf
    needs the registers: 30 / 40 at 4 x 128; 8 per thread in a 16 x 128 tile took 101 / 172)."""
    v = os.environ.get(GLU_TILE_ENV, "").strip().lower() or "auto"
    elems = {"2d": _TILE_ELEMS, "2d:512": 512, "2d:1024": 1024, "2d:2048": 2048}.get(v)
    if v not in ("row", "auto") and elems is None:
        raise ValueError(
            f"primus_turbo: {GLU_TILE_ENV} expected 'auto', '2d', '2d:512', '2d:1024', "
            f"'2d:2048' or 'row', got {v!r}"
        )
    if v == "row":
        block, warps = _block_h(h)
        return 1, block, warps
    if v == "auto":
        elems = _swiglu_elems(h, forward) if act == ACT_SILU else _TILE_ELEMS
    return _tile_2d(h, elems)


def glu_fwd_triton(
    x: torch.Tensor, probs: torch.Tensor | None, row_mask: torch.Tensor | None, act: int
) -> torch.Tensor:
    """``x: [T, 2H]`` (unit stride in the last dim) -> ``[T, H]`` in x's dtype."""
    t, h2 = x.shape
    h = h2 // 2
    y = torch.empty((t, h), dtype=x.dtype, device=x.device)
    if t == 0 or h == 0:
        return y
    rows, block, warps = glu_tile(h, act)
    glu_fwd_kernel[(triton.cdiv(t, rows),)](
        x, probs if probs is not None else x, row_mask if row_mask is not None else x, y,
        t, h, x.stride(0), y.stride(0),
        ACT=act, HAS_PROBS=probs is not None, HAS_MASK=row_mask is not None,
        BLOCK_H=block, ROWS=rows, num_warps=warps,
    )  # fmt: skip
    return y


def glu_bwd_triton(
    x: torch.Tensor,
    probs: torch.Tensor | None,
    row_mask: torch.Tensor | None,
    dy: torch.Tensor,
    act: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns ``(dx [T, 2H] in x's dtype, dprobs [T] fp32 or None)``."""
    t, h2 = x.shape
    h = h2 // 2
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    dprobs = torch.empty((t,), dtype=torch.float32, device=x.device) if probs is not None else None
    if t == 0:
        return dx, dprobs
    if h == 0:
        if dprobs is not None:
            dprobs.zero_()
        return dx, dprobs
    rows, block, warps = glu_tile(h, act, forward=False)
    glu_bwd_kernel[(triton.cdiv(t, rows),)](
        x, probs if probs is not None else x, row_mask if row_mask is not None else x,
        dy, dx, dprobs if dprobs is not None else dx,
        t, h, x.stride(0), dy.stride(0), dx.stride(0),
        ACT=act, HAS_PROBS=probs is not None, HAS_MASK=row_mask is not None,
        BLOCK_H=block, ROWS=rows, num_warps=warps,
    )  # fmt: skip
    return dx, dprobs


QUANT_MAX_H = 8192  # rows up to this long are quantized in registers by glu_fwd_quant_kernel


def glu_fwd_quant_triton(
    x: torch.Tensor, probs: torch.Tensor | None, act: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x: [T, 2H]`` (unit stride in the last dim, ``H <= QUANT_MAX_H``) -> ``(q [T, H] of the
    fp8 ``dtype``, scale_inv [T] fp32)``: the activation quantized rowwise in one pass."""
    from primus_turbo.triton.quantization.quant_launch import _fmax, _interp_fmt, _u8

    t, h2 = x.shape
    h = h2 // 2
    q = torch.empty((t, h), dtype=dtype, device=x.device)
    s = torch.empty((t,), dtype=torch.float32, device=x.device)
    if t == 0:
        return q, s
    if h == 0:
        return q, s.fill_(1e-12 / _fmax(dtype))  # an empty row: amax 1e-12, as quantize_fp8
    block = max(triton.next_power_of_2(h), 16)
    rows = max(1, min(16, 8192 // block))
    warps = 16 if rows * block >= 8192 else (8 if rows * block >= 2048 else 4)
    glu_fwd_quant_kernel[(triton.cdiv(t, rows),)](
        x, probs if probs is not None else x, _u8(q), s, t, h, x.stride(0), h,
        ACT=act, HAS_PROBS=probs is not None, ROWS=rows, BLOCK_H=block, FMAX=_fmax(dtype),
        FMT=_interp_fmt(dtype), num_warps=warps,
    )  # fmt: skip
    return q, s


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 SwiGLU/GeGLU with probs and mask, fwd and bwd, on the ``glu_tile`` tiles of H =
    8192 (SwiGLU) and H = 2880 (GeGLU)."""
    dt = triton_dtype_name(torch.bfloat16)
    specs = []
    for act, h in ((ACT_SILU, 8192), (ACT_GELU, 2880)):  # 1 x 512 and 4 x 128 tiles
        name = "silu" if act == ACT_SILU else "gelu"
        rows, block, warps = glu_tile(h, act)
        const = {"ACT": act, "HAS_PROBS": True, "HAS_MASK": True, "BLOCK_H": block, "ROWS": rows}
        b_rows, b_block, b_warps = glu_tile(h, act, forward=False)
        b_const = {**const, "BLOCK_H": b_block, "ROWS": b_rows}
        specs.append(
            AotSpec(
                name=f"glu_fwd_{name}_bf16",
                fn=glu_fwd_kernel,
                signature={
                    "x_ptr": f"*{dt}", "probs_ptr": "*fp32", "mask_ptr": "*i64",
                    "y_ptr": f"*{dt}", "T": "i32", "H": "i32", "stride_x": "i64",
                    "stride_y": "i64",
                },
                constexprs=const,
                options={"num_warps": warps},
                default=act == ACT_SILU,
            )
        )  # fmt: skip
        specs.append(
            AotSpec(
                name=f"glu_bwd_{name}_bf16",
                fn=glu_bwd_kernel,
                signature={
                    "x_ptr": f"*{dt}", "probs_ptr": "*fp32", "mask_ptr": "*i64",
                    "dy_ptr": f"*{dt}", "dx_ptr": f"*{dt}", "dprobs_ptr": "*fp32",
                    "T": "i32", "H": "i32", "stride_x": "i64", "stride_dy": "i64",
                    "stride_dx": "i64",
                },
                constexprs=b_const,
                options={"num_warps": b_warps},
            )
        )  # fmt: skip
    specs.append(
        AotSpec(
            name="glu_fwd_quant_silu_bf16_e4m3",
            fn=glu_fwd_quant_kernel,
            signature={
                "x_ptr": f"*{dt}", "probs_ptr": "*fp32",
                "q_ptr": "*fp8e4b8" if target == "gfx942" else "*fp8e4nv", "s_ptr": "*fp32",
                "T": "i32", "H": "i32", "stride_x": "i64", "stride_q": "i64",
            },
            constexprs={"ACT": ACT_SILU, "HAS_PROBS": True, "ROWS": 4, "BLOCK_H": 2048,
                        "FMAX": 240.0 if target == "gfx942" else 448.0, "FMT": (0, 0, 0, 0)},
            options={"num_warps": 16},
        )
    )  # fmt: skip
    return specs
