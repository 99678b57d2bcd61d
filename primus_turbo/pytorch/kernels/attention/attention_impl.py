"""Flash attention backends (TRITON, TORCH, AITER), their dispatcher and the custom ops.

Every backend takes the same keywords: ``q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal,
window, return_lse`` (dense bshd when ``cu_q`` is None, else packed THD) and returns
``(out, lse)``; lse is ``[B, Hq, Sq]`` (dense) or ``[Hq, Tq]`` (varlen) fp32, or None when the
backend was not asked for it. Non-differentiable backends also provide ``backward``.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import statistics
from typing import Any

import torch

from primus_turbo.pytorch.core.autotune import time_fn
from primus_turbo.pytorch.core.backend import (
    YES,
    AutoKernelDispatcher,
    BackendType,
    KernelBackend,
    PrecisionType,
    Verdict,
    no,
)
from primus_turbo.pytorch.core.platform import is_graph_capturing, triton_interpret
from primus_turbo.pytorch.reference.attention import attention_ref, attention_varlen_ref

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HALF_DTYPES = (torch.float16, torch.bfloat16)


def effective_window(causal: bool, window: tuple[int, int]) -> tuple[int, int]:
    """``(left, right)`` with causal folded in (right = 0); -1 means unbounded."""
    return (window[0], 0) if causal else (window[0], window[1])


def has_empty_rows(sq: int, sk: int, causal: bool, window: tuple[int, int]) -> bool:
    """Whether some query row sees no key (only a right bound can cause that; dense case)."""
    left, right = effective_window(causal, window)
    return (right >= 0 and sk - sq + right < 0) or sk == 0


def _dims(q, k, v, cu_q):
    """``(batch, hq, hkv, dqk, dv)``."""
    if cu_q is not None:
        return cu_q.numel() - 1, q.shape[1], k.shape[1], q.shape[2], v.shape[2]
    return q.shape[0], q.shape[2], k.shape[2], q.shape[3], v.shape[3]


# SDPA kernels tried in this order (the first that supports the call runs it). On the H200
# (torch 2.11) cuDNN beat flash on every benchmarked shape (fwd+bwd 450-600 vs 290-320 TFLOPS);
# where cuDNN is absent (ROCm) or cannot take the call, SDPA falls through to the next name.
SDPA_ORDER = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
_SDPA_ENABLED = {  # torch.backends.cuda switch of each SDPA kernel (the user's global choice)
    "CUDNN_ATTENTION": "cudnn_sdp_enabled",
    "FLASH_ATTENTION": "flash_sdp_enabled",
    "EFFICIENT_ATTENTION": "mem_efficient_sdp_enabled",
    "MATH": "math_sdp_enabled",
}


def _has_set_priority() -> bool:
    from torch.nn.attention import sdpa_kernel

    return "set_priority" in inspect.signature(sdpa_kernel).parameters


_SET_PRIORITY = _has_set_priority()


@functools.cache
def _sdpa_known() -> tuple[tuple[str, Any, Any], ...]:
    """``(name, SDPBackend member, its enabled-switch getter)`` for each ``SDPA_ORDER`` kernel
    this torch has."""
    from torch.nn.attention import SDPBackend

    return tuple((n, getattr(SDPBackend, n), getattr(torch.backends.cuda, _SDPA_ENABLED[n]))
                 for n in SDPA_ORDER if hasattr(SDPBackend, n))  # fmt: skip


def _sdpa_names() -> tuple[list[str], list[str]]:
    """``(names, on)``: the ``SDPA_ORDER`` names this torch has, and those the user left on."""
    known = _sdpa_known()
    return [n for n, _, _ in known], [n for n, _, enabled in known if enabled()]


def sdpa_order() -> list:
    """The ``SDPBackend`` list SDPA runs under. Eager: ``SDPA_ORDER`` minus the kernels the user
    switched off (``torch.backends.cuda.*_sdp_enabled`` / an outer ``sdpa_kernel``). Under
    torch.compile the switches cannot be read while tracing, so the whole order is used."""
    from torch.nn.attention import SDPBackend

    if torch.compiler.is_compiling():
        names = [n for n in SDPA_ORDER if hasattr(SDPBackend, n)]
    else:
        names, on = _sdpa_names()
        names = on or names
    return [getattr(SDPBackend, n) for n in names]


SDPA_CTX_MODES = ("fast", "full")


@functools.cache
def sdpa_ctx_mode() -> str:
    """``PRIMUS_TURBO_ATTN_SDPA_CTX``: how :func:`sdpa_pinned` imposes ``SDPA_ORDER``.

    ``fast`` (default): set torch's SDPA priority list directly (two C calls; nothing at all
    when it already starts with our order) and leave the enable switches alone (they already
    say what :func:`sdpa_order` read; the context also switched OVERRIDEABLE off, a kernel SDPA
    never picks for CUDA/ROCm tensors). ``full``: the ``sdpa_kernel(order, set_priority=True)``
    context of before (rewrites and restores all five switches and the priority, ~25-50 us of
    Python per call on a busy host). Both run the same kernel; only host time differs."""
    val = os.environ.get("PRIMUS_TURBO_ATTN_SDPA_CTX", "").strip().lower() or "fast"
    if val not in SDPA_CTX_MODES:
        raise ValueError(
            "primus_turbo: environment variable PRIMUS_TURBO_ATTN_SDPA_CTX expected one of "
            f"{SDPA_CTX_MODES}, got {val!r}"
        )
    return val


_HAS_PRIORITY_API = all(
    hasattr(torch._C, n) for n in ("_get_sdp_priority_order", "_set_sdp_priority_order")
)


def _sdpa_fast(q, k, v, order, kwargs):
    """SDPA with ``order`` first in torch's priority list, the previous list restored after.
    The enable switches are not touched: ``order`` holds exactly the kernels already on."""
    prev = list(torch._C._get_sdp_priority_order())
    want = [int(b) for b in order]
    if prev[: len(want)] == want:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
    torch._C._set_sdp_priority_order(want + [p for p in prev if p not in want])
    try:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
    finally:
        torch._C._set_sdp_priority_order(prev)


def sdpa_pinned(q, k, v, **kwargs):
    """``scaled_dot_product_attention`` under :func:`sdpa_order` (as a priority list where torch
    has ``set_priority``). The backward is the autograd node of the forward kernel, so one call's
    forward and backward always run on the same SDPA kernel."""
    from torch.nn.attention import sdpa_kernel

    if (
        _SET_PRIORITY
        and _HAS_PRIORITY_API
        and not torch.compiler.is_compiling()
        and sdpa_ctx_mode() == "fast"
    ):
        on = [b for _, b, enabled in _sdpa_known() if enabled()]
        if on:  # all switched off: sdpa_order re-enables the list, only the context can do that
            return _sdpa_fast(q, k, v, on, kwargs)
    order = sdpa_order()
    ctx = sdpa_kernel(order, set_priority=True) if _SET_PRIORITY else sdpa_kernel(order)
    with ctx:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)


def _sdpa_plain(sq, sk, causal, window) -> bool:
    """SDPA's flags express the mask: no window, causal only when top-left == bottom-right."""
    left, right = window
    return left < 0 and right < 0 and (not causal or sq == sk)


