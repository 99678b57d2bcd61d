"""PRIMUS_TURBO_QUANT_B128 (quant_b128_pipe.py, the 1x128 dual recipe with the next tile's
load in flight): the same bits and scales as the v3 tile kernel, even and masked (odd)
shapes, inf/-inf/NaN and all-zero rows/columns, zero-size inputs, env validation."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core.low_precision import ScalingGranularity
from primus_turbo.pytorch.ops.quantization import quantize_fp8_with_trans
from primus_turbo.triton.quantization.quant_b128_pipe import B128_VARIANTS
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


# CPU (interpreter, grid = 2 programs per core: the persistent loop and the masked last
# prefetch run): tiny shapes; GPU: the model shapes and an odd one
if HAS_GPU:
    SHAPES = [(8192, 4096), (6144, 4096), (4096 + 72, 2048 - 40), (300, 1000)]
else:
    SHAPES = [(256, 384), (200, 136)]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{n}" for m, n in SHAPES])
def test_b128_matches_v3_bitwise(monkeypatch, variant, shape):
    m, n = shape
    for special in (True, False) if HAS_GPU else (True,):  # CPU time budget
        x = bf16_specials(m, n, special, DEV)
        # e5m2 on the GPU's small masked shape only (cold compiles: the lead's line budget)
        dtypes = (E4M3, E5M2) if HAS_GPU and special and m * n < 10**6 else (E4M3,)
        for dtype in dtypes:
            _check(monkeypatch, x, dtype, variant)


def test_b128_cpu_e5m2_and_short(monkeypatch):
    """e5m2 and a shape with fewer tiles than programs (prefetch masked from the start)."""
    x = bf16_specials(72, 136, True, DEV)
    _check(monkeypatch, x, E5M2, "pf16")


def test_b128_zero_size(monkeypatch):
    for shape in ((0, 256), (128, 0)):
        x = torch.randn(shape, device=DEV).to(torch.bfloat16)
        got = _quant(monkeypatch, x, E4M3, "pf16")
        ref = _quant(monkeypatch, x, E4M3, None)
        for a, b in zip(ref, got, strict=True):
            assert a.shape == b.shape and a.stride() == b.stride()


def test_b128_env_validation(monkeypatch):
    x = bf16_specials(128, 128, False, DEV)
    with pytest.raises(ValueError, match="PRIMUS_TURBO_QUANT_B128"):
        _quant(monkeypatch, x, E4M3, "bogus")
    _check(monkeypatch, x, E4M3, "v3")  # explicit v3 == unset
