"""Grouped GEMM backends (TORCH, HIPBLASLT, TRITON), their dispatcher and the custom ops.

Every backend takes the same keywords ``a, b, group_lens, group_offs, trans_b, out_dtype`` and
returns ``[M, N]`` (``execute``: forward and dgrad); ``variable_k(x, y, group_lens, group_offs,
out_dtype)`` returns ``[G, P, Q] = x_g^T @ y_g`` (the wgrad). ``group_offs`` is the int64
``[G + 1]`` exclusive prefix sum on the device, or ``None`` (each backend then derives the
offsets it needs from ``group_lens``). ``prepare_offsets(group_lens, group_offs)`` returns the
backend's own offsets tensor, which ``execute`` and ``variable_k`` accept as ``group_offs``
(the autograd function computes it once per forward and reuses it in the backward).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
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
from primus_turbo.pytorch.core.platform import (
    cuda_capability,
    device_name,
    is_graph_capturing,
    is_rocm,
    triton_interpret,
)
from primus_turbo.pytorch.reference.grouped_gemm import (
    group_offsets,
    grouped_gemm_ref,
    grouped_gemm_variable_k_ref,
)

GROUPED_DTYPES = (torch.float16, torch.bfloat16)


def grouped_dims(a: torch.Tensor, b: torch.Tensor, trans_b: bool) -> tuple[int, int, int, int]:
    """``(M, N, K, G)`` of the grouped GEMM."""
    n = b.shape[1] if trans_b else b.shape[2]
    return a.shape[0], n, a.shape[1], b.shape[0]


class GroupedGemmDispatcher(AutoKernelDispatcher):
    family = "grouped_gemm"
    memoize_resolution = True  # make_key covers shapes, dtypes, layout and device

    @classmethod
    def precision(cls, a: torch.Tensor, **kwargs: Any) -> PrecisionType:
        return PrecisionType.BF16_FP16_FP32

    @classmethod
    def default_backend(cls, a, **kwargs) -> BackendType:
        """CPU: TORCH. CUDA: where the vendor grouped GEMM (``torch._grouped_mm``) can handle
        the input, the faster of it and TRITON for this shape class, timed once (forward, plus
        dgrad and wgrad when a gradient will be needed) and cached per shape key (memory and
        disk); TRITON where the vendor cannot (fp16, fp32 output, K or N not a multiple of 8,
        ROCm). While tracing (torch.compile) the vendor; while capturing a CUDA graph, an
        earlier timing's answer or else the vendor. ``PRIMUS_TURBO_GROUPED_GEMM_DEFAULT`` =
        ``tune`` (default) | ``vendor`` | ``triton`` fixes the choice for A/B runs."""
        if a.device.type != "cuda":
            return BackendType.TORCH
        if not GroupedGemmHipblasltBackend.can_handle(a=a, **kwargs):
            return BackendType.TRITON
        mode = _default_mode()
        if mode != "tune":
            return BackendType.TRITON if mode == "triton" else BackendType.HIPBLASLT
        if torch.compiler.is_compiling():
            # no cache lookup while dynamo traces: the LRU/disk cache (file reads, OrderedDict
            # moves) is not traceable and broke fullgraph=True compiles (MoELayer)
            return BackendType.HIPBLASLT
        if is_graph_capturing():
            cached = cls._cache.get(cls.make_key(a=a, **kwargs), device_name(a.device))
            return BackendType[cached] if cached else BackendType.HIPBLASLT
        return cls.tune(a=a, **kwargs)

    @classmethod
    def step_fn(cls, backend: BackendType, **kwargs) -> Callable[[], object]:
        """What one call costs on ``backend``: the forward, or forward + dgrad + wgrad (what a
        training step runs there) when a gradient will be needed; no autograd graph."""
        a, b, trans_b = kwargs["a"], kwargs["b"], kwargs["trans_b"]
        impl = cls._backends[backend]
        if not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):
            return lambda: impl.execute(**kwargs)
        lens, offs = kwargs["group_lens"], kwargs["group_offs"]
        a, b = a.detach(), b.detach()
        m, n, _, _ = grouped_dims(a, b, trans_b)
        grad = torch.randn((m, n), device=a.device, dtype=a.dtype)

        def step():
            with torch.no_grad():
                o = impl.prepare_offsets(lens, offs)
                impl.execute(a=a, b=b, group_lens=lens, group_offs=o, trans_b=trans_b,
                             out_dtype=kwargs["out_dtype"])  # fmt: skip
                impl.execute(a=grad, b=b, group_lens=lens, group_offs=o, trans_b=not trans_b,
                             out_dtype=a.dtype)  # fmt: skip
                x, y = (grad, a) if trans_b else (a, grad)
                impl.variable_k(x, y, lens, o, b.dtype)

        return step

    @classmethod
    def time_candidates(cls, candidates, device, **kwargs) -> dict:
        """``PRIMUS_TURBO_GROUPED_GEMM_BACKEND_TUNE`` = ``flushed`` (default since session 13:
        ``grouped_gemm_tune.time_flushed``, single steps after an L2 flush and an idle kernel
        that hides the host's enqueue time, interleaved rounds) | ``rounds`` (sessions 10-12: the
        backends' step times taken together in interleaved rounds of back-to-back launches,
        ``grouped_gemm_tune.time_rounds``, best of 3, order rotated; in H200 call 13.3, run next
        to a test lane loading the host, it kept the vendor kernel on Qwen3-30B-A3B down and
        gpt-oss-20b gate_up in 3 of 3 processes although TRITON's step there read 1.00-1.09x the
        vendor's in graph timing; in call 13.4 both timings chose TRITON on all 8 cases, forward
        geomean 1.051-1.053 with ``flushed``, 1.055 with ``rounds``) | ``once`` (each backend
        timed on its own, ``time_backend``; the timing before session 10, for A/B). H200 call
        10.6 (scripts/grouped_tune_probe.py, 4 repeats per case): ``once`` read TRITON 2-50 %
        slower than the vendor where ``rounds`` (and graph timing) read it 5-16 % faster (Qwen3
        down forward: 1.44-1.52 vs 0.84-0.88 of the vendor's time), so it kept the vendor kernel
        there; with ``rounds`` the bf16 forward geomean vs torch._grouped_mm read 1.040 (7 of 8
        cases; 1.007 with ``once``), step 1.018. The eighth case (DeepSeek-V3 gate_up, then on
        TRITON) hit a Triton launch-order bug in the autograd thread, fixed by
        ``host_tma.ensure_context`` (call 10.10: the case passes, forward 1.02)."""
        if device.type != "cuda" or _backend_tune_mode() == "once":
            return super().time_candidates(candidates, device, **kwargs)
        from primus_turbo.triton.grouped_gemm.grouped_gemm_tune import time_flushed, time_rounds

        fns = {b: cls.step_fn(b, **kwargs) for b in candidates}
        timer = time_flushed if _backend_tune_mode() == "flushed" else time_rounds
        timings = timer(list(fns), lambda b: fns[b]())
        return {b: timings.get(b, math.inf) for b in candidates}

    @classmethod
    def time_backend(cls, backend: BackendType, device: torch.device, **kwargs) -> float:
        """``step_fn``'s time on its own (median of ``time_fn``)."""
        return time_fn(cls.step_fn(backend, **kwargs), device)

    @classmethod
    def make_key(cls, a, b, group_lens, group_offs, trans_b, out_dtype, **kwargs):
        m, n, k, g = grouped_dims(a, b, trans_b)
        # M in power-of-two buckets: a dropless MoE sees a new M every step, and one timing per
        # bucket is enough (can_handle does not depend on M). The unit-stride flags:
        # HIPBLASLT's can_handle (hence the default) depends on them.
        return (_bucket_rows(m), n, k, g, a.dtype, b.dtype, out_dtype, trans_b, a.device.type,
                a.stride(1) == 1, b.stride(2) == 1)  # fmt: skip

    @classmethod
    def describe(cls, a, b, group_lens, group_offs, trans_b, out_dtype, **kwargs) -> str:
        m, n, k, g = grouped_dims(a, b, trans_b)
        return (
            f"M={m} N={n} K={k} G={g} a:{a.dtype} b:{b.dtype} out:{out_dtype} "
            f"trans_b={trans_b} device={a.device}"
        )


@GroupedGemmDispatcher.register
class GroupedGemmTritonBackend(KernelBackend):
    """Our persistent, host-sync-free Triton grouped GEMM and variable-K wgrad."""

    backend_type = BackendType.TRITON

    @staticmethod
    def can_handle(a, b, out_dtype, **kwargs) -> Verdict:
        if a.device.type != "cuda" and not triton_interpret():
            return no(f"needs a GPU tensor (or TRITON_INTERPRET=1 on CPU), got device {a.device}")
        if a.dtype not in GROUPED_DTYPES or b.dtype != a.dtype:
            return no(f"needs a and b of one dtype in fp16/bf16, got {a.dtype}/{b.dtype}")
        if out_dtype not in (*GROUPED_DTYPES, torch.float32):
            return no(f"output dtype must be fp16/bf16/fp32, got {out_dtype}")
        return YES

    @staticmethod
    def prepare_offsets(group_lens, group_offs):
        """The int64 ``[G + 1]`` exclusive prefix sum."""
        return group_offsets(group_lens) if group_offs is None else group_offs

    @staticmethod
    def execute(a, b, group_lens, group_offs, trans_b, out_dtype, **kwargs) -> torch.Tensor:
        from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import grouped_gemm_triton

        offs = GroupedGemmTritonBackend.prepare_offsets(group_lens, group_offs)
        return grouped_gemm_triton(a, b, offs, trans_b, out_dtype)

    @staticmethod
    def variable_k(x, y, group_lens, group_offs, out_dtype) -> torch.Tensor:
        from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import variable_k_triton

        offs = GroupedGemmTritonBackend.prepare_offsets(group_lens, group_offs)
        return variable_k_triton(x, y, offs, group_lens.shape[0], out_dtype)


@GroupedGemmDispatcher.register
class GroupedGemmHipblasltBackend(KernelBackend):
    """The vendor grouped GEMM through ``torch._grouped_mm`` (CUTLASS on CUDA sm_90+, bf16).

    ``torch._grouped_mm`` takes int32 inclusive group ends ``[G]``: ``prepare_offsets`` makes
    them with one small kernel (a cumsum of ``group_lens`` or a cast of ``group_offs[1:]``);
    ``execute`` / ``variable_k`` also take them as ``group_offs`` (an int32 ``[G]`` tensor).
    Each GEMM is one ``_grouped_mm`` call on views (the transposes are stride swaps), followed
    by one tiny zero-fill kernel for the regions the vendor kernel leaves unwritten (rows past
    the last group end; empty groups' wgrad blocks, where the vendor does not write them
    itself). ``PRIMUS_TURBO_GROUPED_GEMM_VENDOR_FIXUP`` = ``auto`` (default: the empty-group
    pass only where a one-time probe saw the vendor leave them, ``vendor_zeroes_empty_groups``)
    | ``kernel`` (always) | ``masked_fill`` (the old full-output pass, for A/B) | ``none``.
    """

    backend_type = BackendType.HIPBLASLT

    @staticmethod
    def can_handle(a, b, trans_b, out_dtype, **kwargs) -> Verdict:
        if not _grouped_mm_available():
            return no(f"torch {torch.__version__} has no torch._grouped_mm")
        if a.device.type != "cuda" or is_rocm():
            return no(f"torch._grouped_mm is used on CUDA devices only, got device {a.device}")
        cap = cuda_capability(a.device)
        if cap is None or cap < (9, 0):
            return no(f"torch._grouped_mm needs CUDA capability >= 9.0, got {cap}")
        if a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16:
            return no(f"torch._grouped_mm takes bf16 a and b, got {a.dtype}/{b.dtype}")
        if out_dtype != torch.bfloat16:
            return no(f"output dtype must be bf16, got {out_dtype}")
        m, n, k, _ = grouped_dims(a, b, trans_b)
        if k % 8 or n % 8:
            return no(f"torch._grouped_mm needs K and N multiples of 8, got K={k} N={n}")
        if a.stride(1) != 1 or b.stride(2) != 1:
            return no(f"torch._grouped_mm wants stride-1 rows, got {a.stride()}, {b.stride()}")
        return YES

    @staticmethod
    def prepare_offsets(group_lens, group_offs):
        """int32 ``[G]`` inclusive group ends (one kernel)."""
        if group_offs is not None and group_offs.dtype == torch.int32:
            return group_offs  # already prepared
        if group_offs is not None:
            return group_offs[1:].to(torch.int32)
        return torch.cumsum(group_lens, 0, dtype=torch.int32)

    @staticmethod
    def execute(a, b, group_lens, group_offs, trans_b, out_dtype, **kwargs) -> torch.Tensor:
        ends = GroupedGemmHipblasltBackend.prepare_offsets(group_lens, group_offs)
        m, n, k, g = grouped_dims(a, b, trans_b)
        if m == 0 or n == 0 or k == 0 or g == 0:
            return a.new_zeros((m, n), dtype=out_dtype)
        out = torch._grouped_mm(a, b.transpose(1, 2) if trans_b else b, offs=ends)
        return _vendor_fixup(out, ends, tail=True)

    @staticmethod
    def variable_k(x, y, group_lens, group_offs, out_dtype) -> torch.Tensor:
        ends = GroupedGemmHipblasltBackend.prepare_offsets(group_lens, group_offs)
        g = group_lens.shape[0]
        if x.shape[0] == 0 or x.shape[1] == 0 or y.shape[1] == 0 or g == 0:
            return x.new_zeros((g, x.shape[1], y.shape[1]), dtype=out_dtype)
        out = torch._grouped_mm(x.t(), y, offs=ends)
        return _vendor_fixup(out, ends, tail=False).to(out_dtype)


@functools.cache
def _fixup_mode() -> str:
    mode = os.environ.get("PRIMUS_TURBO_GROUPED_GEMM_VENDOR_FIXUP", "auto").strip().lower()
    if mode not in ("auto", "kernel", "masked_fill", "none"):
        raise ValueError(
            "primus_turbo: PRIMUS_TURBO_GROUPED_GEMM_VENDOR_FIXUP expected one of "
            f"'auto', 'kernel', 'masked_fill', 'none', got {mode!r}"
        )
    return mode


def _vendor_fixup(out: torch.Tensor, ends: torch.Tensor, tail: bool) -> torch.Tensor:
    """Zero what ``torch._grouped_mm`` leaves unwritten: the rows past ``ends[-1]`` (``tail``,
    forward and dgrad) or the blocks of empty groups (wgrad). ``auto`` (default): as
    ``kernel``, except that the wgrad skips the empty-group pass on a device where the vendor
    kernel was seen to write those blocks itself (``vendor_zeroes_empty_groups``)."""
    mode = _fixup_mode()
    if mode == "none":
        return out
    if mode == "auto":
        if not tail and vendor_zeroes_empty_groups(out.device):
            return out
        mode = "kernel"
    if mode == "masked_fill":
        if tail:
            rows = torch.arange(out.shape[0], device=out.device)
            return out.masked_fill_((rows >= ends[-1])[:, None], 0)
        prev = torch.cat([ends.new_zeros(1), ends[:-1]])
        return out.masked_fill_((ends <= prev)[:, None, None], 0)
    from primus_turbo.triton.grouped_gemm.grouped_gemm_fixup import (
        zero_empty_groups,
        zero_tail_rows,
    )

    return zero_tail_rows(out, ends) if tail else zero_empty_groups(out, ends)


_EMPTY_PROBE: dict[tuple[str, int | None], bool] = {}


def vendor_zeroes_empty_groups(device: torch.device) -> bool:
    """Whether ``torch._grouped_mm``'s variable-K product writes zeros into the blocks of
    empty groups on ``device`` (H200, torch 2.11, call 12.4: it does, for 235 MB blocks as
    for 256 KB ones; the zero pass then cost 55 us of a 17.7 ms Mixtral-8x7B gate_up step).
    Probed once per device on the first call outside graph capture and compilation (one small
    product on NaN-filled recycled memory, one host sync); False (keep zeroing) while
    capturing before the probe ran, or where the probe could not tell."""
    key = (device.type, device.index)
    known = _EMPTY_PROBE.get(key)
    if known is not None:
        return known
    if device.type != "cuda" or torch.compiler.is_compiling() or is_graph_capturing():
        return False
    _EMPTY_PROBE[key] = _probe_empty_groups(device)
    return _EMPTY_PROBE[key]


def _probe_empty_groups(device: torch.device) -> bool:
    with torch.cuda.device(device):
        x = torch.ones((32, 64), dtype=torch.bfloat16, device=device)
        y = torch.ones((32, 48), dtype=torch.bfloat16, device=device)
        ends = torch.tensor([0, 32, 32], dtype=torch.int32, device=device)  # 0 and 2 empty
        junk = torch.full((3, 64, 48), float("nan"), dtype=torch.bfloat16, device=device)
        ptr = junk.data_ptr()
        del junk  # the caching allocator hands this NaN block to the product's output
        out = torch._grouped_mm(x.t(), y, offs=ends)
        if out.data_ptr() != ptr:  # not on the poisoned block: cannot tell
            return False
        ok = (out[0] == 0).all() & (out[2] == 0).all() & (out[1] == 32).all()
        return bool(ok)


def _bucket_rows(m: int) -> int:
    return 1 << max(m - 1, 0).bit_length()


@functools.cache
def _default_mode() -> str:
    mode = os.environ.get("PRIMUS_TURBO_GROUPED_GEMM_DEFAULT", "tune").strip().lower()
    if mode not in ("tune", "vendor", "triton"):
        raise ValueError(
            "primus_turbo: PRIMUS_TURBO_GROUPED_GEMM_DEFAULT expected one of 'tune', 'vendor', "
            f"'triton', got {mode!r}"
        )
    return mode


@functools.cache
def _backend_tune_mode() -> str:
    mode = os.environ.get("PRIMUS_TURBO_GROUPED_GEMM_BACKEND_TUNE", "flushed").strip().lower()
    if mode not in ("rounds", "flushed", "once"):
        raise ValueError(
            "primus_turbo: PRIMUS_TURBO_GROUPED_GEMM_BACKEND_TUNE expected 'rounds', 'flushed' "
            f"or 'once', got {mode!r}"
        )
    return mode


def _grouped_mm_available() -> bool:
    return hasattr(torch, "_grouped_mm")


@GroupedGemmDispatcher.register
class GroupedGemmTorchBackend(KernelBackend):
    """The pure-torch reference (loop over groups, fp32 accumulation; reads sizes on the host)."""

    backend_type = BackendType.TORCH
    autotune = False

    @staticmethod
    def can_handle(**kwargs) -> Verdict:
        return YES

    @staticmethod
    def prepare_offsets(group_lens, group_offs):
        return group_offs  # unused: the reference reads group_lens on the host

    @staticmethod
    def execute(a, b, group_lens, group_offs, trans_b, out_dtype, **kwargs) -> torch.Tensor:
        return grouped_gemm_ref(a, b, group_lens, trans_b, out_dtype)

    @staticmethod
    def variable_k(x, y, group_lens, group_offs, out_dtype) -> torch.Tensor:
        return grouped_gemm_variable_k_ref(x, y, group_lens, out_dtype)


# ---- custom ops (opaque to torch.compile, with fake implementations) ------------------------


@torch.library.custom_op("primus_turbo::grouped_gemm_impl", mutates_args=())
def _grouped_gemm_op(
    a: torch.Tensor,
    b: torch.Tensor,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None,
    trans_b: bool,
    out_dtype: torch.dtype,
    backend: int,
) -> torch.Tensor:
    return GroupedGemmDispatcher.execute(
        BackendType(backend),
        a=a,
        b=b,
        group_lens=group_lens,
        group_offs=group_offs,
        trans_b=trans_b,
        out_dtype=out_dtype,
    )


@_grouped_gemm_op.register_fake
def _grouped_gemm_fake(a, b, group_lens, group_offs, trans_b, out_dtype, backend):
    m, n, _, _ = grouped_dims(a, b, trans_b)
    return a.new_empty((m, n), dtype=out_dtype)


@torch.library.custom_op("primus_turbo::grouped_gemm_variable_k_impl", mutates_args=())
def _variable_k_op(
    x: torch.Tensor,
    y: torch.Tensor,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None,
    out_dtype: torch.dtype,
    backend: int,
) -> torch.Tensor:
    impl = GroupedGemmDispatcher.backend_class(BackendType(backend))
    return impl.variable_k(x, y, group_lens, group_offs, out_dtype)


@_variable_k_op.register_fake
def _variable_k_fake(x, y, group_lens, group_offs, out_dtype, backend):
    return x.new_empty((group_lens.shape[0], x.shape[1], y.shape[1]), dtype=out_dtype)


def grouped_gemm_impl(
    a: torch.Tensor,
    b: torch.Tensor,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor,
    trans_b: bool,
    out_dtype: torch.dtype,
    backend: BackendType,
) -> torch.Tensor:
    """Run one resolved backend (the custom op under torch.compile, a direct call in eager)."""
    if torch.compiler.is_compiling():
        return _grouped_gemm_op(a, b, group_lens, group_offs, trans_b, out_dtype, backend.value)
    return GroupedGemmDispatcher.execute(
        backend,
        a=a,
        b=b,
        group_lens=group_lens,
        group_offs=group_offs,
        trans_b=trans_b,
        out_dtype=out_dtype,
    )


def grouped_gemm_variable_k_impl(
    x: torch.Tensor,
    y: torch.Tensor,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor,
    out_dtype: torch.dtype,
    backend: BackendType,
) -> torch.Tensor:
    """``[G, P, Q] = x_g^T @ y_g`` on one resolved backend."""
    if torch.compiler.is_compiling():
        return _variable_k_op(x, y, group_lens, group_offs, out_dtype, backend.value)
    impl = GroupedGemmDispatcher.backend_class(backend)
    return impl.variable_k(x, y, group_lens, group_offs, out_dtype)
