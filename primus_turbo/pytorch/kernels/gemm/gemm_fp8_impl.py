"""Scaled FP8 GEMM backends (HIPBLASLT = torch._scaled_mm, TRITON, TORCH), dispatcher, custom op.

Every backend computes the NT product ``C[M, N] = (a * sa) @ (b * sb)^T`` of quantized operands
``a [M, K]``, ``b [N, K]`` (K contiguous, as the quantization step lays them out) and takes the
keywords ``a, b, sa, sb, granularity (int value), sa_group, sb_group, out_dtype``:
* TENSORWISE: 0-d scales. ROWWISE: ``sa [M, 1]``, ``sb [N, 1]``.
* BLOCKWISE: ``sa [M / sa_group, K / 128]``, ``sb [N / sb_group, K / 128]`` (group 1 = 1x128
  blocks, 128 = 128x128 tiles), any strides.
* MX_BLOCKWISE: E8M0 byte scales ``[rows, K / 32]``; operands fp8 (MXFP8) or uint8 holding two
  E2M1 values per byte (MXFP4, then ``b.shape[1] == K / 2``). The same dispatcher serves
  ``gemm_fp4`` (precision FP4 when the operands are packed bytes).
"""

from __future__ import annotations

import functools

import torch

from primus_turbo.pytorch.core.backend import (
    YES,
    AutoKernelDispatcher,
    BackendType,
    KernelBackend,
    PrecisionType,
    Verdict,
    no,
)
from primus_turbo.pytorch.core.low_precision import (
    ScalingGranularity,
    check_mxfp8_support,
    check_scaled_mm_blockwise_support,
    triton_fp8_support,
)
from primus_turbo.pytorch.core.platform import triton_interpret

_T, _R, _B, _MX = (ScalingGranularity.TENSORWISE.value, ScalingGranularity.ROWWISE.value,
                   ScalingGranularity.BLOCKWISE.value,
                   ScalingGranularity.MX_BLOCKWISE.value)  # fmt: skip
_E5M2 = (torch.float8_e5m2, torch.float8_e5m2fnuz)
MX_OK = (torch.float8_e4m3fn, torch.float8_e5m2, torch.uint8)


class GemmFp8Dispatcher(AutoKernelDispatcher):
    family = "gemm"  # shares PRIMUS_TURBO_GEMM_BACKEND (fp8:...) with the dense GEMM
    memoize_resolution = True  # make_key covers shapes, dtypes, recipe, K-contiguity, device

    @classmethod
    def precision(cls, a, **kwargs) -> PrecisionType:
        return PrecisionType.FP4 if a.dtype == torch.uint8 else PrecisionType.FP8

    @classmethod
    def default_backend(cls, a, granularity, **kwargs) -> BackendType:
        """HIPBLASLT for tensorwise/rowwise; for BLOCKWISE on CUDA builds HIPBLASLT too when
        it can handle the call (cuBLASLt 1x128/128x128 scaling: ~1100 TFLOPS on the H200 vs
        ~780 for our Triton kernel, bench_fp8_block.log), else TRITON. ROCm keeps TRITON for
        BLOCKWISE (hipBLASLt blockwise through torch unmeasured)."""
        if a.device.type != "cuda":
            return BackendType.TRITON if triton_interpret() else BackendType.TORCH
        if granularity in (_T, _R):
            return BackendType.HIPBLASLT
        if granularity == _B and torch.version.hip is None:
            kw = dict(kwargs, a=a, granularity=granularity)
            if GemmFp8HipblasltBackend.can_handle(**kw):
                return BackendType.HIPBLASLT
        return BackendType.TRITON

    @classmethod
    def make_key(cls, a, b, granularity, out_dtype, sa_group, sb_group, **kwargs):
        return (a.shape[0], b.shape[0], a.shape[1], a.dtype, b.dtype, out_dtype, granularity,
                sa_group, sb_group, a.stride(1) == 1, b.stride(1) == 1, a.device.type,
                a.device.index)  # fmt: skip

    @classmethod
    def describe(cls, a, b, granularity, out_dtype, **kwargs) -> str:
        return (f"M={a.shape[0]} N={b.shape[0]} K={a.shape[1]} a:{a.dtype} b:{b.dtype} "
                f"out:{out_dtype} granularity={ScalingGranularity(granularity).name}")  # fmt: skip


