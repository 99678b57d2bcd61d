"""FP8 token permutation for the MoE layer: quantize the tokens rowwise BEFORE the permutation
(``T`` rows instead of ``T * topk``), then move the fp8 rows with their per-row scales.

* ``moe_permute(..., use_fp8=True, scaling_factor=s)`` (``permute_fp8`` here): the permute of
  ``ops.moe`` on the fp8 rows seen as bytes (same maps, same kernels), the scales scattered to
  the permuted rows through ``row_id_map``. A rowwise scale along H does not depend on where a
  row lands, so the result is bitwise equal to quantizing the permuted high-precision rows.
* ``moe_quantize_permute_fp8(tokens, expert_map, ...)``: quantize + fp8 permute, returning the
  ``QuantizedTensor`` that ``grouped_gemm_fp8`` takes as ``a``. Its ``source`` is a zero-memory
  gradient sink (``grad_only``): the GEMM's input gradient ``[N, H]`` reaches ``tokens`` through
  the permute backward (sum of each token's copies); the GEMM's weight gradient uses the
  dequantized fp8 rows (the values the forward multiplied).
``MoELayer``'s default ROWWISE fp8 path (``fp8_act="fused"``) starts with it; H200 figures and
the backward's analysis: ``docs/moe_notes.md``.
"""

from __future__ import annotations

import torch

from primus_turbo.pytorch.core.checks import check, check_same_device, check_tensor
from primus_turbo.pytorch.core.low_precision import ScalingGranularity, is_fp8_dtype
from primus_turbo.pytorch.core.quantized_tensor import QuantizedTensor

__all__ = ["moe_quantize_permute_fp8"]


def permute_fp8(op, tokens, expert_map, scaling_factor, scales_per_token, num_local_experts,
                num_topk, pad_multiple, num_permuted_tokens, probs, probs_layout):  # fmt: skip
    """``moe_permute`` with ``use_fp8=True`` (arguments as there, checked here)."""
    from primus_turbo.pytorch.ops.moe import moe_permute

    check_tensor(op, "tokens", tokens, ndim=2)
    check(is_fp8_dtype(tokens.dtype), op, "tokens", "an fp8 tensor (use_fp8=True)",
          tokens.dtype, TypeError)  # fmt: skip
    check(scaling_factor is not None, op, "scaling_factor", "fp32 per-token scales with "
          "use_fp8=True", None)  # fmt: skip
    check_tensor(op, "scaling_factor", scaling_factor, ndim=(1, 2), dtypes=(torch.float32,))
    check_same_device(op, tokens=tokens, scaling_factor=scaling_factor)
    t = tokens.shape[0]
    spt = scales_per_token or (1 if scaling_factor.dim() == 1 else scaling_factor.shape[1])
    check(spt >= 1, op, "scales_per_token", ">= 1 (0: from scaling_factor's shape)", spt)
    want = ((t,), (t, 1)) if spt == 1 else ((t, spt),)
    check(tuple(scaling_factor.shape) in want, op, "scaling_factor",
          f"shape {' or '.join(str(w) for w in want)}", tuple(scaling_factor.shape))  # fmt: skip
    # rows as 4-byte words where they divide (wider vectors in the row kernels), else bytes
    h = tokens.shape[1]
    word = torch.int32 if h % 4 == 0 and tokens.stride(1) == 1 and tokens.stride(0) % 4 == 0 \
        and tokens.storage_offset() % 4 == 0 else torch.uint8  # fmt: skip
    raw = tokens.view(torch.uint8)
    if word != torch.uint8:
        raw = raw.view(word)
    perm, row_map, tpe, flag, disp, _, pp = moe_permute(
        raw, expert_map, num_local_experts=num_local_experts,
        num_topk=num_topk, pad_multiple=pad_multiple, num_permuted_tokens=num_permuted_tokens,
        probs=probs, probs_layout=probs_layout, _bytes=True,
    )  # fmt: skip
    n, k = perm.shape[0], row_map.shape[1]
    s = scaling_factor.reshape(t, spt)
    flat = row_map.reshape(-1)
    dst = torch.where(flat >= 0, flat, n)  # dropped copies land in a spare row, cut below
    ps = torch.zeros((n + 1, spt), dtype=torch.float32, device=s.device)
    ps.index_copy_(0, dst, s.unsqueeze(1).expand(t, k, spt).reshape(t * k, spt))  # no sync
    ps = ps[:n]
    if scaling_factor.dim() == 1:
        ps = ps.reshape(n)
    return perm.view(torch.uint8).view(tokens.dtype), row_map, tpe, flag, disp, ps, pp


