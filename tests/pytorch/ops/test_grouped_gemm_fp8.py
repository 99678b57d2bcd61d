"""FP8 grouped GEMM: forward, dgrad and wgrad SNR vs the fp32 reference (TENSORWISE, ROWWISE)."""

from __future__ import annotations

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager, PrecisionType
from primus_turbo.pytorch.core.low_precision import (
    Float8QuantConfig,
    Format,
    ScalingGranularity,
)
from primus_turbo.pytorch.reference import grouped_gemm_ref
from tests.pytorch.test_utils import rand, snr_db

pytestmark = pytest.mark.grouped_gemm

GRANS = [ScalingGranularity.TENSORWISE, ScalingGranularity.ROWWISE]
SNR_MIN = {Format.E4M3: 25.0, Format.HYBRID: 20.0}


def _check(lens, k, n, trans_b, gran, fmt, device):
    gl = torch.tensor(lens, dtype=torch.int64, device=device)
    m, g = sum(lens), len(lens)
    a = rand(m, k, dtype=torch.bfloat16, device=device, requires_grad=True)
    shape = (g, n, k) if trans_b else (g, k, n)
    b = rand(*shape, dtype=torch.bfloat16, device=device, requires_grad=True)
    config = Float8QuantConfig(format=fmt, granularity=gran)
    out = turbo.ops.grouped_gemm_fp8(a, b, gl, trans_b=trans_b, config=config)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    grad = rand(m, n, dtype=torch.bfloat16, device=device)
    out.backward(grad)
    a_ref = a.detach().float().requires_grad_()
    b_ref = b.detach().float().requires_grad_()
    ref = grouped_gemm_ref(a_ref, b_ref, gl.cpu(), trans_b, torch.float32)
    ref.backward(grad.float())
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    for name, got, want in (("out", out, ref), ("da", a.grad, a_ref.grad)):
        assert snr_db(want.detach().cpu(), got.detach().float().cpu()) > SNR_MIN[fmt], name
    # empty experts: exact zero weight gradient, others by SNR
    nonzero = [i for i, x in enumerate(lens) if x > 0]
    assert snr_db(b_ref.grad[nonzero].cpu(), b.grad[nonzero].float().cpu()) > SNR_MIN[fmt]
    for i, x in enumerate(lens):
        if x == 0:
            assert not b.grad[i].any()


@pytest.mark.parametrize("backend", [BackendType.TORCH, BackendType.TRITON], ids=lambda b: b.name)
@pytest.mark.parametrize("gran", GRANS, ids=lambda g: g.name)
@pytest.mark.parametrize("trans_b", [True, False], ids=["NT", "NN"])
def test_grouped_gemm_fp8(trans_b, gran, backend, device):
    GlobalBackendManager.set_grouped_gemm_backend(backend, precision=PrecisionType.FP8)
    _check([5, 0, 20, 9], 32, 24, trans_b, gran, Format.E4M3, device)


def test_grouped_gemm_fp8_hybrid(device):
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON, precision=PrecisionType.FP8)
    _check([7, 13], 48, 16, True, ScalingGranularity.ROWWISE, Format.HYBRID, device)


def _set_modes(monkeypatch, wgrad, dgrad):
    import importlib

    mod = importlib.import_module("primus_turbo.pytorch.ops.grouped_gemm_fp8")
    monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_FP8_WGRAD", wgrad)
    monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_FP8_DGRAD", dgrad)
    mod._mode.cache_clear()
    return mod


@pytest.mark.parametrize("backend", [BackendType.TORCH, BackendType.TRITON], ids=lambda b: b.name)
@pytest.mark.parametrize("wgrad,dgrad", [("fp8", "fp8"), ("hp", "hp")], ids=["fp8bw", "hpbw"])
def test_grouped_gemm_fp8_backward_modes(wgrad, dgrad, backend, monkeypatch, device):
    """Both backward precisions (env ``PRIMUS_TURBO_GROUPED_GEMM_FP8_{WGRAD,DGRAD}``)."""
    mod = _set_modes(monkeypatch, wgrad, dgrad)
    try:
        GlobalBackendManager.set_grouped_gemm_backend(backend, precision=PrecisionType.FP8)
        _check([5, 0, 11], 32, 16, True, ScalingGranularity.ROWWISE, Format.E4M3, device)
    finally:
        mod._mode.cache_clear()


