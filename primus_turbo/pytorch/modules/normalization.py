"""``RMSNorm`` module over ``turbo.ops.rmsnorm``."""

from __future__ import annotations

import numbers

import torch

from primus_turbo.pytorch.ops.normalization import rmsnorm

__all__ = ["RMSNorm"]


class RMSNorm(torch.nn.Module):
    """RMSNorm over the last dim (1-D ``normalized_shape`` only).

    Args:
        normalized_shape: hidden size ``N`` (an int or a 1-element sequence).
        eps: default 1e-6.
        elementwise_affine: learnable ``weight [N]`` (ones, or zeros when zero-centered);
            without it the scale is fixed at 1.
        zero_centered_gamma: scale by ``1 + weight``.
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...] | list[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        zero_centered_gamma: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (int(normalized_shape),)
        normalized_shape = tuple(normalized_shape)
        if len(normalized_shape) != 1:
            raise ValueError(
                "primus_turbo.RMSNorm: argument 'normalized_shape' expected a single hidden "
                f"size, got {normalized_shape}"
            )
        self.normalized_shape = normalized_shape
        self.eps = 1e-6 if eps is None else float(eps)
        self.elementwise_affine = elementwise_affine
        self.zero_centered_gamma = zero_centered_gamma
        init = torch.zeros if zero_centered_gamma else torch.ones
        w = init(normalized_shape, device=device, dtype=dtype)
        if elementwise_affine:
            self.weight = torch.nn.Parameter(w)
        else:
            self.register_parameter("weight", None)
            self.register_buffer("_unit_scale", w, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight if self.weight is not None else self._unit_scale
        if w.dtype != x.dtype and self.weight is None:
            w = w.to(x.dtype)
        return rmsnorm(x, w, self.eps, self.zero_centered_gamma)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, "
            f"zero_centered_gamma={self.zero_centered_gamma}"
        )
