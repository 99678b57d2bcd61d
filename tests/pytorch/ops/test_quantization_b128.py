"""PRIMUS_TURBO_QUANT_B128 (quant_b128.py, the 1x128 dual recipe on the tensorwise dual cast's
plan: bf16 tile transposed, column scales read back from their slots, integer amax keys,
persistent programs): the same bits and scales as the v3 tile kernel, even and masked (odd)
shapes, inf/-inf/NaN, all-NaN / all-inf / all-zero rows and columns, subnormals, e5m2, odd M,
zero-size inputs, env validation."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core.low_precision import ScalingGranularity
from primus_turbo.pytorch.ops.quantization import quantize_fp8_with_trans
from primus_turbo.triton.quantization import quant_b128 as b128
from primus_turbo.triton.quantization.quant_b128 import B128_VARIANTS
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import bf16_specials, same_bits

pytestmark = pytest.mark.quantization

DEV = "cuda" if HAS_GPU else "cpu"
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
VARIANTS = sorted(B128_VARIANTS)


def _quant(monkeypatch, x, dtype, variant):
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_IMPL", "v3")
    if variant is None:
        monkeypatch.delenv("PRIMUS_TURBO_QUANT_B128", raising=False)
    else:
        monkeypatch.setenv("PRIMUS_TURBO_QUANT_B128", variant)
    return quantize_fp8_with_trans(x, dtype, ScalingGranularity.BLOCKWISE, block_size=128)


def _check(monkeypatch, x, dtype, variant):
    ref = _quant(monkeypatch, x, dtype, None)
    got = _quant(monkeypatch, x, dtype, variant)
    assert len(ref) == len(got) == 4
    for i, (a, b) in enumerate(zip(ref, got, strict=True)):
        assert same_bits(a, b), f"output {i} differs from v3 ({variant}, {tuple(x.shape)})"


def _extremes(m, n):
    """bf16_specials plus an all-NaN row, an all-inf column, a row of +-inf and NaN only,
    subnormals, -0.0 and a row at the bf16 maximum (m >= 16, n >= 8)."""
    x = bf16_specials(m, n, True, DEV)
    x[11, :] = float("nan")
    x[:, 5] = float("inf")
    x[12, :] = float("-inf")
    x[12, ::3] = float("nan")
    x[13, :] = 1e-40  # bf16 subnormals
    x[13, ::2] = -0.0
    x[14, :] = torch.finfo(torch.bfloat16).max
    x[15, 1::2] = -torch.finfo(torch.bfloat16).tiny
    return x


# CPU (interpreter): tiny shapes, one with masked tiles; GPU: the model shapes and odd ones
if HAS_GPU:
    SHAPES = [(8192, 4096), (6144, 4096), (4096 + 72, 2048 - 40), (300, 1000)]
    VARIANTS_RUN = VARIANTS
else:
    SHAPES = [(256, 384), (200, 136)]
    VARIANTS_RUN = ["x8", "p16"]  # the interpreter ignores warps / caps / eviction


@pytest.mark.parametrize("variant", VARIANTS_RUN)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{n}" for m, n in SHAPES])
def test_b128_matches_v3_bitwise(monkeypatch, variant, shape):
    m, n = shape
    for special in (True, False) if HAS_GPU else (True,):  # CPU time budget
        x = _extremes(m, n) if special else bf16_specials(m, n, False, DEV)
        # e5m2 on the GPU's small masked shape only (cold compiles: the lead's line budget)
        dtypes = (E4M3, E5M2) if HAS_GPU and special and m * n < 10**6 else (E4M3,)
        for dtype in dtypes:
            _check(monkeypatch, x, dtype, variant)


def test_b128_e5m2_masked(monkeypatch):
    """e5m2 on a shape with masked tiles in both directions, one tile per program and
    persistent (more tiles than programs on the GPU: 2 programs per SM)."""
    for variant in ("x8", "p16", "p83"):  # p83: the masked plan (p8)
        _check(monkeypatch, _extremes(72, 136), E5M2, variant)


def test_b128_odd_rows(monkeypatch):
    """M odd and not a multiple of 128 (partial tiles along M; q^T rows of odd length)."""
    _check(monkeypatch, bf16_specials(131, 100, True, DEV), E4M3, "p16")


def test_b128_is_taken(monkeypatch):
    """The variant really launches quant_b128_kernel."""
    taken = []
    real = b128.launch_b128

    def spy(*args, **kwargs):
        taken.append(real(*args, **kwargs))
        return taken[-1]

    monkeypatch.setattr(b128, "launch_b128", spy)
    _quant(monkeypatch, bf16_specials(64, 136, False, DEV), E4M3, "x8")
    _quant(monkeypatch, bf16_specials(66, 136, False, DEV), E4M3, "p16")
    assert taken == [True, True]


def test_b128_zero_size(monkeypatch):
    for shape in ((0, 256), (128, 0)):
        x = torch.randn(shape, device=DEV).to(torch.bfloat16)
        got = _quant(monkeypatch, x, E4M3, "p16")
        ref = _quant(monkeypatch, x, E4M3, None)
        for a, b in zip(ref, got, strict=True):
            assert a.shape == b.shape and a.stride() == b.stride()


def test_b128_env_validation(monkeypatch):
    x = bf16_specials(128, 128, False, DEV)
    with pytest.raises(ValueError, match="PRIMUS_TURBO_QUANT_B128"):
        _quant(monkeypatch, x, E4M3, "bogus")
    _check(monkeypatch, x, E4M3, "v3")  # explicit v3 == unset
