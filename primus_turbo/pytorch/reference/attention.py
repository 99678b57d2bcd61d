"""Reference attention in fp32 (or fp64) with explicit masks: dense bshd and varlen (THD)."""

from __future__ import annotations

import torch


def attention_mask(sq: int, sk: int, causal: bool, window: tuple[int, int], device) -> torch.Tensor:
    """``[sq, sk]`` bool, True where query ``i`` sees key ``j`` (bottom-right aligned)."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    off = sk - sq
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        ok &= j <= i + off + right
    if left >= 0:
        ok &= j >= i + off - left
    return ok


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    acc_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [B, Sq, Hq, Dv] in q.dtype, lse [B, Hq, Sq] fp32)``; rows without a visible key
    give 0 and lse = -inf. GQA: kv head ``h // (Hq / Hkv)``. Differentiable."""
    b, sq, hq, dqk = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else dqk**-0.5
    group = hq // hkv
    qf = q.to(acc_dtype).transpose(1, 2)  # [B, H, Sq, D]
    kf = k.to(acc_dtype).transpose(1, 2).repeat_interleave(group, dim=1)
    vf = v.to(acc_dtype).transpose(1, 2).repeat_interleave(group, dim=1)
    s = (qf @ kf.transpose(-1, -2)) * scale
    mask = attention_mask(sq, sk, causal, window_size, q.device)
    empty = ~mask.any(dim=-1, keepdim=True)  # rows that see no key
    s = s.masked_fill(~mask, float("-inf")).masked_fill(empty, 0.0)  # finite lse, no NaN grads
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).masked_fill(~mask, 0.0)
    out = (p @ vf).transpose(1, 2).to(q.dtype)
    return out, lse.masked_fill(empty[:, 0], float("-inf")).float()


def attention_varlen_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    acc_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed ``[T, H, D]`` inputs; ``(out [Tq, Hq, Dv], lse [Hq, Tq])``, one sequence at a time."""
    cq = cu_seqlens_q.tolist()
    ck = cu_seqlens_k.tolist()
    outs, lses = [], []
    for i in range(len(cq) - 1):
        qi = q[cq[i] : cq[i + 1]].unsqueeze(0)
        ki = k[ck[i] : ck[i + 1]].unsqueeze(0)
        vi = v[ck[i] : ck[i + 1]].unsqueeze(0)
        o, lse = attention_ref(qi, ki, vi, softmax_scale, causal, window_size, acc_dtype)
        outs.append(o[0])
        lses.append(lse[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)