def _blockwise_scales_for_scaled_mm(sa, sb, sa_group, sb_group):
    """Our block scales in the layouts ``torch._scaled_mm(a, b.t(), scale_a, scale_b)`` accepts.

    torch source (aten/src/ATen/native/cuda/Blas.cpp; ScaledBlas.cpp in newer trees):
    ``get_joint_scaling`` tries the pairs (BlockWise128x128, BlockWise1x128),
    (BlockWise1x128, BlockWise128x128), (BlockWise1x128, BlockWise1x128) and accepts one when
    ``is_desired_scaling(a, scale_a, lhs) && is_desired_scaling(b.t(), scale_b.t(), rhs)``,
    else raises "Invalid scaling configuration". For an operand ``t [R, K]``:
    * ``is_blockwise_1x128_scaling``: fp32, 2-D, ``check_size_stride(scale, 0, R, 1)`` and
      ``check_size_stride(scale, 1, ceil(K/128), R)``: shape ``(R, K/128)``, strides ``(1, R)``
      ("outer-dim-major", i.e. column-major);
    * ``is_blockwise_128x128_scaling``: fp32, 2-D, ``check_size_stride(scale, 0, ceil(R/128), L)``
      and ``check_size_stride(scale, 1, ceil(K/128), 1)``: row-major ``(R/128, K/128)`` with
      row stride ``L = ceil(K/128)`` (older trees) or ``round_up(ceil(K/128), 4)`` (newer:
      "16-byte aligned strides"); the two agree when ``K % 512 == 0``, which can_handle asks;
    * ``check_size_stride`` skips the stride test for dims of size <= 1.
    ``_scaled_mm_out_cuda`` further needs ``transa == 't' && transb == 'n'`` (a row-major,
    b column-major: our K-contiguous NT operands), and ``at::cuda::blas::scaled_gemm`` maps the
    modes to CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / BLK128x128_32F (CUDA >= 12.9, no
    ``use_fast_accum``), which cuBLASLt implements on sm_90 only.
    ``b`` here is our ``[N, K]`` operand, i.e. the ``b.t()`` of that check, so ``scale_b.t()``
    must have ``sb``'s layout above: ``scale_b`` is that tensor transposed (a view, no copy
    when our quantizer already wrote it so)."""

    def outer_major(s):  # (R, k) with strides (1, R)
        ok = s.stride(0) == 1 or s.shape[0] <= 1
        ok = ok and (s.stride(1) == s.shape[0] or s.shape[1] <= 1)
        return s if ok else s.t().contiguous().t()

    def row_major(s):  # (R/128, k) with strides (k, 1)
        ok = s.stride(1) == 1 or s.shape[1] <= 1
        ok = ok and (s.stride(0) == s.shape[1] or s.shape[0] <= 1)
        return s if ok else s.contiguous()

    scale_a = outer_major(sa) if sa_group == 1 else row_major(sa)
    scale_b = outer_major(sb) if sb_group == 1 else row_major(sb)
    return scale_a, scale_b.t()


@functools.cache
def _blockwise_probe(device_index: int, sb_group: int = 128) -> tuple[bool, str]:
    """Run one small blockwise torch._scaled_mm (a in 1x128 blocks, b in ``sb_group`` x 128)
    and compare it with the reference; each scale pairing is probed on its own."""
    pair = f"(1x128, {sb_group}x128)"
    ok, reason = check_scaled_mm_blockwise_support()
    if not ok:
        return ok, reason
    from primus_turbo.pytorch.core.low_precision import ScalingRecipe
    from primus_turbo.pytorch.ops.quantization import quantize_fp8

    try:
        dev = torch.device("cuda", device_index)
        x = torch.randn(256, 512, device=dev, dtype=torch.bfloat16)  # K = 512: K/128 % 4 == 0
        w = torch.randn(384, 512, device=dev, dtype=torch.bfloat16)
        g = ScalingGranularity.BLOCKWISE
        qa, sa = quantize_fp8(x, torch.float8_e4m3fn, g, block_size=128, axis=-1)
        if sb_group == 128:
            qb, sb = quantize_fp8(w, torch.float8_e4m3fn, g, block_size=128,
                                  scaling_recipe=ScalingRecipe(use_2d_block=True))  # fmt: skip
        else:
            qb, sb = quantize_fp8(w, torch.float8_e4m3fn, g, block_size=128, axis=-1)
        scale_a, scale_b = _blockwise_scales_for_scaled_mm(sa, sb, 1, sb_group)
        out = torch._scaled_mm(qa, qb.t(), scale_a, scale_b, out_dtype=torch.bfloat16).float()
        ref = x.float() @ w.float().t()
        err = float((out - ref).norm() / ref.norm())
        if err > 0.1:
            return False, f"blockwise {pair} torch._scaled_mm gave relative error {err:.3f}"
        return True, ""
    except Exception as e:  # noqa: BLE001 - any failure means "unsupported here"
        msg = " ".join(str(e).split())  # torch ends the message with the sizes/strides it got
        msg = msg if len(msg) <= 400 else f"{msg[:100]} ... {msg[-300:]}"
        return False, f"blockwise {pair} torch._scaled_mm failed: {type(e).__name__}: {msg}"


