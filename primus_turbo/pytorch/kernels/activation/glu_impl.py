"""SwiGLU/GeGLU custom ops: the Triton kernels on GPU (or under TRITON_INTERPRET=1), the fp32
reference elsewhere. No dispatcher: one kernel per op, as in the reference system. The custom
ops are what torch.compile sees; eager calls run the implementations directly."""

from __future__ import annotations

import torch

from primus_turbo.pytorch.core.backend import eager_or_op
from primus_turbo.pytorch.core.platform import triton_interpret
from primus_turbo.pytorch.reference.activation import glu_bwd_ref, glu_ref

ACTS = ("silu", "gelu")


def _use_triton(x: torch.Tensor) -> bool:
    return x.device.type == "cuda" or triton_interpret()


def _glu_fwd(
    x: torch.Tensor, probs: torch.Tensor | None, row_mask: torch.Tensor | None, act: int
) -> torch.Tensor:
    """``x: [T, 2H]`` -> ``[T, H]``; ``act`` indexes ``ACTS``."""
    if _use_triton(x):
        from primus_turbo.triton.activation.glu_kernel import glu_fwd_triton

        return glu_fwd_triton(x, probs, row_mask, act)
    return glu_ref(x, probs, row_mask, ACTS[act])


_glu_fwd_op = torch.library.custom_op("primus_turbo::glu_fwd_impl", _glu_fwd, mutates_args=())


@_glu_fwd_op.register_fake
def _glu_fwd_fake(x, probs, row_mask, act):
    return x.new_empty((x.shape[0], x.shape[1] // 2))


def _glu_bwd(
    x: torch.Tensor,
    probs: torch.Tensor | None,
    row_mask: torch.Tensor | None,
    dy: torch.Tensor,
    act: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(dx [T, 2H], dprobs [T] fp32)``; dprobs is empty when ``probs`` is None."""
    if _use_triton(x):
        from primus_turbo.triton.activation.glu_kernel import glu_bwd_triton

        dx, dp = glu_bwd_triton(x, probs, row_mask, dy, act)
    else:
        dx, dp = glu_bwd_ref(x, probs, row_mask, dy, ACTS[act])
    if dp is None:
        dp = x.new_empty((0,), dtype=torch.float32)
    return dx, dp


_glu_bwd_op = torch.library.custom_op("primus_turbo::glu_bwd_impl", _glu_bwd, mutates_args=())


@_glu_bwd_op.register_fake
def _glu_bwd_fake(x, probs, row_mask, dy, act):
    n = x.shape[0] if probs is not None else 0
    return torch.empty_like(x), x.new_empty((n,), dtype=torch.float32)


# eager: the launchers directly; torch.compile: the custom ops (see ``core.backend.eager_or_op``)
glu_fwd_impl = eager_or_op(_glu_fwd, _glu_fwd_op)
glu_bwd_impl = eager_or_op(_glu_bwd, _glu_bwd_op)
