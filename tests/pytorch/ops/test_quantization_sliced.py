"""PRIMUS_TURBO_QUANT_SLICED (quant_dual.py): the sliced 1x128-dual / MX kernels give the same
bits and scales as the default kernels, one tile per program and persistent, even and masked
(odd) shapes, with inf/-inf/NaN and all-zero rows/columns; zero-size inputs; env validation."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core.low_precision import ScalingGranularity
from primus_turbo.pytorch.ops.quantization import quantize_fp8, quantize_fp8_with_trans
from tests.conftest import HAS_GPU

pytestmark = pytest.mark.quantization

DEV = "cuda" if HAS_GPU else "cpu"
G = ScalingGranularity
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
_ENV = ("PRIMUS_TURBO_QUANT_SLICED", "PRIMUS_TURBO_QUANT_SLICED_MX",
        "PRIMUS_TURBO_QUANT_SLICED_BN", "PRIMUS_TURBO_QUANT_SLICED_PERSIST")  # fmt: skip


def _same_bits(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
    if a.dtype in (torch.float32, torch.uint8):
        return torch.equal(a, b)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _x(m, n, special):
    x = (torch.randn(m, n, device=DEV) * 3.0).to(torch.bfloat16)
    if special:
        x[1, 3], x[2, 4], x[3, 5] = float("inf"), float("-inf"), float("nan")
        x[9, :] = 0.0
        x[:, 40] = 0.0
        x[20, 50] = 1e38
    return x


def _quant(recipe, x, dtype):
    if recipe == "block1x128":
        return quantize_fp8_with_trans(x, dtype, G.BLOCKWISE, block_size=128)
    if recipe == "mx_dual":
        return quantize_fp8_with_trans(x, dtype, G.MX_BLOCKWISE, block_size=32)
    return quantize_fp8(x, dtype, G.MX_BLOCKWISE, block_size=32)


# (recipe, SLICED_BN, SLICED_PERSIST); the CPU tier keeps the interpreter cases few
CASES = [("block1x128", None, "0"), ("block1x128", None, "2"), ("mx_dual", "64", "0"),
         ("mx_dual", "128", "3"), ("mx_rows", "64", "1")]  # fmt: skip
if HAS_GPU:  # the default tiles, one tile per program and persistent
    CASES += [("mx_dual", None, "0"), ("mx_dual", None, "4"), ("mx_rows", None, "0"),
              ("block1x128", None, "1")]  # fmt: skip


@pytest.mark.parametrize("recipe,bn,persist", CASES, ids=["-".join(map(str, c)) for c in CASES])
@pytest.mark.parametrize("shape", ["even", "odd"])
def test_sliced_kernel_bitwise(monkeypatch, recipe, bn, persist, shape):
    if not HAS_GPU and shape == "even" and persist != "0":
        pytest.skip("CPU time budget: the persistent cases run the masked (odd) shapes only")
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_IMPL", "v3")
    for var in _ENV:
        monkeypatch.delenv(var, raising=False)
    if HAS_GPU:
        m, n = (4096, 2048) if shape == "even" else (4096 + 72, 2048 + 40)
    else:
        m, n = (128, 256) if shape == "even" else (136, 264)
    if recipe != "block1x128":  # MX: multiples of 32 (odd: edge tiles along N)
        m, n = (m, n) if shape == "even" else ((m // 32 + 1) * 32, (n // 32 - 2) * 32)
    for special in (True, False) if HAS_GPU else (True,):  # CPU time budget
        x = _x(m, n, special)
        e5m2 = HAS_GPU and special and bn is None and persist == "0"  # compile time
        for dtype in (E4M3, E5M2) if e5m2 else (E4M3,):
            for var in _ENV:
                monkeypatch.delenv(var, raising=False)
            ref = _quant(recipe, x, dtype)
            monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED", "1")
            monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED_MX", "1")
            monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED_PERSIST", persist)
            if bn:
                monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED_BN", bn)
            out = _quant(recipe, x, dtype)
            assert len(out) == len(ref)
            for a, b in zip(out, ref, strict=True):
                assert _same_bits(a, b)


@pytest.mark.parametrize("recipe", ["block1x128", "mx_dual", "mx_rows"])
@pytest.mark.parametrize("shape", [(0, 256), (128, 0)])
def test_sliced_kernel_zero_size(monkeypatch, recipe, shape):
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED", "1")
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED_MX", "1")
    x = torch.empty(shape, device=DEV, dtype=torch.bfloat16)
    out = _quant(recipe, x, E4M3)
    assert out[0].shape == x.shape
    if len(out) == 4:
        assert out[2].shape == (shape[1], shape[0])


def test_sliced_kernel_is_routed(monkeypatch):
    from primus_turbo.triton.quantization import quant_launch as ql

    called = []
    monkeypatch.setattr(ql, "launch_sliced", lambda *a, **k: called.append(a[5]))
    x = _x(64, 256, False)
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED", "0")
    quantize_fp8_with_trans(x, E4M3, G.MX_BLOCKWISE, block_size=32)
    assert not called
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED", "1")
    quantize_fp8_with_trans(x, E4M3, G.MX_BLOCKWISE, block_size=32)
    quantize_fp8(x, E4M3, G.MX_BLOCKWISE, block_size=32)  # SLICED_MX unset: not routed
    assert called == ["mx_dual"]


@pytest.mark.parametrize("var,value", [("PRIMUS_TURBO_QUANT_SLICED", "2"),
                                       ("PRIMUS_TURBO_QUANT_SLICED_BN", "96"),
                                       ("PRIMUS_TURBO_QUANT_SLICED_PERSIST", "-1")])  # fmt: skip
def test_sliced_env_validated(monkeypatch, var, value):
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED", "1")
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=var):
        _quant("mx_dual", _x(64, 256, False), E4M3)
