"""``Linear``: ``y = x @ W^T + bias`` through :func:`primus_turbo.pytorch.ops.gemm`."""

from __future__ import annotations

import math

import torch
from torch import nn

from primus_turbo.pytorch.core.checks import check
from primus_turbo.pytorch.ops.gemm import gemm


class Linear(nn.Module):
    """Drop-in for ``torch.nn.Linear``; weight ``[out_features, in_features]``.

    Inputs of any leading shape ``[..., in_features]`` are flattened to 2-D for the GEMM.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check(
            x.dim() >= 1 and x.shape[-1] == self.in_features,
            "Linear",
            "x",
            f"a tensor [..., {self.in_features}]",
            f"shape {tuple(x.shape)}",
        )
        y = gemm(x.reshape(-1, self.in_features), self.weight, trans_b=True)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " + (
            f"bias={self.bias is not None}"
        )
