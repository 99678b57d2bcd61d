"""``GroupedLinear``: per-group ``y_g = x_g @ W_g^T`` through :func:`ops.grouped_gemm`."""

from __future__ import annotations

import math

import torch
from torch import nn

from primus_turbo.pytorch.core.checks import check
from primus_turbo.pytorch.ops.grouped_gemm import grouped_gemm


class GroupedLinear(nn.Module):
    """One linear layer per group (MoE experts), no bias; weight ``[G, out, in]``.

    ``forward(x, group_lens, group_offs=None)``: ``x [M, in]`` packed by group, ``group_lens``
    int64 ``[G]`` on x's device; returns ``[M, out]``.
    """

    def __init__(
        self,
        group_num: int,
        in_features: int,
        out_features: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.group_num = group_num
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(
            torch.empty(group_num, out_features, in_features, device=device, dtype=dtype)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in self.weight.data:  # each expert as its own nn.Linear weight
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))

    def forward(
        self,
        x: torch.Tensor,
        group_lens: torch.Tensor,
        group_offs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        check(
            x.dim() == 2 and x.shape[-1] == self.in_features,
            "GroupedLinear",
            "x",
            f"a tensor [M, {self.in_features}]",
            f"shape {tuple(x.shape)}",
        )
        return grouped_gemm(x, self.weight, group_lens, group_offs, trans_b=True)

    def extra_repr(self) -> str:
        return (
            f"group_num={self.group_num}, in_features={self.in_features}, "
            f"out_features={self.out_features}"
        )
