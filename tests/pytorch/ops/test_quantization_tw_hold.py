"""The CUDA one-launch "hold" kernels for dynamic tensorwise FP8 (csrc/kernels/quant_tw_hold.cu and,
for the dual recipe, quant_tw_hold_dual.cu, through
primus_turbo/pytorch/kernels/quantization/quant_tw_cuda.py; opt-in by
PRIMUS_TURBO_QUANT_CUDA_TW=hold|hold1k|hold1k7|holdn|holdw and
PRIMUS_TURBO_QUANT_CUDA_TW_DUAL=hold|holdn|holdw) give the same bits (q, q^T and the fp32
scale_inv) as the Triton kernels (knobs 0): shapes below / around / above
the on-chip capacity (~45 MB on an H200: shared memory, registers, streamed remainder), odd sizes
(a < 8-element tail), tiny and one-row inputs, zeros, all-equal, inf / NaN in every region,
all 65536 bf16 patterns, e4m3 and e5m2; CUDA graph capture and replay, repeated calls (the grid
barrier and the partials workspace reused); inputs it does not take fall back to Triton; the
knobs are validated; the Meta ops; torch.compile traces Triton. CPU: knob parsing and the CPU
fallback only."""

from __future__ import annotations

import unittest.mock

import pytest
import torch

from primus_turbo.pytorch.core.low_precision import ScalingGranularity
from primus_turbo.pytorch.kernels.quantization import quant_tw_cuda as twc
from primus_turbo.pytorch.ops.quantization import quantize_fp8
from primus_turbo.triton.quantization import quant_launch
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import same_bits

pytestmark = pytest.mark.quantization

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
KNOB, MIN = "PRIMUS_TURBO_QUANT_CUDA_TW", "PRIMUS_TURBO_QUANT_CUDA_TW_MIN"
DKNOB = "PRIMUS_TURBO_QUANT_CUDA_TW_DUAL"
VARIANTS = list(twc.TW_VARIANTS)
DUAL_VARIANTS = list(twc.TW_DUAL_VARIANTS)

_NVIDIA = HAS_GPU and torch.version.hip is None
_KERNEL = _NVIDIA and twc.tw_kernel_available(torch.cuda.current_device() if _NVIDIA else 0)
_SKIP_GPU = pytest.mark.skipif(
    not _KERNEL,
    reason="needs an NVIDIA sm_90+ GPU and a CUDA build of primus_turbo.pytorch._C with "
    "quant_tw_hold_fp8",
)


def _x(m, n, scale=3.0, device="cuda"):
    return (torch.randn(m, n, device=device) * scale).to(torch.bfloat16)


def _tw(monkeypatch, x, dtype, mode):
    monkeypatch.setenv(KNOB, mode)
    return quant_launch.quant_tensorwise(x, dtype, False)


def _compare(monkeypatch, x, dtype, variant, expect_on=True):
    """Hold kernel vs Triton, bitwise (q and scale_inv)."""
    monkeypatch.setenv(MIN, "1")
    monkeypatch.setenv(KNOB, variant)
    assert twc.cuda_tw_on(x, dtype) == expect_on  # not a silent fallback
    ref = _tw(monkeypatch, x, dtype, "0")
    out = _tw(monkeypatch, x, dtype, variant)
    assert len(out) == len(ref) == 2
    for name, a, b in zip(("q", "scale_inv"), out, ref, strict=True):
        assert same_bits(a, b), f"{tuple(x.shape)} {dtype} {variant}: {name} differs"
    return out


# below / around / above the on-chip capacity (4096x4096 fits, 8192x4096 streams ~17 MB,
# 28672x4096 ~180 MB), a one-row 2**20 + 8, odd sizes (tails of 1..7 elements), fewer vectors
# than blocks, tiny
SHAPES = [(4096, 4096), (6144, 4096), (8192, 4096), (1, 2**20 + 8), (999, 1001), (1, 13),
          (3, 5), (1, 1), (1, 8), (7, 1024), (517, 4099), (2048, 2056)]  # fmt: skip
