"""RMSNorm backends (TURBO = our C++ kernels, TRITON, TORCH), their dispatcher and custom ops.

Every backend takes ``x [M, N]`` (contiguous), ``gamma [N]``, ``eps``, ``zero_centered`` and has
``execute(...) -> (y, rstd)`` and ``backward(dy, x, gamma, rstd, zero_centered) -> (dx, dgamma)``,
with ``rstd [M]`` fp32. The forward's backend also runs the backward.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from primus_turbo.build_info import native_has_gpu, native_ops, native_status
from primus_turbo.pytorch.core.backend import (
    YES,
    AutoKernelDispatcher,
    BackendType,
    KernelBackend,
    PrecisionType,
    Verdict,
    no,
)
from primus_turbo.pytorch.core.platform import is_rocm, triton_interpret
from primus_turbo.pytorch.reference.normalization import rmsnorm_bwd_ref, rmsnorm_fwd_ref

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
native_status()  # load the extension now (never first inside a torch.compile trace)

# C++ GPU kernels: register-cached 16-byte vector path up to this many elements per row.
TURBO_GPU_MAX_VEC_HIDDEN = 16384


@functools.lru_cache(maxsize=1)
def turbo_gpu_fwd() -> tuple[str, int]:
    """``(kernel, min_hidden)``: the TURBO backend's GPU forward runs ``kernel`` ("triton": the
    Triton forward, tile or looped per width; "cpp": the C++ kernels) for hidden >=
    ``min_hidden`` and the C++ kernels below. Env ``PRIMUS_TURBO_RMSNORM_TURBO_FWD`` (triton |
    cpp; default triton on CUDA, cpp on ROCm, unmeasured there) and
    ``PRIMUS_TURBO_RMSNORM_TURBO_FWD_MIN_N`` (default 2048); re-read after :func:`reload_env`.
    H200 run 5.2, forward GB/s Triton vs C++: 2880 3228/3099, 4096 3608/3384 (looped), 7168
    3725/3699, 8192 3999/4004 (then 4073 with the round-2 looped defaults); below 2048 C++
    (unmeasured).
    The backward stays C++ (same fp32 ``rstd [M]``)."""
    kernel = os.environ.get("PRIMUS_TURBO_RMSNORM_TURBO_FWD", "").strip().lower()
    v = os.environ.get("PRIMUS_TURBO_RMSNORM_TURBO_FWD_MIN_N", "").strip()
    default = "cpp" if is_rocm() else "triton"  # measured on the H200 only
    return (kernel if kernel in ("triton", "cpp") else default, int(v) if v.isdigit() else 2048)


def reload_env() -> None:
    """Re-read the Python-side RMSNorm knobs (``PRIMUS_TURBO_RMSNORM_TURBO_FWD*`` and the Triton
    forward's ``PRIMUS_TURBO_RMSNORM_TRITON_FWD*``) at the next call."""
    from primus_turbo.triton.normalization.rmsnorm_kernel import reload_env as triton_reload

    turbo_gpu_fwd.cache_clear()
    triton_reload()


class RMSNormDispatcher(AutoKernelDispatcher):
    family = "rmsnorm"
    memoize_resolution = True  # make_key covers everything can_handle looks at

    @classmethod
    def precision(cls, x: torch.Tensor, **kwargs: Any) -> PrecisionType:
        return PrecisionType.BF16_FP16_FP32

    @classmethod
    def default_backend(cls, x, gamma, eps, zero_centered, **kwargs) -> BackendType:
        """GPU: the C++ kernel where its vectorised path applies (16-byte rows up to 16K), else
        Triton. CPU: the C++ kernel when the extension is built, else TORCH."""
        n = x.shape[-1]
        if x.device.type == "cuda":
            vec = 16 // x.element_size()
            if n % vec == 0 and n <= TURBO_GPU_MAX_VEC_HIDDEN and not zero_centered:
                return BackendType.TURBO
            return BackendType.TRITON
        return BackendType.TURBO

    @classmethod
    def make_key(cls, x, gamma, eps, zero_centered, **kwargs):
        return (x.shape[0], x.shape[1], x.dtype, gamma.dtype, zero_centered, x.device.type)

    @classmethod
    def describe(cls, x, gamma, eps, zero_centered, **kwargs) -> str:
        return (
            f"x={tuple(x.shape)}:{x.dtype} gamma:{gamma.dtype} zero_centered={zero_centered} "
            f"device={x.device}"
        )


@RMSNormDispatcher.register
class RMSNormTurboBackend(KernelBackend):
    """Our C++ kernels (``torch.ops.primus_turbo_cpp.rmsnorm_fwd/bwd``): CPU, CUDA and HIP; on
    the GPU the forward from hidden 2048 runs the Triton forward (:func:`turbo_gpu_fwd`)."""

    backend_type = BackendType.TURBO

    @staticmethod
    def can_handle(x, gamma, eps, zero_centered, **kwargs) -> Verdict:
        ok, why = native_status()
        if not ok:
            return no(why)
        if x.device.type == "cuda" and not native_has_gpu():
            return no("the C++ extension was built without GPU kernels (CPU-only build)")
        if x.device.type not in ("cpu", "cuda"):
            return no(f"needs a CPU or GPU tensor, got device {x.device}")
        if x.dtype not in FLOAT_DTYPES or gamma.dtype != x.dtype:
            return no(
                f"needs x and gamma of one dtype in fp16/bf16/fp32, got {x.dtype}/{gamma.dtype}"
            )
        if zero_centered:
            return no("zero_centered is not supported by the C++ kernels")
        return YES

    @staticmethod
    def execute(x, gamma, eps, zero_centered, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if x.device.type == "cuda":
            kernel, min_n = turbo_gpu_fwd()
            if kernel == "triton" and x.shape[1] >= min_n:
                from primus_turbo.triton.normalization.rmsnorm_kernel import rmsnorm_fwd_triton

                return rmsnorm_fwd_triton(x, gamma, eps, False)
        return native_ops().rmsnorm_fwd(x, gamma, eps)

    @staticmethod
    def backward(dy, x, gamma, rstd, zero_centered) -> tuple[torch.Tensor, torch.Tensor]:
        return native_ops().rmsnorm_bwd(dy, x, gamma, rstd)


@RMSNormDispatcher.register
class RMSNormTritonBackend(KernelBackend):
    """Triton kernels: one tile per row forward; persistent backward with fixed-order dgamma."""

    backend_type = BackendType.TRITON

    @staticmethod
    def can_handle(x, gamma, eps, zero_centered, **kwargs) -> Verdict:
        from primus_turbo.triton.normalization.rmsnorm_kernel import MAX_HIDDEN

        if x.device.type != "cuda" and not triton_interpret():
            return no(f"needs a GPU tensor (or TRITON_INTERPRET=1 on CPU), got device {x.device}")
        if x.dtype not in FLOAT_DTYPES or gamma.dtype not in FLOAT_DTYPES:
            return no(f"needs fp16/bf16/fp32 x and gamma, got {x.dtype}/{gamma.dtype}")
        if x.shape[-1] > MAX_HIDDEN:
            return no(f"hidden size must be <= {MAX_HIDDEN}, got {x.shape[-1]}")
        return YES

    @staticmethod
    def execute(x, gamma, eps, zero_centered, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        from primus_turbo.triton.normalization.rmsnorm_kernel import rmsnorm_fwd_triton

        return rmsnorm_fwd_triton(x, gamma, eps, zero_centered)

    @staticmethod
    def backward(dy, x, gamma, rstd, zero_centered) -> tuple[torch.Tensor, torch.Tensor]:
        from primus_turbo.triton.normalization.rmsnorm_kernel import rmsnorm_bwd_triton

        return rmsnorm_bwd_triton(dy, x, gamma, rstd, zero_centered)


@RMSNormDispatcher.register
class RMSNormTorchBackend(KernelBackend):
    """The pure-torch reference (fp32 math); runs anywhere."""

    backend_type = BackendType.TORCH
    autotune = False

    @staticmethod
    def can_handle(x, gamma, eps, zero_centered, **kwargs) -> Verdict:
        return YES

    @staticmethod
    def execute(x, gamma, eps, zero_centered, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        return rmsnorm_fwd_ref(x, gamma, eps, zero_centered)

    @staticmethod
    def backward(dy, x, gamma, rstd, zero_centered) -> tuple[torch.Tensor, torch.Tensor]:
        return rmsnorm_bwd_ref(dy, x, gamma, rstd, zero_centered)


@torch.library.custom_op("primus_turbo::rmsnorm_fwd_impl", mutates_args=())
def _rmsnorm_fwd_op(
    x: torch.Tensor, gamma: torch.Tensor, eps: float, zero_centered: bool, backend: int
) -> tuple[torch.Tensor, torch.Tensor]:
    return RMSNormDispatcher.execute(
        BackendType(backend), x=x, gamma=gamma, eps=eps, zero_centered=zero_centered
    )


@_rmsnorm_fwd_op.register_fake
def _rmsnorm_fwd_fake(x, gamma, eps, zero_centered, backend):
    return torch.empty_like(x), x.new_empty((x.shape[0],), dtype=torch.float32)


@torch.library.custom_op("primus_turbo::rmsnorm_bwd_impl", mutates_args=())
def _rmsnorm_bwd_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    gamma: torch.Tensor,
    rstd: torch.Tensor,
    zero_centered: bool,
    backend: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    impl = RMSNormDispatcher.backend_class(BackendType(backend))
    return impl.backward(dy, x, gamma, rstd, zero_centered)


@_rmsnorm_bwd_op.register_fake
def _rmsnorm_bwd_fake(dy, x, gamma, rstd, zero_centered, backend):
    return torch.empty_like(x), torch.empty_like(gamma)


def rmsnorm_fwd_impl(
    x: torch.Tensor, gamma: torch.Tensor, eps: float, zero_centered: bool, backend: BackendType
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward on one resolved backend; the custom op ``primus_turbo::rmsnorm_fwd_impl`` under
    torch.compile, a direct call in eager mode (same result, less dispatch cost)."""
    if torch.compiler.is_compiling():
        return _rmsnorm_fwd_op(x, gamma, eps, zero_centered, backend.value)
    return RMSNormDispatcher.execute(
        backend, x=x, gamma=gamma, eps=eps, zero_centered=zero_centered
    )


def rmsnorm_bwd_impl(
    dy: torch.Tensor,
    x: torch.Tensor,
    gamma: torch.Tensor,
    rstd: torch.Tensor,
    zero_centered: bool,
    backend: BackendType,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward on the forward's backend (custom op ``primus_turbo::rmsnorm_bwd_impl`` when
    compiling)."""
    if torch.compiler.is_compiling():
        return _rmsnorm_bwd_op(dy, x, gamma, rstd, zero_centered, backend.value)
    impl = RMSNormDispatcher.backend_class(backend)
    return impl.backward(dy, x, gamma, rstd, zero_centered)
