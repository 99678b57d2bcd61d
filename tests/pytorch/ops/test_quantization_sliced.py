"""PRIMUS_TURBO_QUANT_WORDS (quant_words.py, the default MX kernel for bf16) and the sliced MX
kernel (quant_dual.py, the fallback; WORDS=0): the same bits and scales as the v3 tile kernels,
even and masked (odd) shapes and tiles, with inf/-inf/NaN and all-zero rows/columns; zero-size
inputs; routing; env validation."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core.low_precision import ScalingGranularity
from primus_turbo.pytorch.ops.quantization import quantize_fp8, quantize_fp8_with_trans
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import bf16_specials, same_bits

pytestmark = pytest.mark.quantization

DEV = "cuda" if HAS_GPU else "cpu"
G = ScalingGranularity
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
_ENV = ("PRIMUS_TURBO_QUANT_SLICED", "PRIMUS_TURBO_QUANT_SLICED_MX", "PRIMUS_TURBO_QUANT_WORDS",
        "PRIMUS_TURBO_QUANT_MAXNREG_WORDS_MX_ROWS", "PRIMUS_TURBO_QUANT_WORDS_TILE",
        "PRIMUS_TURBO_QUANT_MAXNREG_WORDS_MX_DUAL")  # fmt: skip


@pytest.fixture(autouse=True)
def _triton_mx(monkeypatch):
    """These tests are about the Triton kernels: the CUDA MX kernels (csrc/kernels/
    quant_dual_mx.cu; the MX dual default on NVIDIA) stay out."""
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA_MX", "0")


def _quant(recipe, x, dtype):
    if recipe == "block1x128":
        return quantize_fp8_with_trans(x, dtype, G.BLOCKWISE, block_size=128)
    if recipe == "mx_dual":
        return quantize_fp8_with_trans(x, dtype, G.MX_BLOCKWISE, block_size=32)
    return quantize_fp8(x, dtype, G.MX_BLOCKWISE, block_size=32)


# (recipe, extra PRIMUS_TURBO_QUANT_* "KEY=VALUE"s or None): the candidate runs with the
# defaults plus the extras (WORDS=0: the sliced kernel); the CPU tier keeps the interpreter
# cases few. MX dual tiles: the default 128x128 (run 6.3), 32x256 and the previous default
# 64x256 (the WORDS_TILE A/B variant)
CASES = [("mx_dual", None), ("mx_rows", None), ("mx_dual", "WORDS=0"), ("mx_rows", "WORDS=0"),
         ("mx_dual", "WORDS_TILE=32x256"), ("mx_dual", "WORDS_TILE=64x256")]  # fmt: skip
_ODD_ONLY = ("WORDS_TILE=32x256", "WORDS_TILE=64x256")  # CPU: masked shapes only
if HAS_GPU:
    CASES += [("mx_dual", "MAXNREG_WORDS_MX_DUAL=80")]


@pytest.mark.parametrize("recipe,extra", CASES, ids=["-".join(map(str, c)) for c in CASES])
@pytest.mark.parametrize("shape", ["even", "odd"])
def test_sliced_kernel_bitwise(monkeypatch, recipe, extra, shape):
    if not HAS_GPU and shape == "even" and extra in _ODD_ONLY:
        pytest.skip("CPU time budget: these cases run the masked (odd) shapes only")
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_IMPL", "v3")
    if HAS_GPU:  # MX: multiples of 32 (odd: edge tiles along N, and along M for tall tiles)
        m, n = (4096, 2048) if shape == "even" else (4096 + 96, 2048 - 32)
    else:
        m, n = (128, 256) if shape == "even" else (160, 192)
    for special in (True, False) if HAS_GPU else (True,):  # CPU time budget
        x = bf16_specials(m, n, special, DEV)
        e5m2 = HAS_GPU and special and extra is None  # compile time
        for dtype in (E4M3, E5M2) if e5m2 else (E4M3,):
            for var in _ENV:
                monkeypatch.delenv(var, raising=False)
            monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED", "0")  # the v3 kernels
            monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED_MX", "0")
            monkeypatch.setenv("PRIMUS_TURBO_QUANT_WORDS", "0")
            ref = _quant(recipe, x, dtype)
            for var in _ENV:
                monkeypatch.delenv(var, raising=False)
            for item in (extra or "").split():
                key, value = item.split("=")
                monkeypatch.setenv("PRIMUS_TURBO_QUANT_" + key, value)
            out = _quant(recipe, x, dtype)
            assert len(out) == len(ref)
            for a, b in zip(out, ref, strict=True):
                assert same_bits(a, b)


@pytest.mark.parametrize("words", ["0", "1"])
@pytest.mark.parametrize("recipe", ["block1x128", "mx_dual", "mx_rows"])
@pytest.mark.parametrize("shape", [(0, 256), (128, 0)])
def test_sliced_kernel_zero_size(monkeypatch, recipe, shape, words):
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED", "1")
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED_MX", "1")
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_WORDS", words)
    x = torch.empty(shape, device=DEV, dtype=torch.bfloat16)
    out = _quant(recipe, x, E4M3)
    assert out[0].shape == x.shape
    if len(out) == 4:
        assert out[2].shape == (shape[1], shape[0])


def test_sliced_kernel_is_routed(monkeypatch):
    """Defaults: the word-sliced kernel for MX rows and MX dual of bf16 inputs
    (PRIMUS_TURBO_QUANT_WORDS unset), the 1x128 dual always on v3; other inputs and WORDS=0
    take the sliced kernel (SLICED / SLICED_MX = 0: v3)."""
    from primus_turbo.triton.quantization import quant_launch as ql

    called = []
    monkeypatch.setattr(ql, "launch_sliced", lambda *a, **k: called.append(a[5]))
    monkeypatch.setattr(ql, "launch_words", lambda *a, **k: called.append("w_" + a[5]))
    for var in _ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_IMPL", raising=False)
    x = bf16_specials(128, 256, False, DEV)

    def run(xx=x):
        called.clear()
        quantize_fp8_with_trans(xx, E4M3, G.MX_BLOCKWISE, block_size=32)
        quantize_fp8(xx, E4M3, G.MX_BLOCKWISE, block_size=32)
        quantize_fp8_with_trans(xx, E4M3, G.BLOCKWISE, block_size=128)
        return list(called)

    assert run() == ["w_mx_dual", "w_mx_rows"]
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_WORDS", "mx_rows")
    assert run() == ["mx_dual", "w_mx_rows"]
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_WORDS", "1")
    assert run(x.float()) == ["mx_dual", "mx_rows"]  # word loads need bf16
    assert run(x.half()) == ["mx_dual", "mx_rows"]
    unaligned = bf16_specials(128, 258, False, DEV)[:, 1:257]  # not 4-byte aligned
    assert run(unaligned) == ["mx_dual", "mx_rows"]
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_WORDS", "0")
    assert run() == ["mx_dual", "mx_rows"]
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED", "mx")
    assert run() == ["mx_dual", "mx_rows"]
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED", "1")
    assert run() == ["mx_dual", "mx_rows"]
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED", "0")
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED_MX", "0")
    assert run() == []
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_IMPL", "v1")
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED", "1")
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_SLICED_MX", "1")
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_WORDS", "1")
    assert run() == []


def test_words_kernel_subnormal_and_edges_match_reference(monkeypatch):
    """The word-sliced MX kernels against the torch reference on bf16 subnormals (the
    interpreter's v3 path mis-converts them, so this compares with the reference), blocks of
    only NaN / inf, powers of two and near-max values (a column block whose other values
    underflow to zero)."""
    from primus_turbo.pytorch.reference import quantization as ref

    for var in _ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_WORDS", "1")
    x = bf16_specials(64, 256, False, DEV)
    x[0, 0:32] = 1e-39  # subnormal block
    x[1, 32:64] = float("nan")
    x[2, 64:96] = float("inf")
    x[3, 96:128] = 2.0**-126
    x[4, 128:160] = 3.0e38
    x[5, 160] = 256.0
    x[32:64, 7] = float("-inf")  # a column block of only -inf
    x[32:64, 9] = 1e-40
    for dtype in (E4M3, E5M2):
        q, s, qt, st = _quant("mx_dual", x, dtype)
        for (a, sa), (b, sb) in (((q, s), ref.quantize_mx_ref(x, dtype)),
                                 ((qt, st), ref.quantize_mx_ref(x.t(), dtype))):  # fmt: skip
            assert torch.equal(sa, sb)  # same values (the interpreter's fp8 encoder gives
            # +0 where the reference's gives -0 for a negative value that rounds to zero)
            torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("var,value", [("PRIMUS_TURBO_QUANT_SLICED", "2"),
                                       ("PRIMUS_TURBO_QUANT_SLICED_MX", "2"),
                                       ("PRIMUS_TURBO_QUANT_WORDS", "mx"),
                                       ("PRIMUS_TURBO_QUANT_WORDS", "block_dual"),
                                       ("PRIMUS_TURBO_QUANT_WORDS_TILE", "48x256"),
                                       ("PRIMUS_TURBO_QUANT_WORDS_TILE", "128x256")])  # fmt: skip
def test_sliced_env_validated(monkeypatch, var, value):
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_WORDS", "1" if "WORDS" in var else "0")
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=var):
        recipe = "mx_rows" if var.endswith("_MX") else "mx_dual"
        _quant(recipe, bf16_specials(64, 256, False, DEV), E4M3)
