"""Flash attention with autograd: ``flash_attn_func`` (bshd) and ``flash_attn_varlen_func`` (THD).

The backend is resolved once per call (``GlobalBackendManager.set_attn_backend`` /
``PRIMUS_TURBO_ATTN_BACKEND``); forward and backward run on it. TRITON's backward is
deterministic (two kernels, no atomics). TORCH (SDPA) and AITER use torch's autograd.
"""

from __future__ import annotations

import math

import torch

from primus_turbo.pytorch.core.backend import BackendType
from primus_turbo.pytorch.core.checks import check, check_same_device, check_tensor, fail
from primus_turbo.pytorch.kernels.attention.attention_impl import (
    FLOAT_DTYPES,
    AttnDispatcher,
    attn_bwd_impl,
    attn_fwd_impl,
)

__all__ = ["flash_attn_func", "flash_attn_varlen_func"]

_OP = "flash_attn"


class FlashAttnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, window, backend_value):
        backend = BackendType(backend_value)
        out, lse = attn_fwd_impl(q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, window,
                                 backend)  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.args = (max_sq, max_sk, scale, causal, window, backend)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        max_sq, max_sk, scale, causal, window, backend = ctx.args
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        dq, dk, dv = attn_bwd_impl(dout, q, k, v, out, lse, cu_q, cu_k, max_sq, max_sk, scale,
                                   causal, window, backend)  # fmt: skip
        return dq, dk, dv, None, None, None, None, None, None, None, None


def _check_common(op, q, k, v, q_rank, dropout_p, bias, alibi_slopes, return_attn_probs, sink,
                  window_size):  # fmt: skip
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(op, name, t, ndim=q_rank, dtypes=FLOAT_DTYPES)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        fail(op, "k/v", f"dtype {q.dtype} (same as q)", f"{k.dtype}/{v.dtype}", TypeError)
    if not (q.device == k.device == v.device):
        check_same_device(op, q=q, k=k, v=v)
    check(dropout_p == 0.0, op, "dropout_p", "0.0 (dropout is not implemented)", dropout_p,
          NotImplementedError)  # fmt: skip
    for name, val in (("bias", bias), ("alibi_slopes", alibi_slopes), ("sink", sink)):
        check(val is None, op, name, "None (not implemented)", type(val).__name__,
              NotImplementedError)  # fmt: skip
    check(not return_attn_probs, op, "return_attn_probs", "False (not implemented)",
          return_attn_probs, NotImplementedError)  # fmt: skip
    ok = (
        isinstance(window_size, (tuple, list))
        and len(window_size) == 2
        and all(isinstance(w, int) and w >= -1 for w in window_size)
    )
    check(ok, op, "window_size", "(left, right) ints >= -1 (-1 = unbounded)", window_size)
    hd = -2  # head axis from the end
    hq, hkv = q.shape[hd], k.shape[hd]
    if v.shape[hd] != hkv:
        fail(op, "v", f"{hkv} heads (same as k)", f"shape {tuple(v.shape)}")
    if hkv == 0 or hq % hkv != 0:
        fail(op, "k", f"a head count dividing q's {hq} heads (GQA/MQA)", f"{hkv} heads")
    if k.shape[-1] != q.shape[-1]:
        fail(op, "k", f"head dim {q.shape[-1]} (same as q)", f"shape {tuple(k.shape)}")
    check(q.shape[-1] >= 1, op, "q", "a head dim >= 1", f"shape {tuple(q.shape)}")


def _inner_contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.numel() == 0 else t.contiguous()


def _run(q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, window, return_lse):
    q, k, v = _inner_contig(q), _inner_contig(k), _inner_contig(v)
    kwargs = dict(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_sq=max_sq, max_sk=max_sk,
                  scale=scale, causal=causal, window=window, return_lse=return_lse)  # fmt: skip
    backend = AttnDispatcher.resolve(**kwargs)
    impl = AttnDispatcher.backend_class(backend)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if impl.differentiable:
        out, lse = impl.execute(**kwargs)
    elif needs_grad:
        out, lse = FlashAttnFunction.apply(q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal,
                                           window, backend.value)  # fmt: skip
    else:
        out, lse = attn_fwd_impl(q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, window,
                                 backend)  # fmt: skip
    return (out, lse) if return_lse else out


