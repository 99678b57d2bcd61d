"""Tensorwise FP8 through ``tw_quant_kernel`` (PRIMUS_TURBO_QUANT_TW=own): bitwise equal to the
session-4 kernels (PRIMUS_TURBO_QUANT_TW=v3) and close to the torch reference, plain and dual,
odd / tiny / zero-size shapes, inf/NaN/all-zero inputs, env validation. CPU runs the
interpreter with small tiles (many tiles per program). Also the per-config knobs of the v3 tile
kernel (PRIMUS_TURBO_QUANT_<KNOB>_<CONFIG>): precedence on CPU, bitwise-equal sweeps on GPU."""

from __future__ import annotations

import os

import pytest
import torch

from primus_turbo.pytorch.core.low_precision import triton_fp8_support
from primus_turbo.pytorch.reference import quantization as ref
from primus_turbo.triton.quantization import quant_launch
from primus_turbo.triton.quantization import quant_tw_launch as tw
from tests.conftest import HAS_GPU

pytestmark = pytest.mark.quantization

DEV = "cuda" if HAS_GPU else "cpu"
E4M3, E5M2, FNUZ = torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz
_FNUZ_OK, _FNUZ_WHY = triton_fp8_support(FNUZ, DEV)
FP8 = [E4M3, E5M2, pytest.param(FNUZ, marks=pytest.mark.skipif(not _FNUZ_OK, reason=_FNUZ_WHY))]
# interpreter: 1024-wide flat tiles and 16x32 dual tiles, so (37, 200) is 8 / 21 tiles
SMALL = {"PRIMUS_TURBO_QUANT_TW_BLOCK": "1024", "PRIMUS_TURBO_QUANT_TW_TILE": "16x32"}
SHAPES = [(37, 200), (64, 128), (1, 1), (3, 520)]
if HAS_GPU:
    SHAPES += [(1000, 1000), (4096, 2048), (8192, 4096), (6144, 4096)]


def _x(m, n, scale=3.0):
    return (torch.randn(m, n, device=DEV) * scale).to(torch.bfloat16)


def _run(monkeypatch, x, dtype, dual, mode, env=None):
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_TW", mode)
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    return quant_launch.quant_tensorwise(x, dtype, dual)


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
    if a.dtype == torch.float32:
        return torch.equal(a, b) or (torch.isnan(a).all() and torch.isnan(b).all())
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _check(monkeypatch, x, dtype, dual, mode, env=None):
    new = _run(monkeypatch, x, dtype, dual, mode, env)
    old = _run(monkeypatch, x, dtype, dual, "v3")
    assert len(new) == len(old)
    for a, b in zip(new, old, strict=True):
        assert _same(a, b)
    q_ref, s_ref = ref.quantize_tensorwise_ref(x, dtype)
    torch.testing.assert_close(new[1].cpu(), s_ref.cpu(), rtol=1e-6, atol=0)
    a, b = new[0].float().cpu(), q_ref.float().cpu()
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    a, b = a.nan_to_num(0), b.nan_to_num(0)
    assert ((a - b).abs() <= b.abs() * 0.26 + 2.0**-9).all()
    if dual:
        assert new[2].is_contiguous() and new[2].shape == (x.shape[1], x.shape[0])
        assert torch.equal(new[2].view(torch.uint8).t(), new[0].view(torch.uint8))
    return new


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("m,n", SHAPES)
def test_tw_matches_v3_bitwise(monkeypatch, dual, m, n):
    x = _x(m, n)
    x[m - 1, n - 1] = 40.0  # the amax in the last tile
    _check(monkeypatch, x, E4M3, dual, "own", SMALL if not HAS_GPU else None)


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_tw_formats(monkeypatch, dtype):
    _check(monkeypatch, _x(37, 200), dtype, True, "own", SMALL if not HAS_GPU else None)


