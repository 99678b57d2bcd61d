"""MXFP4 GEMM (and MXFP8 through gemm_fp8): output and both gradients vs fp64 by SNR.

CPU runs the TORCH backend (tl.dot_scaled is not in the Triton interpreter); the GPU tier also
runs TRITON where MX is supported (gfx950, sm_90+)."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core import BackendType
from primus_turbo.pytorch.core.backend import BackendChoice
from primus_turbo.pytorch.core.low_precision import (
    Float8QuantConfig,
    ScaleDtype,
    ScalingGranularity,
    check_mxfp8_support,
)
from primus_turbo.pytorch.ops.gemm_fp4 import gemm_fp4
from primus_turbo.pytorch.ops.gemm_fp8 import gemm_fp8
from primus_turbo.pytorch.reference import gemm_ref
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import snr_db

pytestmark = pytest.mark.gemm_fp8

DEV = "cuda" if HAS_GPU else "cpu"
MX_OK, MX_REASON = check_mxfp8_support()
BACKENDS = [BackendType.TORCH, BackendType.TRITON]
SHAPES = (
    [(64, 96, 128)] if not HAS_GPU else [(256, 512, 384), (2048, 2048, 2048), (4096, 1024, 512)]
)
LAYOUTS = [(False, True), (False, False), (True, False)]
MXFP8 = Float8QuantConfig(granularity=ScalingGranularity.MX_BLOCKWISE, block_size=32,
                          scale_dtype=ScaleDtype.E8M0)  # fmt: skip


def _run(op, m, n, k, ta, tb, backend, gate, **kw):
    if backend == BackendType.TRITON and not (HAS_GPU and MX_OK):
        pytest.skip(f"TRITON MX needs tl.dot_scaled on a supported GPU: {MX_REASON or 'no GPU'}")
    if backend == BackendType.TRITON and k % 128:
        pytest.skip("TRITON MX needs K % 128 == 0")
    torch.manual_seed(0)
    a = torch.randn(*((k, m) if ta else (m, k)), device=DEV).bfloat16().requires_grad_()
    b = torch.randn(*((n, k) if tb else (k, n)), device=DEV).bfloat16().requires_grad_()
    out = op(a, b, ta, tb, backend=BackendChoice(backend), **kw)
    a_ref = a.detach().double().requires_grad_()
    b_ref = b.detach().double().requires_grad_()
    ref = gemm_ref(a_ref, b_ref, ta, tb, torch.float64, acc_dtype=torch.float64)
    grad = torch.randn(m, n, device=DEV).bfloat16()
    out.backward(grad)
    ref.backward(grad.double())
    assert out.shape == (m, n) and a.grad.shape == a.shape and b.grad.shape == b.shape
    assert snr_db(ref, out) >= gate
    assert snr_db(a_ref.grad, a.grad) >= gate
    assert snr_db(b_ref.grad, b.grad) >= gate


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=["NT", "NN", "TN"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemm_fp4_snr(m, n, k, ta, tb, backend):
    if not HAS_GPU and (ta, tb) != (False, True):
        pytest.skip("CPU tier: one layout")
    _run(gemm_fp4, m, n, k, ta, tb, backend, 10)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemm_mxfp8_snr(m, n, k, backend):
    _run(gemm_fp8, m, n, k, False, True, backend, 25, config=MXFP8)


def test_mx_shapes_must_be_multiples_of_32():
    a = torch.randn(40, 64, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(32, 64, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiples of 32"):
        gemm_fp4(a, b, trans_b=True)
    with pytest.raises(ValueError, match="multiples of 32"):
        gemm_fp8(a, b, trans_b=True, config=MXFP8)
    with pytest.raises(TypeError, match="config"):
        gemm_fp4(b, b, trans_b=True, config=MXFP8)