def flash_attn_func(
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
    sink: torch.Tensor | None = None,
):
    """Scaled dot-product attention over ``[B, S, H, D]`` tensors (flash-attn semantics).

    Args:
        q: ``[B, Sq, Hq, Dqk]``; k: ``[B, Sk, Hkv, Dqk]``; v: ``[B, Sk, Hkv, Dv]``; one dtype
            (fp16/bf16; fp32 runs on TORCH), one device. Any strides (bshd, sbhd or bhsd views);
            a non-unit innermost stride is made contiguous. ``Hq % Hkv == 0`` (GQA/MQA).
        softmax_scale: default ``1/sqrt(Dqk)``.
        causal: bottom-right aligned (query i sees keys j <= i + Sk - Sq); forces right = 0.
        window_size: ``(left, right)`` sliding window, -1 = unbounded.
        deterministic: accepted; TRITON's backward is always deterministic.
        return_lse: also return lse ``[B, Hq, Sq]`` fp32 (natural log; -inf for rows that
            see no key, whose output is 0).
        dropout_p, bias, alibi_slopes, return_attn_probs, sink: not implemented (must be off).
    Returns:
        ``out [B, Sq, Hq, Dv]``, or ``(out, lse)``.
    """
    _check_common(_OP, q, k, v, 4, dropout_p, bias, alibi_slopes, return_attn_probs, sink,
                  window_size)  # fmt: skip
    if k.shape[0] != q.shape[0] or v.shape[:2] != k.shape[:2]:
        fail(_OP, "k/v", f"batch {q.shape[0]} and one key length",
             f"k {tuple(k.shape)}, v {tuple(v.shape)}")  # fmt: skip
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    window = (int(window_size[0]), int(window_size[1]))
    return _run(q, k, v, None, None, q.shape[1], k.shape[1], float(scale), bool(causal), window,
                return_lse)  # fmt: skip


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    bias: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_lse: bool = False,
    return_attn_probs: bool = False,
    sink: torch.Tensor | None = None,
):
    """Attention over packed sequences: q ``[Tq, Hq, Dqk]``, k ``[Tk, Hkv, Dqk]``, v ``[Tk, Hkv,
    Dv]``; ``cu_seqlens_*`` int32 ``[batch + 1]`` (sequence i is rows ``cu[i]:cu[i+1]``; empty
    sequences allowed); ``max_seqlen_*`` at least the longest sequence. Masks apply per sequence
    (causal bottom-right per sequence). Returns ``out [Tq, Hq, Dv]`` or ``(out, lse [Hq, Tq])``.
    """
    op = "flash_attn_varlen"
    _check_common(op, q, k, v, 3, dropout_p, bias, alibi_slopes, return_attn_probs, sink,
                  window_size)  # fmt: skip
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_tensor(op, name, cu, ndim=1, dtypes=(torch.int32,))
        check(cu.device == q.device, op, name, f"a tensor on {q.device}", cu.device)
    check(cu_seqlens_q.numel() == cu_seqlens_k.numel() and cu_seqlens_q.numel() >= 1, op,
          "cu_seqlens_k", f"{cu_seqlens_q.numel()} entries (same as cu_seqlens_q, >= 1)",
          cu_seqlens_k.numel())  # fmt: skip
    if v.shape[0] != k.shape[0]:
        fail(op, "v", f"{k.shape[0]} tokens (same as k)", f"shape {tuple(v.shape)}")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    window = (int(window_size[0]), int(window_size[1]))
    return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                float(scale), bool(causal), window, return_lse)  # fmt: skip