class AttnDispatcher(AutoKernelDispatcher):
    family = "attn"
    memoize_resolution = True  # make_key covers shapes, dtypes, flags and device

    @classmethod
    def precision(cls, q: torch.Tensor, **kwargs: Any) -> PrecisionType:
        return PrecisionType.BF16_FP16_FP32

    @classmethod
    def default_backend(cls, q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, window,
                        return_lse, **kwargs) -> BackendType:  # fmt: skip
        if q.device.type != "cuda":
            return BackendType.TRITON if triton_interpret() else BackendType.TORCH
        sdpa_ok = cu_q is None and not return_lse and _sdpa_plain(max_sq, max_sk, causal, window)
        if not sdpa_ok or q.dtype not in HALF_DTYPES:
            return BackendType.TRITON if q.dtype in HALF_DTYPES else BackendType.TORCH
        if torch.compiler.is_compiling() or is_graph_capturing():
            return BackendType.TORCH
        # Both can run: time forward+backward once per shape key (cached like autotune).
        args = dict(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_sq=max_sq, max_sk=max_sk,
                    scale=scale, causal=causal, window=window, return_lse=return_lse)  # fmt: skip
        return cls.tune(**args)

    @classmethod
    def make_key(cls, q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, window, return_lse,
                 **kwargs):  # fmt: skip
        return (tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, k.dtype, v.dtype,
                cu_q is not None, max_sq, max_sk, causal, tuple(window), return_lse,
                q.device.type)  # fmt: skip

    @classmethod
    def describe(cls, q, k, v, cu_q, max_sq, max_sk, causal, window, **kwargs) -> str:
        return (
            f"q:{tuple(q.shape)} k:{tuple(k.shape)} v:{tuple(v.shape)} dtype:{q.dtype} "
            f"varlen={cu_q is not None} max_seqlen=({max_sq},{max_sk}) causal={causal} "
            f"window={tuple(window)} device={q.device}"
        )

    # A backend other than SDPA must beat it by this factor to be picked: the default has to be
    # at least as fast as SDPA on every shape, so a near tie goes to SDPA, not to timing noise.
    tune_margin: dict[BackendType, float] = {BackendType.TORCH: 1.0}
    default_margin = 1.03
    tune_budget_ms = 300.0  # timed repetitions per backend and shape (at least 3, at most 20)

    @classmethod
    def time_backend(cls, backend: BackendType, device: torch.device, **kwargs: Any) -> float:
        """Forward + backward time (what a training step pays), like with like for every
        backend: same inputs, same all-ones dO, L2 flushed before each repetition, median of
        3-20 repetitions, scaled by the backend's margin (see ``tune_margin``)."""
        impl = cls._backends[backend]
        q, k, v = (kwargs[n].detach().requires_grad_() for n in ("q", "k", "v"))
        args = {**kwargs, "q": q, "k": k, "v": v}

        def step():
            if impl.differentiable:
                out, _ = impl.execute(**args)
                grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
            else:
                with torch.no_grad():
                    out, lse = impl.execute(**{**args, "return_lse": True})
                grads = impl.backward(torch.ones_like(out), out, lse, **args)
            return grads

        margin = cls.tune_margin.get(backend, cls.default_margin)
        with torch.enable_grad():
            if device.type != "cuda":
                return time_fn(step, device) * margin
            try:
                return _time_l2_cold(step, device, cls.tune_budget_ms) * margin
            except Exception as exc:  # noqa: BLE001 - a failing candidate loses the race
                from primus_turbo.pytorch.core.logging import get_logger

                get_logger().info("attn autotune candidate %s failed: %r", backend.name, exc)
                return math.inf