class _PermuteSink(torch.autograd.Function):
    """A zero-memory ``[N, H]`` gradient sink for ``tokens`` whose backward is the permute's:
    ``d tokens[t] = sum_k g[row_map[t, k]]``."""

    @staticmethod
    def forward(ctx, tokens, row_map, n):
        from primus_turbo.pytorch.ops.activation import grad_sink

        ctx.save_for_backward(row_map)
        ctx.x_dtype = tokens.dtype
        return grad_sink(tokens, (n, tokens.shape[1]))

    @staticmethod
    def backward(ctx, g):
        from primus_turbo.pytorch.kernels.moe import permute_impl as _impl
        from primus_turbo.pytorch.kernels.moe.permute_impl import moe_reduce_rows
        from primus_turbo.pytorch.kernels.moe.permute_v2_impl import (
            moe_reduce_v2,
            permute_impl_choice,
        )

        (row_map,) = ctx.saved_tensors
        g = g.contiguous()
        if row_map.shape[1] > 0 and _impl._use_triton(g) and permute_impl_choice() == "v2":
            dx = moe_reduce_v2(g, row_map, None, ctx.x_dtype, False, False)[0]
        else:
            dx = moe_reduce_rows(g, row_map, None, ctx.x_dtype)
        return dx, None, None


def moe_quantize_permute_fp8(
    tokens: torch.Tensor,
    expert_map: torch.Tensor,
    *,
    num_local_experts: int,
    dtype: torch.dtype,
    probs: torch.Tensor | None = None,
    num_topk: int = 0,
    pad_multiple: int = 0,
    num_permuted_tokens: int = -1,
    probs_layout: str = "topk",
):
    """Quantize ``tokens [T, H]`` (fp16/bf16) rowwise to the fp8 ``dtype`` and permute them
    (``moe_permute`` arguments). Returns ``(a, row_id_map, tokens_per_expert,
    permuted_probs)``: ``a`` a ROWWISE ``QuantizedTensor`` ``[N, H]`` (``scale_inv [N, 1]``),
    bitwise equal to quantizing ``moe_permute(tokens, ...)[0]`` rowwise, with a gradient sink
    source (``grad_only``) when ``tokens`` requires grad; ``permuted_probs`` keeps its
    gradient to ``probs``."""
    from primus_turbo.pytorch.ops.moe import moe_permute
    from primus_turbo.pytorch.ops.quantization import quantize_fp8

    op = "moe_quantize_permute_fp8"
    check_tensor(op, "tokens", tokens, ndim=2, dtypes=(torch.float16, torch.bfloat16))
    check(is_fp8_dtype(dtype), op, "dtype", "an fp8 dtype", dtype, TypeError)
    q, s = quantize_fp8(tokens.detach(), dtype, ScalingGranularity.ROWWISE, axis=-1)
    perm, row_map, tpe, _, _, ps, pp = moe_permute(
        q, expert_map, num_local_experts=num_local_experts, num_topk=num_topk,
        pad_multiple=pad_multiple, num_permuted_tokens=num_permuted_tokens,
        scaling_factor=s.reshape(-1), scales_per_token=1, probs=probs,
        probs_layout=probs_layout, use_fp8=True,
    )  # fmt: skip
    n = perm.shape[0]
    sink = None
    if tokens.requires_grad and torch.is_grad_enabled():
        sink = _PermuteSink.apply(tokens, row_map, n)
    a = QuantizedTensor(perm, ps.reshape(n, 1), tokens.dtype, ScalingGranularity.ROWWISE, 1,
                        source=sink, grad_only=sink is not None)  # fmt: skip
    return a, row_map, tpe, pp