@pytest.mark.parametrize("programs", [1, 2, 5])
def test_tw_own_programs_walk_own_tiles(monkeypatch, programs):
    """Interpreter grids of 1, 2 and 5 programs (2 divides the 8 tiles: the EVEN path)."""
    if HAS_GPU:
        pytest.skip("interpreter grid sizes; the GPU shapes cover the real grid")
    monkeypatch.setattr(tw, "_INTERP_PROGRAMS", programs)
    x = _x(32, 256)  # 8 flat tiles of 1024, 16 dual tiles of 16x32
    for dual in (False, True):
        _check(monkeypatch, x, E4M3, dual, "own", SMALL)
        _check(monkeypatch, x.t(), E4M3, dual, "own", SMALL)  # non-contiguous input


@pytest.mark.parametrize("case", ["inf_nan", "zeros", "nan_only", "cs_off", "tail", "none"])
def test_tw_special_values(monkeypatch, case):
    m, n = (37, 200) if not HAS_GPU else (4096, 2048)
    x = _x(m, n)
    env = dict(SMALL) if not HAS_GPU else {}
    if case == "inf_nan":
        x[1, 3], x[2, 4], x[m - 1, 5] = float("inf"), float("-inf"), float("nan")
    elif case == "zeros":
        x.zero_()
    elif case == "nan_only":
        x[m - 1, n - 1] = float("nan")
    elif case == "tail":  # evict_last from the middle of each program's walk on
        x[0, 0] = float("inf")
        env["PRIMUS_TURBO_QUANT_TW_EVICT"] = "tail"
        env["PRIMUS_TURBO_QUANT_TW_L2_MB"] = "1" if not HAS_GPU else "4"
    elif case == "none":
        env["PRIMUS_TURBO_QUANT_TW_EVICT"] = "none"
        env["PRIMUS_TURBO_QUANT_TW_EVICT_CAST"] = "none"
    else:
        env["PRIMUS_TURBO_QUANT_TW_CS"] = "0"
    for dual in (False, True):
        _check(monkeypatch, x, E4M3, dual, "own", env)


def test_tw_zero_size(monkeypatch):
    for shape in ((0, 5), (4, 0)):
        x = torch.empty(shape, dtype=torch.bfloat16, device=DEV)
        out = _run(monkeypatch, x, E4M3, True, "own")
        assert out[0].shape == shape and out[2].shape == shape[::-1]
        assert torch.isfinite(out[1]).all()


@pytest.mark.skipif(not HAS_GPU, reason="knob sweep of the compiled kernels")
@pytest.mark.parametrize(
    "env",
    [
        {"PRIMUS_TURBO_QUANT_TW_BLOCK": "16384"},
        {"PRIMUS_TURBO_QUANT_TW_TILE": "64x128"},
        {"PRIMUS_TURBO_QUANT_TW_TILE": "128x128", "PRIMUS_TURBO_QUANT_TW_WARPS": "4"},
        {"PRIMUS_TURBO_QUANT_TW_PER_SM": "1"},
        {"PRIMUS_TURBO_QUANT_TW_WARPS": "16", "PRIMUS_TURBO_QUANT_TW_PER_SM": "1"},
    ],
)
def test_tw_knobs_gpu(monkeypatch, env):
    for dual in (False, True):
        _check(monkeypatch, _x(3000, 4096), E4M3, dual, "own", env)


def test_tw_programs_divide_tiles():
    assert tw._programs(2048, 528) == 512 and tw._programs(3072, 264) == 256
    assert tw._programs(7, 528) == 7 and tw._programs(1009, 264) == 264  # prime: no divisor


@pytest.mark.parametrize(
    "var,value",
    [
        ("PRIMUS_TURBO_QUANT_TW", "fused"),  # removed in session 5 round 2
        ("PRIMUS_TURBO_QUANT_TW_BLOCK", "3000"),
        ("PRIMUS_TURBO_QUANT_TW_TILE", "8x512"),
        ("PRIMUS_TURBO_QUANT_TW_TILE", "64"),
        ("PRIMUS_TURBO_QUANT_TW_PER_SM", "0"),
        ("PRIMUS_TURBO_QUANT_TW_WARPS", "0"),
        ("PRIMUS_TURBO_QUANT_TW_EVICT", "first"),
        ("PRIMUS_TURBO_QUANT_TW_EVICT_CAST", "last"),
    ],
)
def test_tw_env_validated(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=var):
        quant_launch.quant_tensorwise(_x(4, 8), E4M3, True)