def _time_l2_cold(fn, device: torch.device, budget_ms: float) -> float:
    """Median milliseconds of ``fn()`` on a GPU, L2 flushed (256 MiB written) before each run;
    2 warm-up runs (the first also compiles / tunes), then 3-20 runs within ``budget_ms``. No
    flush buffer when memory is short (every backend is then timed alike, L2-warm)."""
    try:
        flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    except torch.OutOfMemoryError:
        flush = None
    for _ in range(2):
        fn()
    torch.cuda.synchronize(device)
    times: list[float] = []
    reps = 3
    while len(times) < reps:
        if flush is not None:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        if len(times) == 1:
            reps = max(3, min(20, int(budget_ms / max(times[0], 1e-3))))
    del flush
    return statistics.median(times)


@AttnDispatcher.register
class AttnTritonBackend(KernelBackend):
    """Our Triton flash attention (fwd + deterministic two-kernel bwd)."""

    backend_type = BackendType.TRITON

    @staticmethod
    def can_handle(q, k, v, cu_q, **kwargs) -> Verdict:
        if q.device.type != "cuda" and not triton_interpret():
            return no(f"needs a GPU tensor (or TRITON_INTERPRET=1 on CPU), got device {q.device}")
        if q.dtype not in HALF_DTYPES:
            return no(f"needs fp16/bf16 inputs, got {q.dtype}")
        _, _, _, dqk, dv = _dims(q, k, v, cu_q)
        if max(dqk, dv) > 256:
            return no(f"head dims up to 256, got qk {dqk} / v {dv}")
        return YES

    @staticmethod
    def execute(q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, window, return_lse,
                **kwargs):  # fmt: skip
        from primus_turbo.triton.attention.attn_launch import attn_fwd_triton

        return attn_fwd_triton(q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, window)

    @staticmethod
    def backward(do, out, lse, q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, window,
                 **kwargs):  # fmt: skip
        from primus_turbo.triton.attention.attn_launch import attn_bwd_triton

        return attn_bwd_triton(do, q, k, v, out, lse, cu_q, cu_k, max_sq, max_sk, scale, causal,
                               window)  # fmt: skip


def _attn_mask(sq, sk, causal, window, device):
    from primus_turbo.pytorch.reference.attention import attention_mask

    return attention_mask(sq, sk, causal, window, device)


@AttnDispatcher.register
class AttnTorchBackend(KernelBackend):
    """``torch.nn.functional.scaled_dot_product_attention`` run with the kernel order
    ``SDPA_ORDER`` (cuDNN first, then flash, memory-efficient, math; kernels the user switched off
    with ``torch.backends.cuda`` / ``sdpa_kernel`` are left out in eager mode).

    Causal with Sq != Sk (bottom-right) and windows go through an explicit boolean mask; GQA
    through ``enable_gqa``. Cases SDPA cannot express (lse requested, varlen, rows that see no
    key) use the fp32 reference with explicit masks (materialises the score matrix).
    """

    backend_type = BackendType.TORCH
    differentiable = True

    @staticmethod
    def can_handle(q, **kwargs) -> Verdict:
        return YES

    @staticmethod
    def execute(q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, window, return_lse,
                **kwargs):  # fmt: skip
        if cu_q is not None:
            out, lse = attention_varlen_ref(q, k, v, cu_q, cu_k, scale, causal, window)
            return out, lse
        sq, sk = q.shape[1], k.shape[1]
        if return_lse or has_empty_rows(sq, sk, causal, window) or 0 in q.shape or 0 in k.shape:
            return attention_ref(q, k, v, scale, causal, window)
        hq, hkv = q.shape[2], k.shape[2]
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        mask = None
        is_causal = False
        if _sdpa_plain(sq, sk, causal, window):
            is_causal = causal
        else:
            mask = _attn_mask(sq, sk, causal, window, q.device)
        out = sdpa_pinned(qt, kt, vt, attn_mask=mask, is_causal=is_causal, scale=scale,
                          enable_gqa=hq != hkv)  # fmt: skip
        return out.transpose(1, 2), None


