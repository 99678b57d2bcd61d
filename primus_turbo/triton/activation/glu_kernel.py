"""Fused gated activations (SwiGLU / GeGLU) with optional per-token router probs.

Math, per row ``t`` of ``x: [T, 2H]`` (first half gate ``g``, second half up ``u``):
    ``y[t] = act(g) * u * p[t]``  with ``act`` = SiLU or erf-GELU and ``p`` = 1 without probs.
Backward, with ``dy: [T, H]``:
    ``dg = dy * u * p * act'(g)``, ``du = dy * act(g) * p``, ``dp[t] = sum_h dy * act(g) * u``.
All math in fp32; x/y/dy in fp16/bf16/fp32, probs fp32. Rows with ``row_mask[t] == 0`` are
skipped (their outputs are written as zeros so nothing stale is read downstream).

Grid: one program per row; each loops over ``H`` in ``BLOCK_H`` chunks, so the probs gradient is a
plain in-register reduction (no atomics: bitwise deterministic). Row offsets are int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from primus_turbo.triton.aot import AotSpec, triton_dtype_name

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
def glu_fwd_kernel(
    x_ptr,
    probs_ptr,
    mask_ptr,
    y_ptr,
    H,
    stride_x,
    stride_y,
    ACT: tl.constexpr,
    HAS_PROBS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    keep = 1.0
    if HAS_MASK:
        keep = (tl.load(mask_ptr + row) != 0).to(tl.float32)
    p = keep
    if HAS_PROBS:
        p = tl.load(probs_ptr + row).to(tl.float32) * keep
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        m = cols < H
        g = tl.load(x_row + cols, mask=m, other=0.0).to(tl.float32)
        u = tl.load(x_row + H + cols, mask=m, other=0.0).to(tl.float32)
        y = _act_fwd(g, ACT) * u * p
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def glu_bwd_kernel(
    x_ptr,
    probs_ptr,
    mask_ptr,
    dy_ptr,
    dx_ptr,
    dprobs_ptr,
    H,
    stride_x,
    stride_dy,
    stride_dx,
    ACT: tl.constexpr,
    HAS_PROBS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    dy_row = dy_ptr + row * stride_dy
    dx_row = dx_ptr + row * stride_dx
    keep = 1.0
    if HAS_MASK:
        keep = (tl.load(mask_ptr + row) != 0).to(tl.float32)
    p = keep
    if HAS_PROBS:
        p = tl.load(probs_ptr + row).to(tl.float32) * keep
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        m = cols < H
        g = tl.load(x_row + cols, mask=m, other=0.0).to(tl.float32)
        u = tl.load(x_row + H + cols, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + cols, mask=m, other=0.0).to(tl.float32) * keep
        a, da = _act_fwd_bwd(g, ACT)
        tl.store(dx_row + cols, (dy * u * p * da).to(dx_ptr.dtype.element_ty), mask=m)
        tl.store(dx_row + H + cols, (dy * a * p).to(dx_ptr.dtype.element_ty), mask=m)
        if HAS_PROBS:
            acc += dy * a * u
    if HAS_PROBS:
        tl.store(dprobs_ptr + row, tl.sum(acc, axis=0))


def _block_h(h: int, cap: int = 8192) -> tuple[int, int]:
    """A whole row (up to ``cap``) per iteration, ~8-16 elements per thread: many bytes in
    flight per program is what a memory-bound row kernel needs. At most 16 warps: on AMD a
    "warp" is a 64-wide wavefront and a workgroup holds at most 1024 threads."""
    block = min(max(triton.next_power_of_2(h), 64), cap)
    return block, min(max(block // 256, 4), 16)


def glu_fwd_triton(
    x: torch.Tensor, probs: torch.Tensor | None, row_mask: torch.Tensor | None, act: int
) -> torch.Tensor:
    """``x: [T, 2H]`` (unit stride in the last dim) -> ``[T, H]`` in x's dtype."""
    t, h2 = x.shape
    h = h2 // 2
    y = torch.empty((t, h), dtype=x.dtype, device=x.device)
    if t == 0 or h == 0:
        return y
    block, warps = _block_h(h)
    glu_fwd_kernel[(t,)](
        x, probs if probs is not None else x, row_mask if row_mask is not None else x, y,
        h, x.stride(0), y.stride(0),
        ACT=act, HAS_PROBS=probs is not None, HAS_MASK=row_mask is not None,
        BLOCK_H=block, num_warps=warps,
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
    block, warps = _block_h(h)
    glu_bwd_kernel[(t,)](
        x, probs if probs is not None else x, row_mask if row_mask is not None else x,
        dy, dx, dprobs if dprobs is not None else dx,
        h, x.stride(0), dy.stride(0), dx.stride(0),
        ACT=act, HAS_PROBS=probs is not None, HAS_MASK=row_mask is not None,
        BLOCK_H=block, num_warps=warps,
    )  # fmt: skip
    return dx, dprobs


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 SwiGLU/GeGLU with probs and mask, fwd and bwd, at the large-H block size."""
    dt = triton_dtype_name(torch.bfloat16)
    specs = []
    for act in (ACT_SILU, ACT_GELU):
        name = "silu" if act == ACT_SILU else "gelu"
        const = {"ACT": act, "HAS_PROBS": True, "HAS_MASK": True, "BLOCK_H": 8192}
        specs.append(
            AotSpec(
                name=f"glu_fwd_{name}_bf16",
                fn=glu_fwd_kernel,
                signature={
                    "x_ptr": f"*{dt}", "probs_ptr": "*fp32", "mask_ptr": "*i64",
                    "y_ptr": f"*{dt}", "H": "i32", "stride_x": "i64", "stride_y": "i64",
                },
                constexprs=const,
                options={"num_warps": 16},
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
                    "H": "i32", "stride_x": "i64", "stride_dy": "i64", "stride_dx": "i64",
                },
                constexprs=const,
                options={"num_warps": 16},
            )
        )  # fmt: skip
    return specs
