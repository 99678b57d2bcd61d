"""Custom ops of the fused top-k router (``primus_turbo/triton/moe/router_kernel.py``): what
torch.compile sees; eager calls go straight to the launchers (see ``permute_impl``)."""

from __future__ import annotations

import functools
import os

import torch

from primus_turbo.pytorch.core.backend import eager_or_op
from primus_turbo.pytorch.core.platform import triton_interpret

ROUTER_ENV = "PRIMUS_TURBO_MOE_ROUTER"


@functools.cache
def router_mode() -> str:
    """``PRIMUS_TURBO_MOE_ROUTER``: ``auto`` (default: the fused Triton kernels on a GPU or
    under TRITON_INTERPRET=1, up to ``MAX_EXPERTS`` experts) or ``torch`` (the composition of
    torch ops, as before session 14)."""
    mode = os.environ.get(ROUTER_ENV, "").strip().lower() or "auto"
    if mode not in ("auto", "torch"):
        raise ValueError(f"primus_turbo: {ROUTER_ENV} expected 'auto' or 'torch', got {mode!r}")
    return mode


def fused_router_usable(logits: torch.Tensor, topk: int = 1, groups: int = 1) -> bool:
    """The fused kernels run here: ``auto`` mode, a GPU or the interpreter, at most
    ``MAX_EXPERTS`` experts, ``topk`` and ``groups`` at most ``MAX_TOPK`` (unrolled rounds)."""
    from primus_turbo.triton.moe.router_kernel import MAX_EXPERTS, MAX_TOPK

    if router_mode() != "auto" or logits.shape[1] > MAX_EXPERTS:
        return False
    if max(topk, groups) > MAX_TOPK:
        return False
    return logits.device.type == "cuda" or triton_interpret()


def _router_fwd_impl(
    logits: torch.Tensor, topk: int, groups: int, selected: int, sigmoid: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from primus_turbo.triton.moe.router_kernel import router_fwd_triton

    return router_fwd_triton(logits, topk, groups, selected, sigmoid, scale)


_router_fwd_op = torch.library.custom_op(
    "primus_turbo::moe_router_fwd", _router_fwd_impl, mutates_args=()
)


@_router_fwd_op.register_fake
def _router_fwd_fake(logits, topk, groups, selected, sigmoid, scale):
    t, e = logits.shape
    f32 = {"dtype": torch.float32, "device": logits.device}
    return (torch.empty((t, e), **f32), torch.empty((t, topk), **f32),
            torch.empty((t, topk), dtype=torch.int64, device=logits.device),
            torch.empty((t,), **f32))  # fmt: skip


def _router_bwd_impl(
    logits: torch.Tensor,
    idx: torch.Tensor,
    probs: torch.Tensor,
    ssum: torch.Tensor,
    dprobs: torch.Tensor | None,
    daux: torch.Tensor | None,
    groups: int,
    sigmoid: bool,
    scale: float,
) -> torch.Tensor:
    from primus_turbo.triton.moe.router_kernel import router_bwd_triton

    return router_bwd_triton(logits, idx, probs, ssum, dprobs, daux, groups, sigmoid, scale)


_router_bwd_op = torch.library.custom_op(
    "primus_turbo::moe_router_bwd", _router_bwd_impl, mutates_args=()
)


@_router_bwd_op.register_fake
def _router_bwd_fake(logits, idx, probs, ssum, dprobs, daux, groups, sigmoid, scale):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


moe_router_fwd = eager_or_op(_router_fwd_impl, _router_fwd_op)
moe_router_bwd = eager_or_op(_router_bwd_impl, _router_bwd_op)
