"""``TurboAttention``: an ``nn.Module`` over :func:`flash_attn_func` (or the FP8 variant)."""

from __future__ import annotations

import torch
from torch import nn

from primus_turbo.pytorch.core.checks import check
from primus_turbo.pytorch.ops.attention import flash_attn_func


class TurboAttention(nn.Module):
    """Attention core of a transformer block: ``forward(q, k, v)`` on ``[B, S, H, D]`` tensors.

    Holds the call's settings (causal, window, scale); no parameters. ``fp8_config`` not None
    routes to ``flash_attn_fp8_func`` when that op is available. Context parallelism
    (``ulysses_group``/``ring_group``) is not implemented and must be None.
    """

    def __init__(
        self,
        dropout_p: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: tuple[int, int] = (-1, -1),
        alibi_slopes: torch.Tensor | None = None,
        deterministic: bool = False,
        return_lse: bool = False,
        return_attn_probs: bool = False,
        fp8_config=None,
        ulysses_group=None,
        ring_group=None,
    ) -> None:
        super().__init__()
        op = "TurboAttention"
        for name, val in (("ulysses_group", ulysses_group), ("ring_group", ring_group)):
            check(val is None, op, name, "None (context parallelism is not implemented)",
                  type(val).__name__, NotImplementedError)  # fmt: skip
        self.dropout_p = dropout_p
        self.softmax_scale = softmax_scale
        self.causal = causal
        self.window_size = tuple(window_size)
        self.alibi_slopes = alibi_slopes
        self.deterministic = deterministic
        self.return_lse = return_lse
        self.return_attn_probs = return_attn_probs
        self.fp8_config = fp8_config

    def forward(self, q, k, v, bias: torch.Tensor | None = None):
        kwargs = dict(
            dropout_p=self.dropout_p,
            softmax_scale=self.softmax_scale,
            causal=self.causal,
            window_size=self.window_size,
            bias=bias,
            alibi_slopes=self.alibi_slopes,
            deterministic=self.deterministic,
            return_lse=self.return_lse,
            return_attn_probs=self.return_attn_probs,
        )
        if self.fp8_config is not None:
            from primus_turbo.pytorch.ops import attention_fp8

            return attention_fp8.flash_attn_fp8_func(q, k, v, fp8_config=self.fp8_config,
                                                     **{k_: v_ for k_, v_ in kwargs.items()
                                                        if k_ != "bias"})  # fmt: skip
        return flash_attn_func(q, k, v, **kwargs)

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, window_size={self.window_size}, "
            f"softmax_scale={self.softmax_scale}, fp8={self.fp8_config is not None}"
        )