BIG = [(28672, 4096)]


@_SKIP_GPU
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda v: "x".join(map(str, v)))
def test_hold_bitwise(monkeypatch, shape, variant, dtype):
    _compare(monkeypatch, _x(*shape), dtype, variant)


@_SKIP_GPU
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("variant", ["hold", "hold1k7"])
@pytest.mark.parametrize("shape", BIG, ids=lambda v: "x".join(map(str, v)))
def test_hold_bitwise_big(monkeypatch, shape, variant, dtype):
    _compare(monkeypatch, _x(*shape), dtype, variant)


def _positions(numel):
    """Flat indices in every region of the hold kernel's first / middle / last block: the
    shared-memory part, the registers, the streamed remainder, the tail."""
    first_block = 8 * (numel // 8 // 132)  # elements of block 0 on a 132-SM H200
    pos = [0, 1, 8 * 14336 + 5, 8 * 14336 + 8 * 8191, 8 * (14336 + 8192) + 3, first_block - 1,
           numel // 2, numel - 9, numel - 1]  # fmt: skip
    return sorted({p for p in pos if 0 <= p < numel})


@_SKIP_GPU
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("variant", ["hold", "hold1k"])
@pytest.mark.parametrize("shape", [(8192, 4096), (999, 1001)], ids=lambda v: "x".join(map(str, v)))
def test_hold_specials(monkeypatch, shape, variant, dtype):
    m, n = shape
    numel = m * n
    flat = torch.zeros(numel, device="cuda", dtype=torch.bfloat16)
    _compare(monkeypatch, flat.view(m, n), dtype, variant)  # all zero: amax 1e-12
    _compare(monkeypatch, torch.full((m, n), 2.5, device="cuda", dtype=torch.bfloat16), dtype,
             variant)  # fmt: skip
    for value in (float("inf"), float("-inf"), float("nan")):
        _compare(monkeypatch, torch.full((m, n), value, device="cuda", dtype=torch.bfloat16),
                 dtype, variant)  # fmt: skip
    for p in _positions(numel):  # the amax (or an inf / NaN) in one region only
        for value in (1000.0, -3e38, float("inf"), float("nan")):
            x = _x(m, n, 0.1).view(-1)
            x[p] = value
            _compare(monkeypatch, x.view(m, n), dtype, variant)
        x = _x(m, n, 0.1).view(-1)
        x[p], x[numel - 1 - p] = float("nan"), 700.0
        _compare(monkeypatch, x.view(m, n), dtype, variant)


@_SKIP_GPU
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_hold_all_bf16_patterns(monkeypatch, variant, dtype):
    bits = torch.arange(65536, device="cuda", dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16).repeat(64).view(64, 65536)  # 4M values, every pattern
    _compare(monkeypatch, x, dtype, variant)
    finite = x[(x.abs() < 1e4)].contiguous()  # a finite amax that is not the largest bf16
    _compare(monkeypatch, finite.view(1, -1), dtype, variant)
    _compare(monkeypatch, x.flip(-1).contiguous(), dtype, variant)


@_SKIP_GPU
def test_hold_graph_capture_replay(monkeypatch):
    """Captured in a CUDA graph (cooperative kernel node) and replayed: the same bits as eager,
    twice in a row, and again after the input changes in place."""
    monkeypatch.setenv(MIN, "1")
    monkeypatch.setenv(KNOB, "hold")
    x = _x(8192, 4096)
    assert twc.cuda_tw_on(x, E4M3)
    for _ in range(2):  # warm-up outside the capture (occupancy query, shared-memory opt-in)
        quant_launch.quant_tensorwise(x, E4M3, False)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = quant_launch.quant_tensorwise(x, E4M3, False)
    for scale in (1.0, 1.0, 7.0, 0.01):
        x.copy_(_x(8192, 4096, scale))
        g.replay()
        torch.cuda.synchronize()
        ref = _tw(monkeypatch, x, E4M3, "0")
        for a, b in zip(out, ref, strict=True):
            assert same_bits(a.clone(), b)


@_SKIP_GPU
@pytest.mark.parametrize("variant", VARIANTS)
def test_hold_repeated_calls(monkeypatch, variant):
    """Back-to-back launches (the grid barrier and workspace reused): identical results."""
    x = _x(6144, 4096)
    first = _compare(monkeypatch, x, E4M3, variant)
    outs = [quant_launch.quant_tensorwise(x, E4M3, False) for _ in range(20)]
    for o in outs:
        assert same_bits(o[0], first[0]) and same_bits(o[1], first[1])


@_SKIP_GPU
def test_hold_public_api(monkeypatch):
    """quantize_fp8(x, dtype, TENSORWISE) reaches the kernel when the knob is on."""
    monkeypatch.setenv(MIN, "1")
    x = _x(2048, 4096)
    monkeypatch.setenv(KNOB, "0")
    ref = quantize_fp8(x, E4M3, ScalingGranularity.TENSORWISE)
    monkeypatch.setenv(KNOB, "hold")
    with unittest.mock.patch.object(twc, "quant_tw_cuda", wraps=twc.quant_tw_cuda) as spy:
        out = quantize_fp8(x, E4M3, ScalingGranularity.TENSORWISE)
    assert spy.call_count >= 1  # (the dispatcher may time backends on its first resolve)
    for a, b in zip(out, ref, strict=True):
        assert same_bits(a, b)


@_SKIP_GPU
def test_hold_fallbacks(monkeypatch):
    """Inputs the kernel does not take run Triton: fp16, non-contiguous, not 16-byte aligned,
    below PRIMUS_TURBO_QUANT_CUDA_TW_MIN, a grid that cannot be co-resident, the dual recipe."""
    monkeypatch.setenv(KNOB, "hold")
    monkeypatch.setenv(MIN, "1")
    x = _x(512, 1024)
    assert twc.cuda_tw_on(x, E4M3)
    assert not twc.cuda_tw_on(x.half(), E4M3)
    assert not twc.cuda_tw_on(x.t(), E4M3)
    unaligned = x.view(-1)[1 : 1 + 511 * 1024].view(511, 1024)
    assert not twc.cuda_tw_on(unaligned, E4M3)
    for t in (x.half(), x.t(), unaligned):
        _compare(monkeypatch, t, E4M3, "hold", expect_on=False)
    monkeypatch.setenv(MIN, str(x.numel() + 1))
    assert not twc.cuda_tw_on(x, E4M3)
    monkeypatch.delenv(MIN)
    assert not twc.cuda_tw_on(_x(64, 64), E4M3)  # below the default minimum
    with unittest.mock.patch.object(twc, "resident_blocks", return_value=0):
        monkeypatch.setenv(MIN, "1")
        assert not twc.cuda_tw_on(x, E4M3)
    with unittest.mock.patch.object(twc, "quant_tw_cuda", side_effect=AssertionError):
        quant_launch.quant_tensorwise(x, E4M3, True)  # dual: Triton


@_SKIP_GPU
def test_hold_op_direct_and_zero_size(monkeypatch):
    """The op itself: zero-size input (scale_inv as the Triton launcher), bad arguments."""
    ops = torch.ops.primus_turbo_cpp
    for shape in [(0, 256), (128, 0), (0,)]:
        x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
        q, s = ops.quant_tw_hold_fp8(x, E4M3, 448.0, 0, 3)
        assert q.shape == x.shape and q.dtype == E4M3 and s.shape == ()
        if len(shape) == 2:
            ref = quant_launch.quant_tensorwise(x, E4M3, False)
            assert same_bits(s, ref[1])
    x = _x(64, 64)
    with pytest.raises(RuntimeError, match="variant"):
        ops.quant_tw_hold_fp8(x, E4M3, 448.0, 99, 3)
    with pytest.raises(RuntimeError, match="flags"):
        ops.quant_tw_hold_fp8(x, E4M3, 448.0, 0, 8)
    with pytest.raises(RuntimeError, match="bfloat16"):
        ops.quant_tw_hold_fp8(x.half(), E4M3, 448.0, 0, 3)
    with pytest.raises(RuntimeError, match="contiguous"):
        ops.quant_tw_hold_fp8(x.t(), E4M3, 448.0, 0, 3)
    for v in range(len({v for v, _ in twc.TW_VARIANTS.values()})):  # the plain kernels
        assert (
            ops.quant_tw_hold_blocks(x, E4M3, v)
            >= torch.cuda.get_device_properties(0).multi_processor_count
        )  # at least one block per SM


@_SKIP_GPU
def test_hold_compile(monkeypatch):
    """torch.compile: under tracing the gate says no (Triton, the same bits)."""
    monkeypatch.setenv(KNOB, "hold")
    monkeypatch.setenv(MIN, "1")
    x = _x(256, 384)
    torch._dynamo.reset()
    fn = torch.compile(lambda t: quant_launch.quant_tensorwise(t, E4M3, False), backend="eager")
    try:
        with unittest.mock.patch.object(twc, "quant_tw_cuda", side_effect=AssertionError):
            out = fn(x)
    except Exception as exc:  # the Triton path's own tracing limits: same with the knob off
        if isinstance(exc, AssertionError):
            raise
        pytest.skip(f"the Triton tensorwise path does not trace: {type(exc).__name__}")
    finally:
        torch._dynamo.reset()
    ref = _tw(monkeypatch, x, E4M3, "0")
    for a, b in zip(out, ref, strict=True):
        assert same_bits(a, b)


# ---- dual (q and q^T, one scale): M and N multiples of 64


def _compare_dual(monkeypatch, x, dtype, variant, expect_on=True):
    monkeypatch.setenv(MIN, "1")
    monkeypatch.setenv(DKNOB, variant)
    assert twc.cuda_tw_dual_on(x, dtype) == expect_on  # not a silent fallback
    monkeypatch.setenv(DKNOB, "0")
    ref = quant_launch.quant_tensorwise(x, dtype, True)
    monkeypatch.setenv(DKNOB, variant)
    out = quant_launch.quant_tensorwise(x, dtype, True)
    assert len(out) == len(ref) == 4
    for name, a, b in zip(("q", "scale_inv", "q_t", "scale_inv_t"), out, ref, strict=True):
        assert same_bits(a, b), f"{tuple(x.shape)} {dtype} dual {variant}: {name} differs"
    return out


# 4096x4096 fits on chip (42 tiles of 64x64 per block), 8192x4096 streams ~1/3 of its tiles; one
# tile, one tile row / column, fewer tiles than blocks, wide and tall
DUAL_SHAPES = [(4096, 4096), (6144, 4096), (8192, 4096), (64, 64), (128, 192), (192, 8320),
               (1024, 64), (640, 1344), (4160, 2112)]  # fmt: skip


@_SKIP_GPU
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("variant", DUAL_VARIANTS)
@pytest.mark.parametrize("shape", DUAL_SHAPES, ids=lambda v: "x".join(map(str, v)))
def test_hold_dual_bitwise(monkeypatch, shape, variant, dtype):
    _compare_dual(monkeypatch, _x(*shape), dtype, variant)


@_SKIP_GPU
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("variant", ["hold", "hold12"])
def test_hold_dual_bitwise_big(monkeypatch, variant, dtype):
    _compare_dual(monkeypatch, _x(28672, 4096), dtype, variant)


@_SKIP_GPU
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("variant", ["hold", "hold12"])
@pytest.mark.parametrize("shape", [(8192, 4096), (640, 1344)], ids=lambda v: "x".join(map(str, v)))
def test_hold_dual_specials(monkeypatch, shape, variant, dtype):
    m, n = shape
    for value in (0.0, 2.5, float("inf"), float("-inf"), float("nan")):
        x = torch.full((m, n), value, device="cuda", dtype=torch.bfloat16)
        _compare_dual(monkeypatch, x, dtype, variant)
    # the amax / an inf / a NaN in the first block's shared-memory, register and streamed tiles,
    # the middle and the last tile
    tiles_n = n // 64
    for ti in sorted({0, 25, 26, 41, 42, (m // 64) * tiles_n // 2, (m // 64) * tiles_n - 1}):
        tm, tn = divmod(min(ti, (m // 64) * tiles_n - 1), tiles_n)
        for value in (1000.0, -3e38, float("inf"), float("nan")):
            x = _x(m, n, 0.1)
            x[tm * 64 + 37, tn * 64 + 11] = value
            _compare_dual(monkeypatch, x, dtype, variant)


@_SKIP_GPU
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_hold_dual_all_bf16_patterns(monkeypatch, dtype):
    bits = torch.arange(65536, device="cuda", dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16).repeat(64).view(64, 65536)
    _compare_dual(monkeypatch, x, dtype, "hold")
    _compare_dual(monkeypatch, x.view(4096, 1024).t().contiguous(), dtype, "hold")


@_SKIP_GPU
def test_hold_dual_graph_capture_replay(monkeypatch):
    monkeypatch.setenv(MIN, "1")
    monkeypatch.setenv(DKNOB, "hold")
    x = _x(8192, 4096)
    assert twc.cuda_tw_dual_on(x, E4M3)
    for _ in range(2):
        quant_launch.quant_tensorwise(x, E4M3, True)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = quant_launch.quant_tensorwise(x, E4M3, True)
    for scale in (1.0, 1.0, 7.0, 0.01):
        x.copy_(_x(8192, 4096, scale))
        g.replay()
        torch.cuda.synchronize()
        monkeypatch.setenv(DKNOB, "0")
        ref = quant_launch.quant_tensorwise(x, E4M3, True)
        monkeypatch.setenv(DKNOB, "hold")
        for a, b in zip(out, ref, strict=True):
            assert same_bits(a.clone(), b)


@_SKIP_GPU
def test_hold_dual_repeated_and_fallbacks(monkeypatch):
    x = _x(6144, 4096)
    first = _compare_dual(monkeypatch, x, E4M3, "hold")
    for _ in range(10):
        o = quant_launch.quant_tensorwise(x, E4M3, True)
        assert all(same_bits(a, b) for a, b in zip(o, first, strict=True))
    for bad in (_x(100, 128), _x(128, 96), _x(512, 1024).t(), _x(512, 1024).half()):
        _compare_dual(monkeypatch, bad, E4M3, "hold", expect_on=False)
    monkeypatch.setenv(DKNOB, "hold")
    with unittest.mock.patch.object(twc, "resident_blocks", return_value=0):
        assert not twc.cuda_tw_dual_on(x, E4M3)
    with unittest.mock.patch.object(twc, "quant_tw_dual_cuda", side_effect=AssertionError):
        quant_launch.quant_tensorwise(x, E4M3, False)  # the plain recipe never takes it
    ops = torch.ops.primus_turbo_cpp
    with pytest.raises(RuntimeError, match="multiples of 64"):
        ops.quant_tw_hold_dual_fp8(_x(100, 128), E4M3, 448.0)
    for v in (0, 1):
        assert ops.quant_tw_hold_blocks(x, E4M3, twc.DUAL_BLOCKS_ID + v) >= (
            torch.cuda.get_device_properties(0).multi_processor_count
        )
    with pytest.raises(RuntimeError, match="variant"):
        ops.quant_tw_hold_dual_fp8(x, E4M3, 448.0, 2, 3)


def _require_native_op(name: str) -> None:
    from primus_turbo.build_info import native_status

    ok, _ = native_status()
    if not ok or not hasattr(torch.ops.primus_turbo_cpp, name):
        pytest.skip(f"primus_turbo.pytorch._C without {name} (rebuild the extension)")


def test_hold_op_meta():
    _require_native_op("quant_tw_hold_fp8")
    x = torch.empty(300, 1000, dtype=torch.bfloat16, device="meta")
    q, s = torch.ops.primus_turbo_cpp.quant_tw_hold_fp8(x, E5M2, 57344.0)
    assert q.shape == (300, 1000) and q.dtype == E5M2 and s.shape == () and s.dtype == torch.float32
    assert torch.ops.primus_turbo_cpp.quant_tw_hold_blocks(x, E4M3, 0) == 0
    with pytest.raises(RuntimeError, match="bfloat16"):
        torch.ops.primus_turbo_cpp.quant_tw_hold_fp8(x.half(), E4M3, 448.0)
    with pytest.raises(RuntimeError, match="float8"):
        torch.ops.primus_turbo_cpp.quant_tw_hold_fp8(x, torch.float16, 448.0)


def test_hold_dual_op_meta():
    _require_native_op("quant_tw_hold_dual_fp8")
    x = torch.empty(320, 1024, dtype=torch.bfloat16, device="meta")
    q, s, qt = torch.ops.primus_turbo_cpp.quant_tw_hold_dual_fp8(x, E4M3, 448.0)
    assert q.shape == (320, 1024) and qt.shape == (1024, 320) and qt.is_contiguous()
    assert q.dtype == qt.dtype == E4M3 and s.shape == () and s.dtype == torch.float32
    with pytest.raises(RuntimeError, match="multiples of 64"):
        y = torch.empty(300, 1024, dtype=torch.bfloat16, device="meta")
        torch.ops.primus_turbo_cpp.quant_tw_hold_dual_fp8(y, E4M3, 448.0)


def test_hold_dual_knob(monkeypatch):
    monkeypatch.delenv(DKNOB, raising=False)
    assert twc.cuda_tw_dual_variant() is None
    for name, value in twc.TW_DUAL_VARIANTS.items():
        monkeypatch.setenv(DKNOB, name.upper())
        assert twc.cuda_tw_dual_variant() == value
    monkeypatch.setenv(DKNOB, "hold1k")  # plain-only variant
    with pytest.raises(ValueError, match=DKNOB):
        twc.cuda_tw_dual_variant()
    monkeypatch.setenv(DKNOB, "hold")
    monkeypatch.setenv(MIN, "1")
    assert not twc.cuda_tw_dual_on(torch.zeros(64, 64, dtype=torch.bfloat16), E4M3)


def test_hold_knob(monkeypatch):
    """PRIMUS_TURBO_QUANT_CUDA_TW: 0 / unset = off (the default), the variant names (any case),
    anything else raises; CPU tensors never take the kernel."""
    monkeypatch.delenv(KNOB, raising=False)
    assert twc.cuda_tw_variant() is None
    monkeypatch.setenv(KNOB, "0")
    assert twc.cuda_tw_variant() is None
    for name, value in twc.TW_VARIANTS.items():
        monkeypatch.setenv(KNOB, name.upper())
        assert twc.cuda_tw_variant() == value
    monkeypatch.setenv(KNOB, "fused")
    with pytest.raises(ValueError, match=KNOB):
        twc.cuda_tw_variant()
    with pytest.raises(ValueError, match=KNOB):
        twc.cuda_tw_on(torch.zeros(8, 8, dtype=torch.bfloat16), E4M3)
    monkeypatch.setenv(KNOB, "hold")
    monkeypatch.setenv(MIN, "1")
    assert not twc.cuda_tw_on(torch.zeros(64, 64, dtype=torch.bfloat16), E4M3)