@GemmFp8Dispatcher.register
class GemmFp8HipblasltBackend(KernelBackend):
    """Vendor BLAS-Lt through ``torch._scaled_mm`` (cuBLASLt / hipBLASLt)."""

    backend_type = BackendType.HIPBLASLT

    @staticmethod
    def can_handle(a, b, sa, sb, granularity, sa_group, sb_group, out_dtype, **kw) -> Verdict:
        if a.device.type != "cuda":
            return no(f"needs a GPU tensor, got device {a.device}")
        if a.dtype in _E5M2 and b.dtype in _E5M2:
            return no("e5m2 x e5m2 is not supported by torch._scaled_mm")
        if granularity == _MX:
            return no("MX scaling is not supported through torch._scaled_mm here")
        m, k = a.shape
        n = b.shape[0]
        if m % 16 or k % 16 or n % 16 or a.stride(1) != 1 or b.stride(1) != 1:
            return no(f"needs M, N, K multiples of 16, K-contiguous operands (M={m} N={n} K={k})")
        if granularity == _R and out_dtype != torch.bfloat16:
            return no(f"rowwise torch._scaled_mm needs bf16 output, got {out_dtype}")
        if granularity == _B:
            if sa_group != 1:
                return no("blockwise torch._scaled_mm is used with 1x128 scales on a only "
                          "(the ops layer passes 128x128-scaled operands as b)")  # fmt: skip
            if k % 128:
                return no(f"blockwise torch._scaled_mm needs K % 128 == 0, got K={k}")
            if out_dtype != torch.bfloat16:
                return no(f"blockwise torch._scaled_mm is used for bf16 output only (what the "
                          f"probe checks), got {out_dtype}")  # fmt: skip
            if sb_group == 128 and k % 512:
                return no(f"128x128 scales through torch._scaled_mm need K % 512 == 0, got K={k}")
            if sb_group not in (1, 128):
                return no(f"blockwise b scales must be 1x128 or 128x128, got group {sb_group}")
            ok, reason = _blockwise_probe(a.device.index or 0, sb_group)
            if not ok:
                return no(reason)
        elif granularity not in (_T, _R):
            return no(f"granularity {ScalingGranularity(granularity).name} not supported")
        return YES

    @staticmethod
    def execute(a, b, sa, sb, granularity, sa_group, sb_group, out_dtype, **kw) -> torch.Tensor:
        if granularity == _R:
            sa, sb = sa.reshape(-1, 1).contiguous(), sb.reshape(1, -1).contiguous()
        elif granularity == _B:
            sa, sb = _blockwise_scales_for_scaled_mm(sa, sb, sa_group, sb_group)
        return torch._scaled_mm(a, b.t(), sa, sb, out_dtype=out_dtype)


