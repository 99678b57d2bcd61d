"""FP8 flash attention: ``flash_attn_fp8_func`` (Triton only, dense bshd).

Scheme (blockwise, ``Float8QuantConfig(granularity=BLOCKWISE, block_size=64)``): q, k and v are
quantized to E4M3 (FNUZ on gfx942) per (batch, head, 64-token block) with an fp32 dequant scale
``amax / fp8_max``. The forward runs fp8 x fp8 dots for ``Q K^T`` (dequantised by the row's Q
scale times the key block's K scale) and for ``P V`` with P quantized as ``p * fp8_max`` in the
same format (exact-range [0, fp8_max]) and V's block scale applied to the fp32 partial product;
the softmax statistics stay fp32. Output bf16 (the input dtype when fp16).

Backward: the bf16 Triton backward at the original (unquantized) q/k/v, using the fp8 forward's
output and lse (so delta = rowsum(dO * O) sees the fp8 output); deterministic as the bf16 path.
"""

from __future__ import annotations

import math

import torch

from primus_turbo.pytorch.core.backend import BackendType
from primus_turbo.pytorch.core.checks import check, fail
from primus_turbo.pytorch.core.platform import fp8_dtypes
from primus_turbo.pytorch.kernels.attention.attention_impl import attn_bwd_impl
from primus_turbo.pytorch.ops.attention import _check_common
from primus_turbo.pytorch.ops.fp8_delayed import refuse_delayed

__all__ = ["flash_attn_fp8_func", "quantize_attn_fp8"]

_OP = "flash_attn_fp8"


def quantize_attn_fp8(x: torch.Tensor, fp8_dtype: torch.dtype, block: int):
    """``[B, S, H, D]`` -> (fp8 ``[B, S, H, D]``, fp32 dequant scales ``[B, H, ceil(S/block)]``)."""
    b, s, h, d = x.shape
    nb = max(1, -(-s // block))
    xp = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, nb * block - s)).view(b, nb, block, h, d)
    fmax = torch.finfo(fp8_dtype).max
    amax = xp.abs().amax(dim=(2, 4)).float()  # [B, nb, H]
    scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
    q8 = (xp.float() / scale[:, :, None, :, None]).clamp(-fmax, fmax).to(fp8_dtype)
    q8 = q8.view(b, nb * block, h, d)[:, :s]
    return q8, scale.transpose(1, 2).contiguous()


class FlashAttnFP8Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, window, block):
        from primus_turbo.triton.attention.attn_launch import attn_fwd_triton

        fp8 = fp8_dtypes(q.device)[0]
        q8, qs = quantize_attn_fp8(q, fp8, block)
        k8, ks = quantize_attn_fp8(k, fp8, block)
        v8, vs = quantize_attn_fp8(v, fp8, block)
        p_max = torch.finfo(fp8).max
        out, lse = attn_fwd_triton(q8, k8, v8, None, None, q.shape[1], k.shape[1], scale, causal,
                                   window, fp8=(qs, ks, vs, p_max))  # fmt: skip
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (q.shape[1], k.shape[1], scale, causal, window)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        sq, sk, scale, causal, window = ctx.args
        dout = dout.contiguous() if dout.stride(-1) != 1 else dout
        dq, dk, dv = attn_bwd_impl(dout.to(q.dtype), q, k, v, out, lse, None, None, sq, sk, scale,
                                   causal, window, BackendType.TRITON)  # fmt: skip
        return dq, dk, dv, None, None, None, None


def flash_attn_fp8_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    bias: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_lse: bool = False,
    return_attn_probs: bool = False,
    fp8_config=None,
):
    """FP8 attention on bf16/fp16 ``[B, S, H, D]`` inputs (same semantics as
    :func:`flash_attn_func`); ``fp8_config`` None or BLOCKWISE with ``block_size=64``.
    Needs a GPU (or ``TRITON_INTERPRET=1``). Returns ``out`` or ``(out, lse)``."""
    refuse_delayed(_OP, "fp8_config", fp8_config)
    _check_common(_OP, q, k, v, 4, dropout_p, bias, alibi_slopes, return_attn_probs, None,
                  window_size)  # fmt: skip
    check(q.dtype in (torch.bfloat16, torch.float16), _OP, "q", "bf16/fp16 input", q.dtype,
          TypeError)  # fmt: skip
    if k.shape[0] != q.shape[0] or v.shape[:2] != k.shape[:2]:
        fail(_OP, "k/v", f"batch {q.shape[0]} and one key length",
             f"k {tuple(k.shape)}, v {tuple(v.shape)}")  # fmt: skip
    block = 64
    if fp8_config is not None:
        from primus_turbo.pytorch.core.low_precision import ScalingGranularity

        g = getattr(fp8_config, "granularity", None)
        bs = getattr(fp8_config, "block_size", None)
        check(g == ScalingGranularity.BLOCKWISE and bs == block, _OP, "fp8_config",
              "BLOCKWISE granularity with block_size=64", f"{g} block_size={bs}")  # fmt: skip
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    window = (int(window_size[0]), int(window_size[1]))
    inputs = [t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v)]
    out, lse = FlashAttnFP8Function.apply(*inputs, float(scale), bool(causal), window, block)
    return (out, lse) if return_lse else out