def test_grouped_gemm_fp8_bad_mode(monkeypatch, device):
    mod = _set_modes(monkeypatch, "int4", "fp8")
    try:
        with pytest.raises(ValueError, match="PRIMUS_TURBO_GROUPED_GEMM_FP8_WGRAD"):
            mod._mode("WGRAD", "hp")
    finally:
        mod._mode.cache_clear()


def _skip_no_vendor(device):
    from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_fp8_impl import (
        GroupedGemmFp8Dispatcher,
    )

    a = torch.empty(1, 16, dtype=torch.bfloat16, device=device)
    impl = GroupedGemmFp8Dispatcher.backend_class(BackendType.HIPBLASLT)
    verdict = impl.can_handle(a=a, b=a[None], out_dtype=torch.bfloat16)
    if not verdict:
        pytest.skip(f"HIPBLASLT (torch._scaled_grouped_mm) cannot run here: {verdict.reason}")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", [None, BackendType.HIPBLASLT], ids=["default", "HIPBLASLT"])
@pytest.mark.parametrize("gran", GRANS, ids=lambda g: g.name)
@pytest.mark.parametrize("lens,k,n", [([512, 0, 1000, 3, 2048, 129], 1024, 768)], ids=str)
@pytest.mark.parametrize("bw", ["hp-wgrad", "fp8-wgrad", "hp-dgrad"])
def test_grouped_gemm_fp8_gpu_shapes(lens, k, n, gran, backend, bw, monkeypatch, device):
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel

    # the heuristic's tiles only: timing every candidate compiles ~24 fp8 kernels (minutes)
    monkeypatch.setattr(grouped_gemm_kernel, "_tune_min_work", lambda: 1 << 62)
    modes = {"hp-wgrad": ("hp", "fp8"), "fp8-wgrad": ("fp8", "fp8"), "hp-dgrad": ("hp", "hp")}
    mod = _set_modes(monkeypatch, *modes[bw])
    request_clear = mod._mode.cache_clear
    if backend is not None:
        _skip_no_vendor(device)
        GlobalBackendManager.set_grouped_gemm_backend(backend, precision=PrecisionType.FP8)
    try:
        _check(lens, k, n, True, gran, Format.E4M3, device)
        _check(lens, k, n, False, gran, Format.E4M3, device)
    finally:
        request_clear()


def test_grouped_gemm_fp8_blockwise_not_implemented(device):
    a = rand(8, 16, dtype=torch.bfloat16, device=device)
    b = rand(2, 8, 16, dtype=torch.bfloat16, device=device)
    gl = torch.tensor([3, 5], device=device)
    cfg = Float8QuantConfig(granularity=ScalingGranularity.BLOCKWISE, block_size=128)
    with pytest.raises(
        NotImplementedError, match=r"grouped_gemm_fp8: argument 'config.granularity'"
    ):
        turbo.ops.grouped_gemm_fp8(a, b, gl, config=cfg)


def test_grouped_gemm_fp8_bad_sizes():
    a = rand(8, 16, dtype=torch.bfloat16, device="cpu")
    b = rand(2, 8, 16, dtype=torch.bfloat16, device="cpu")
    match = r"grouped_gemm_fp8: argument 'group_lens' expected sizes summing to a.shape\[0\] = 8"
    with pytest.raises(ValueError, match=match):
        turbo.ops.grouped_gemm_fp8(a, b, torch.tensor([3, 4]))


def test_grouped_gemm_fp8_group_offs_on_another_device():
    a = rand(8, 16, dtype=torch.bfloat16, device="cpu")
    b = rand(2, 8, 16, dtype=torch.bfloat16, device="cpu")
    offs = torch.zeros(3, dtype=torch.int64, device="meta")
    match = "grouped_gemm_fp8: argument 'group_offs' expected a tensor on cpu, got meta"
    with pytest.raises(ValueError, match=match):
        turbo.ops.grouped_gemm_fp8(a, b, torch.tensor([3, 5]), group_offs=offs)