@GemmFp8Dispatcher.register
class GemmFp8TritonBackend(KernelBackend):
    """Our persistent scaled fp8 GEMM (epilogue or per-K-block scaling)."""

    backend_type = BackendType.TRITON

    @staticmethod
    def can_handle(a, b, granularity, **kw) -> Verdict:
        if a.device.type != "cuda" and not triton_interpret():
            return no(f"needs a GPU tensor (or TRITON_INTERPRET=1 on CPU), got device {a.device}")
        if granularity == _MX:
            if a.device.type != "cuda":
                return no("tl.dot_scaled is not available in the Triton interpreter")
            ok, reason = check_mxfp8_support()
            if not ok:
                return no(reason)
            if a.dtype not in MX_OK or b.dtype not in MX_OK:
                return no(f"MX operands must be OCP fp8 or packed fp4, got {a.dtype}/{b.dtype}")
            k = a.shape[1] * (2 if a.dtype == torch.uint8 else 1)
            if k % 128 or a.stride(1) != 1 or b.stride(1) != 1:
                return no(f"MX needs K % 128 == 0 and K-contiguous operands, got K={k}")
            return YES
        if granularity not in (_T, _R, _B):
            return no(f"granularity {ScalingGranularity(granularity).name} not supported")
        for t in {a.dtype, b.dtype}:
            ok, reason = triton_fp8_support(t, a.device)
            if not ok:
                return no(reason)
        return YES

    @staticmethod
    def execute(a, b, sa, sb, granularity, sa_group, sb_group, out_dtype, **kw) -> torch.Tensor:
        from primus_turbo.triton.gemm.gemm_fp8_kernel import gemm_fp8_triton

        if granularity == _MX:
            from primus_turbo.triton.gemm.gemm_mx_kernel import gemm_mx_triton

            k = a.shape[1] * (2 if a.dtype == torch.uint8 else 1)
            return gemm_mx_triton(a, b, sa, sb, out_dtype, k)

        mode = {_T: 0, _R: 1, _B: 2}[granularity]
        return gemm_fp8_triton(a, b, sa, sb, mode, out_dtype, sa_group, sb_group)


def dequant_operand(q, s, granularity, group) -> torch.Tensor:
    """fp32 values of a quantized NT operand ``[R, K]``."""
    if granularity == _MX:
        from primus_turbo.pytorch.reference import quantization as ref

        if q.dtype == torch.uint8:
            return ref.dequantize_mxfp4_ref(q, s, torch.float32)
        return ref.dequantize_mx_ref(q, s, torch.float32)
    x = q.float()
    if granularity in (_T, _R):
        return x * s.float().reshape(-1, 1) if s.dim() else x * s.float()
    r, k = q.shape
    full = s.float().repeat_interleave(group, 0).repeat_interleave(128, 1)
    return x * full[:r, :k]


@GemmFp8Dispatcher.register
class GemmFp8TorchBackend(KernelBackend):
    """Reference: dequantize, fp32 matmul."""

    backend_type = BackendType.TORCH
    autotune = False

    @staticmethod
    def can_handle(**kw) -> Verdict:
        return YES

    @staticmethod
    def execute(a, b, sa, sb, granularity, sa_group, sb_group, out_dtype, **kw) -> torch.Tensor:
        x = dequant_operand(a, sa, granularity, sa_group)
        y = dequant_operand(b, sb, granularity, sb_group)
        return (x @ y.t()).to(out_dtype)


@torch.library.custom_op("primus_turbo::gemm_fp8_impl", mutates_args=())
def _gemm_fp8_op(
    a: torch.Tensor,
    b: torch.Tensor,
    sa: torch.Tensor,
    sb: torch.Tensor,
    granularity: int,
    sa_group: int,
    sb_group: int,
    out_dtype: torch.dtype,
    backend: int,
) -> torch.Tensor:
    return GemmFp8Dispatcher.execute(
        BackendType(backend), a=a, b=b, sa=sa, sb=sb, granularity=granularity,
        sa_group=sa_group, sb_group=sb_group, out_dtype=out_dtype,
    )  # fmt: skip


@_gemm_fp8_op.register_fake
def _gemm_fp8_fake(a, b, sa, sb, granularity, sa_group, sb_group, out_dtype, backend):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


def gemm_fp8_impl(a, b, sa, sb, granularity: int, sa_group: int, sb_group: int, out_dtype,
                  user=None) -> torch.Tensor:  # fmt: skip
    """Resolve (user choice > settings > default) and run one scaled NT GEMM."""
    kw = dict(a=a, b=b, sa=sa, sb=sb, granularity=granularity, sa_group=sa_group,
              sb_group=sb_group, out_dtype=out_dtype)  # fmt: skip
    backend = GemmFp8Dispatcher.resolve(user, **kw)
    if torch.compiler.is_compiling():
        return _gemm_fp8_op(a, b, sa, sb, granularity, sa_group, sb_group, out_dtype,
                            backend.value)  # fmt: skip
    return GemmFp8Dispatcher.execute(backend, **kw)
