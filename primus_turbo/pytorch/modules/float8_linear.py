"""``Float8Linear``: ``y = x @ W^T + bias`` with FP8 GEMMs (forward, dgrad, wgrad).

A drop-in for :class:`primus_turbo.pytorch.modules.Linear` / ``torch.nn.Linear``: same weight
``[out_features, in_features]`` and bias, parameters kept in high precision; ``config``
(:class:`Float8QuantConfig`, default E4M3 tensorwise) selects the recipe. Every quantization
happens inside :func:`primus_turbo.pytorch.ops.gemm_fp8`. With ``strategy=DELAYED`` (tensorwise)
the module keeps ``fp8_scaling`` (:class:`~primus_turbo.pytorch.ops.fp8_delayed.Fp8DelayedScaling`:
amax histories and scales of the input, the weight and grad_output, E5M2 for grad_output with
HYBRID) as a submodule (saved in ``state_dict``); the input and weight scalers are updated after
every forward, the grad_output one after every backward.
"""

from __future__ import annotations

import torch
from torch import nn

from primus_turbo.pytorch.core.checks import check
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingStrategy
from primus_turbo.pytorch.ops.gemm_fp8 import gemm_fp8


class Float8Linear(nn.Linear):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        config: Float8QuantConfig | None = None,
        **kwargs,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, **kwargs)
        self._set_config(config)

    def _set_config(self, config: Float8QuantConfig | None) -> None:
        self.config = Float8QuantConfig() if config is None else config
        self.fp8_scaling = None
        if self.config.strategy == ScalingStrategy.DELAYED:
            from primus_turbo.pytorch.ops.fp8_delayed import Fp8DelayedScaling

            self.fp8_scaling = Fp8DelayedScaling(self.config, device=self.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check(
            x.dim() >= 1 and x.shape[-1] == self.in_features,
            "Float8Linear",
            "x",
            f"a tensor [..., {self.in_features}]",
            f"shape {tuple(x.shape)}",
        )
        x2 = x.reshape(-1, self.in_features)
        w = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)
        y = gemm_fp8(x2, w, trans_b=True, out_dtype=x.dtype, config=self.config,
                     delayed_scaling=self.fp8_scaling)  # fmt: skip
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    @classmethod
    def from_float(
        cls, mod: nn.Module, config: Float8QuantConfig | None = None, inplace: bool = True
    ) -> Float8Linear:
        """Convert an ``nn.Linear`` (or primus ``Linear``); shares its parameters when
        ``inplace`` (the module's class is swapped), else copies them into a new module."""
        if inplace and isinstance(mod, nn.Linear):
            mod.__class__ = cls
            mod._set_config(config)
            return mod
        w = mod.weight
        new = cls(mod.in_features, mod.out_features, mod.bias is not None, config,
                  device=w.device, dtype=w.dtype)  # fmt: skip
        with torch.no_grad():
            new.weight.copy_(w)
            if mod.bias is not None:
                new.bias.copy_(mod.bias)
        return new

    def extra_repr(self) -> str:
        return super().extra_repr() + f", config={self.config}"