def test_tile_knob_per_config(monkeypatch):
    """``PRIMUS_TURBO_QUANT_<KNOB>_<CONFIG>`` wins over ``PRIMUS_TURBO_QUANT_<KNOB>``, which wins
    over the config's default; the v3 128x128 tile's default cap is 80, the others keep 128."""
    from primus_turbo.triton.quantization.quant_kernel_v2 import MAXNREG, V3_MAXNREG

    assert V3_MAXNREG == {"tile": 80} and MAXNREG == 128
    for var in ("PRIMUS_TURBO_QUANT_MAXNREG", "PRIMUS_TURBO_QUANT_MAXNREG_BLOCK_DUAL"):
        monkeypatch.delenv(var, raising=False)
    assert quant_launch._knob("MAXNREG", "block_dual", 128) == 128
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_MAXNREG", "96")
    assert quant_launch._knob("MAXNREG", "block_dual", 128) == 96
    assert quant_launch._knob("MAXNREG", "tile", 80) == 96
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_MAXNREG_BLOCK_DUAL", "64")
    assert quant_launch._knob("MAXNREG", "block_dual", 128) == 64
    assert quant_launch._knob("MAXNREG", "tile", 80) == 96
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_WARPS_BLOCK_DUAL", "0")
    with pytest.raises(ValueError, match="PRIMUS_TURBO_QUANT_WARPS_BLOCK_DUAL"):
        quant_launch._knob("WARPS", "block_dual", 8)


# the round-2 sweep of the v3 tile kernel (bench lines s5_r2_qtw): same bits at every setting
_BLOCK_SWEEP = [
    {"PRIMUS_TURBO_QUANT_MAXNREG_BLOCK_DUAL": "80"},
    {"PRIMUS_TURBO_QUANT_WARPS_BLOCK_DUAL": "16", "PRIMUS_TURBO_QUANT_MAXNREG_BLOCK_DUAL": "64"},
    {"PRIMUS_TURBO_QUANT_WARPS_BLOCK_DUAL": "16", "PRIMUS_TURBO_QUANT_MAXNREG_BLOCK_DUAL": "40"},
    {"PRIMUS_TURBO_QUANT_WARPS_BLOCK_DUAL": "32", "PRIMUS_TURBO_QUANT_MAXNREG_BLOCK_DUAL": "64"},
    {"PRIMUS_TURBO_QUANT_WARPS_BLOCK_DUAL": "32", "PRIMUS_TURBO_QUANT_MAXNREG_BLOCK_DUAL": "32"},
    {"PRIMUS_TURBO_QUANT_MAXNREG_TILE": "128"},
]


def _blockwise(monkeypatch, x, env, axis, dual):
    for k in [k for k in os.environ if k.startswith("PRIMUS_TURBO_QUANT_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA", "0")  # the Triton tile kernel, also on NVIDIA
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return quant_launch.quant_blockwise(x, E4M3, 128, axis, dual)


@pytest.mark.skipif(not HAS_GPU, reason="register caps / warps of the compiled tile kernel")
@pytest.mark.parametrize("env", _BLOCK_SWEEP, ids=lambda e: "-".join(e.values()))
@pytest.mark.parametrize("m,n", [(8192, 4096), (1008, 1040)])  # 1008: masked edge tiles
def test_tile_knobs_bitwise_gpu(monkeypatch, env, m, n):
    x = _x(m, n)
    x[3, 5], x[m - 1, 7] = float("inf"), float("nan")
    for axis, dual in ((-1, True), (None, False)):
        base = _blockwise(monkeypatch, x, {}, axis, dual)
        new = _blockwise(monkeypatch, x, env, axis, dual)
        for a, b in zip(new, base, strict=True):
            assert _same(a, b)