@AttnDispatcher.register
class AttnAiterBackend(KernelBackend):
    """AMD's AITER flash attention (``aiter.flash_attn_func`` / ``flash_attn_varlen_func``),
    when the library is importable. Its own autograd runs the backward."""

    backend_type = BackendType.AITER
    differentiable = True

    @staticmethod
    def can_handle(q, k, v, cu_q, **kwargs) -> Verdict:
        if _aiter() is None:
            return no("the aiter library is not importable")
        if q.device.type != "cuda":
            return no(f"needs a GPU tensor, got device {q.device}")
        if q.dtype not in HALF_DTYPES:
            return no(f"needs fp16/bf16 inputs, got {q.dtype}")
        return YES

    @staticmethod
    def execute(q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, window, return_lse,
                **kwargs):  # fmt: skip
        aiter = _aiter()
        common = dict(dropout_p=0.0, softmax_scale=scale, causal=causal,
                      window_size=tuple(window), return_lse=True)  # fmt: skip
        if cu_q is not None:
            res = aiter.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_sq, max_sk, **common)
        else:
            res = aiter.flash_attn_func(q, k, v, **common)
        return res[0], res[1]


_AITER: list[Any] = []


def _aiter():
    if not _AITER:
        try:
            import aiter  # type: ignore[import-not-found]

            _AITER.append(aiter)
        except Exception:  # noqa: BLE001 - absent or broken install: the backend says no
            _AITER.append(None)
    return _AITER[0]


# ---- custom ops (opaque to torch.compile) --------------------------------------------------


@torch.library.custom_op("primus_turbo::attn_fwd_impl", mutates_args=())
def _attn_fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor | None,
    cu_k: torch.Tensor | None,
    max_sq: int,
    max_sk: int,
    scale: float,
    causal: bool,
    win_l: int,
    win_r: int,
    backend: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = AttnDispatcher.execute(
        BackendType(backend), q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_sq=max_sq,
        max_sk=max_sk, scale=scale, causal=causal, window=(win_l, win_r), return_lse=True,
    )  # fmt: skip
    return out, lse


@_attn_fwd_op.register_fake
def _attn_fwd_fake(q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, win_l, win_r, backend):
    if cu_q is not None:
        out = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    else:
        out = q.new_empty((*q.shape[:3], v.shape[3]))
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("primus_turbo::attn_bwd_impl", mutates_args=())
def _attn_bwd_op(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_q: torch.Tensor | None,
    cu_k: torch.Tensor | None,
    max_sq: int,
    max_sk: int,
    scale: float,
    causal: bool,
    win_l: int,
    win_r: int,
    backend: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    impl = AttnDispatcher.backend_class(BackendType(backend))
    return impl.backward(
        do, out, lse, q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_sq=max_sq, max_sk=max_sk,
        scale=scale, causal=causal, window=(win_l, win_r),
    )  # fmt: skip


@_attn_bwd_op.register_fake
def _attn_bwd_fake(do, q, k, v, out, lse, cu_q, cu_k, max_sq, max_sk, scale, causal, win_l,
                   win_r, backend):  # fmt: skip
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def attn_fwd_impl(q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, window, backend):
    """Forward of a non-differentiable backend: ``(out, lse)``."""
    if torch.compiler.is_compiling():
        return _attn_fwd_op(q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, window[0],
                            window[1], backend.value)  # fmt: skip
    return AttnDispatcher.execute(
        backend, q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_sq=max_sq, max_sk=max_sk, scale=scale,
        causal=causal, window=window, return_lse=True,
    )  # fmt: skip


def attn_bwd_impl(do, q, k, v, out, lse, cu_q, cu_k, max_sq, max_sk, scale, causal, window,
                  backend):  # fmt: skip
    """Backward of a non-differentiable backend: ``(dq, dk, dv)``."""
    if torch.compiler.is_compiling():
        return _attn_bwd_op(do, q, k, v, out, lse, cu_q, cu_k, max_sq, max_sk, scale, causal,
                            window[0], window[1], backend.value)  # fmt: skip
    return AttnDispatcher.backend_class(backend).backward(
        do, out, lse, q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_sq=max_sq, max_sk=max_sk,
        scale=scale, causal=causal, window=window,
    )  # fmt: skip
