"""PRIMUS_TURBO_QUANT_CUDA=1: the CUDA cast-transpose (csrc/kernels/quant_dual.cu, through
primus_turbo/pytorch/kernels/quantization/quant_cuda.py) for the 1x128 and MX dual recipes of
bf16 inputs gives the same bits and scales as the Triton kernels (the default), on the model
shapes, odd shapes (edge tiles, masked rows/columns, unaligned qt rows), inf/-inf/NaN values,
all-NaN / all-inf / all-zero rows and columns, e4m3 and e5m2, zero-size inputs; inputs it does
not take fall back to Triton; the knob is validated; CPU tensors never take it."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core.low_precision import ScalingGranularity
from primus_turbo.pytorch.kernels.quantization import quant_cuda
from primus_turbo.pytorch.ops.quantization import quantize_fp8_with_trans
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import bf16_specials, same_bits

pytestmark = pytest.mark.quantization

G = ScalingGranularity
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
_ENV = ("PRIMUS_TURBO_QUANT_CUDA", "PRIMUS_TURBO_QUANT_CUDA_OCC")

_NVIDIA = HAS_GPU and torch.version.hip is None
_KERNEL = _NVIDIA and quant_cuda.cuda_kernel_available()
_SKIP_GPU = pytest.mark.skipif(
    not _KERNEL,
    reason="needs an NVIDIA GPU and a CUDA build of primus_turbo.pytorch._C with quant_dual_fp8",
)


def _quant(recipe, x, dtype):
    if recipe == "block1x128":
        return quantize_fp8_with_trans(x, dtype, G.BLOCKWISE, block_size=128)
    return quantize_fp8_with_trans(x, dtype, G.MX_BLOCKWISE, block_size=32)


def _input(m, n, special, device):
    x = bf16_specials(m, n, special, device) if m >= 10 else torch.randn(m, n, device=device)
    x = x.to(torch.bfloat16)
    if special and m >= 10 and n >= 10:
        x[5, :] = float("nan")  # an all-NaN row, an all-inf column, an all -inf row
        x[:, 7] = float("inf")
        x[min(m - 1, 33), :] = float("-inf")
    return x


def _compare(monkeypatch, recipe, x, dtype, occ=None):
    for var in _ENV:
        monkeypatch.delenv(var, raising=False)
    ref = _quant(recipe, x, dtype)  # Triton (the default)
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA", "1")
    if occ is not None:
        monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA_OCC", occ)
    out = _quant(recipe, x, dtype)
    assert len(out) == len(ref) == 4
    for name, a, b in zip(("q", "scale", "q_t", "scale_t"), out, ref, strict=True):
        assert same_bits(a, b), f"{recipe} {tuple(x.shape)} {dtype}: {name} differs"


# model shapes, then odd ones: edge tiles along both dims, M % 16 != 0 (byte-wise qt rows)
SHAPES_1X128 = [(8192, 4096), (6144, 4096), (4168, 2008), (300, 1000), (131, 96), (40, 24)]
SHAPES_MX = [(8192, 4096), (6144, 4096), (4192, 2016), (320, 992), (96, 64), (32, 32)]


@_SKIP_GPU
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize(
    "recipe,shape",
    [("block1x128", s) for s in SHAPES_1X128] + [("mx_dual", s) for s in SHAPES_MX],
    ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v)),
)
def test_cuda_dual_bitwise(monkeypatch, recipe, shape, dtype):
    m, n = shape
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA", "1")
    x0 = _input(m, n, False, "cuda")
    assert quant_cuda.cuda_dual_on(x0, dtype, recipe == "mx_dual")  # not a silent fallback
    for special in (False, True):
        _compare(monkeypatch, recipe, _input(m, n, special, "cuda"), dtype)


@_SKIP_GPU
@pytest.mark.parametrize("occ", ["3", "4", "pipe"])
@pytest.mark.parametrize("recipe", ["block1x128", "mx_dual"])
def test_cuda_dual_occ(monkeypatch, recipe, occ):
    """The 80- and 64-register builds (PRIMUS_TURBO_QUANT_CUDA_OCC=3/4) and the persistent
    pipelined kernel (pipe; several tiles per block here) give the same bits."""
    for shape in ((8192, 4096), (4096, 2048), (4160, 2016), (320, 992)):
        for dtype in (E4M3, E5M2):
            _compare(monkeypatch, recipe, _input(*shape, True, "cuda"), dtype, occ=occ)


@_SKIP_GPU
@pytest.mark.parametrize("recipe", ["block1x128", "mx_dual"])
@pytest.mark.parametrize("shape", [(0, 256), (128, 0), (0, 0)])
def test_cuda_dual_zero_size(monkeypatch, recipe, shape):
    _compare(monkeypatch, recipe, torch.empty(shape, dtype=torch.bfloat16, device="cuda"), E4M3)


@_SKIP_GPU
@pytest.mark.parametrize(
    "recipe,shape,dt",
    [
        ("block1x128", (64, 100), torch.bfloat16),  # N % 8 != 0
        ("block1x128", (64, 128), torch.float16),  # not bf16
        ("mx_dual", (64, 96), torch.float16),  # not bf16 (MX: the op needs M, N % 32 == 0)
        ("mx_dual", (96, 64), torch.float32),
    ],  # fmt: skip
)
def test_cuda_dual_fallback(monkeypatch, recipe, shape, dt):
    """Inputs the kernel does not take run the Triton kernels (same results as without it)."""
    x = torch.randn(shape, device="cuda").to(dt)
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA", "1")
    assert not quant_cuda.cuda_dual_on(x, E4M3, recipe == "mx_dual")
    _compare(monkeypatch, recipe, x, E4M3)


def test_cuda_knob_cpu_fallback(monkeypatch):
    """CPU tensors never take the CUDA kernel: the knob on gives the Triton/interpreter result."""
    x = _input(64, 128, True, "cpu")
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA", "1")
    assert not quant_cuda.cuda_dual_on(x, E4M3, False)
    assert not quant_cuda.cuda_dual_on(x, E4M3, True)
    _compare(monkeypatch, "block1x128", x, E4M3)


@pytest.mark.parametrize("var,value", [("PRIMUS_TURBO_QUANT_CUDA", "2"),
                                       ("PRIMUS_TURBO_QUANT_CUDA_OCC", "5")])  # fmt: skip
def test_cuda_knob_validation(monkeypatch, var, value):
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA", "1")
    monkeypatch.setenv(var, value)
    x = torch.zeros(32, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=var):
        quant_cuda.cuda_dual_on(x, E4M3, False)
        quant_cuda._occ()


def test_cuda_op_meta():
    """The op's Meta implementation (every build of _C that has it): the Triton layouts."""
    from primus_turbo.build_info import native_status

    ok, _ = native_status()
    if not ok or not hasattr(torch.ops.primus_turbo_cpp, "quant_dual_fp8"):
        pytest.skip("primus_turbo.pytorch._C without quant_dual_fp8 (rebuild the extension)")
    x = torch.empty(300, 1000, dtype=torch.bfloat16, device="meta")
    q, s, qt, st = torch.ops.primus_turbo_cpp.quant_dual_fp8(x, E4M3, False, 448.0, 8, 2)
    assert q.shape == (300, 1000) and qt.shape == (1000, 300) and q.dtype == E4M3
    assert s.shape == (300, 8) and s.stride() == (1, 300) and s.dtype == torch.float32
    assert st.shape == (1000, 3) and st.stride() == (1, 1000)
    x = torch.empty(320, 992, dtype=torch.bfloat16, device="meta")
    q, s, qt, st = torch.ops.primus_turbo_cpp.quant_dual_fp8(x, E5M2, True, 57344.0, 15, 2)
    assert s.shape == (320, 31) and st.shape == (992, 10) and s.dtype == torch.uint8
    with pytest.raises(RuntimeError, match="multiple of 8"):
        y = torch.empty(32, 990, dtype=torch.bfloat16, device="meta")
        torch.ops.primus_turbo_cpp.quant_dual_fp8(y, E4M3, False, 448.0, 8, 2)
