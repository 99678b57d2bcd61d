"""Rowwise FP8 quantization of non-power-of-two rows on ``quant_rows_chunked_kernel``
(``PRIMUS_TURBO_QUANT_ROWS_CHUNK=1|2``) and ``quant_rows3_kernel`` (``3|4``, rows of 3 x 2^k
values): bitwise the outputs of the default one-pass kernel
(q and scales), special values, rows not a multiple of the program's rows, strided inputs,
both axes; the plan rule; the env knob. CPU runs the kernels under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core.low_precision import ScalingGranularity
from primus_turbo.pytorch.ops.quantization import quantize_fp8
from primus_turbo.pytorch.reference import quantization as ref
from primus_turbo.triton.quantization.quant_launch import (
    rows3_plan,
    rows_chunk_plan,
    rows_chunk_setting,
)
from tests.conftest import HAS_GPU

pytestmark = pytest.mark.quantization

DEV = "cuda" if HAS_GPU else "cpu"
ROW = ScalingGranularity.ROWWISE
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# (rows, cols): 768 = 3 x 256 (Qwen3-30B-A3B's K), 384 = 3 x 128; GPU adds the model shapes
SHAPES = [(23, 768), (45, 384), (32, 768)]  # 32 rows: the EVEN (no mask) path of 3 / 4
if HAS_GPU:
    SHAPES += [(65536, 768), (4097, 1536), (32768, 2880), (1000, 6144), (3, 768)]


def _x(m, n, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(m, n, generator=g) * 3.0
    x[m // 2] *= 1e-3  # rows of very different magnitudes in one program
    return x.to(dtype).to(DEV)


def _quant(monkeypatch, x, dtype, setting, axis=-1):
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_ROWS_CHUNK", str(setting))
    q, s = quantize_fp8(x, dtype, ROW, axis=axis)
    return q.view(torch.uint8).clone(), s.clone()


def test_rows_chunk_plan_rule():
    assert rows_chunk_plan(768, 0) is None
    assert rows_chunk_plan(768, 1) == (10, 16, 32, 256, 3, 8)
    assert rows_chunk_plan(768, 2) == (21, 32, 64, 256, 3, 16)
    assert rows_chunk_plan(2880, 2) == (5, 8, 256, 64, 45, 16)
    for cols in (2048, 4096, 7168, 2880, 1000, 7, 20000):  # pow2, no gain, odd, too long
        assert rows_chunk_plan(cols, 1) is None
    assert rows3_plan(768, 3) == (8, 256, 8) and rows3_plan(768, 4) == (16, 256, 16)
    assert rows3_plan(768, 1) is None and rows3_plan(2880, 3) is None
    assert rows3_plan(2048, 3) is None and rows3_plan(3 * 8192, 3) is None
    assert rows_chunk_plan(768, 3) is None
    for cols in range(16, 16385, 16):
        for setting in (1, 2):
            plan = rows_chunk_plan(cols, setting)
            if plan is None:
                continue
            bm, bmp, r, ch, cpr, warps = plan
            assert ch * cpr == cols and bm * cpr <= r and bm <= bmp < 2 * bm + 1
            assert r & (r - 1) == 0 and ch & (ch - 1) == 0 and bmp * r <= 4096


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("setting", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=str)
def test_rows_chunked_bitwise(monkeypatch, shape, setting, dtype):
    x = _x(*shape)
    q0, s0 = _quant(monkeypatch, x, dtype, 0)
    q1, s1 = _quant(monkeypatch, x, dtype, setting)
    assert torch.equal(q0, q1) and torch.equal(s0, s1)
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_ROWS_REVERSE", "1")  # row blocks last to first
    q2, s2 = _quant(monkeypatch, x, dtype, setting)
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_ROWS_REVERSE")
    assert torch.equal(q0, q2) and torch.equal(s0, s2)
    if shape[0] * shape[1] <= 1 << 16:  # and near the reference (rounding of the division)
        qr, sr = ref.quantize_rowwise_ref(x, dtype, -1)
        torch.testing.assert_close(s1.float().cpu(), sr.float().cpu(), rtol=1e-6, atol=0)
        a, b = q1.view(dtype).float().cpu(), qr.float().cpu()
        assert ((a - b).abs() <= b.abs() * 0.26 + 2.0**-9).all()


@pytest.mark.parametrize("setting", [1, 2, 3, 4])
def test_rows_chunked_specials_and_layouts(monkeypatch, setting):
    m, n = 25, 768
    x = _x(m, n, torch.float32)
    x[1, 5] = float("inf")
    x[2, 700] = float("-inf")
    x[3, 300] = float("nan")
    x[4] = 0.0
    x[5, :256] = 0.0
    x = x.to(torch.bfloat16)
    q0, s0 = _quant(monkeypatch, x, E4M3, 0)
    q1, s1 = _quant(monkeypatch, x, E4M3, setting)
    assert torch.equal(q0, q1) and torch.equal(s0, s1)
    # a row-strided view (rows padded to 1024 values) and fp16 / fp32 inputs
    wide = _x(m, 1024)[:, :n]
    a, b = _quant(monkeypatch, wide, E4M3, 0), _quant(monkeypatch, wide, E4M3, setting)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for dt in (torch.float16, torch.float32):
        xd = _x(m, n, dt, seed=1)
        a, b = _quant(monkeypatch, xd, E4M3, 0), _quant(monkeypatch, xd, E4M3, setting)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # axis=0 of a [768, m] tensor: its columns are strided rows (two-loop path, unchanged)
    xt = _x(n, 9)
    a, b = _quant(monkeypatch, xt, E4M3, 0, axis=0), _quant(monkeypatch, xt, E4M3, setting, axis=0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_rows_chunk_env(monkeypatch):
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_ROWS_CHUNK", raising=False)
    assert rows_chunk_setting() == 0
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_ROWS_CHUNK", "2")
    assert rows_chunk_setting() == 2
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_ROWS_CHUNK", "5")
    with pytest.raises(ValueError, match="ROWS_CHUNK"):
        rows_chunk_setting()


@pytest.mark.skipif(not HAS_GPU, reason="PDL flag: compiled NVIDIA kernels only")
@pytest.mark.parametrize("setting", [0, 1, 3])
def test_rows_pdl_flag_same_values(monkeypatch, setting):
    """``PRIMUS_TURBO_QUANT_ROWS_PDL=1`` only adds griddepcontrol.launch_dependents."""
    x = _x(4097, 768)
    q0, s0 = _quant(monkeypatch, x, E4M3, setting)
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_ROWS_PDL", "1")
    q1, s1 = _quant(monkeypatch, x, E4M3, setting)
    q2, s2 = _quant(monkeypatch, x, E4M3, 0)
    assert torch.equal(q0, q1) and torch.equal(s0, s1)
    assert torch.equal(q0, q2) and torch.equal(s0, s2)
