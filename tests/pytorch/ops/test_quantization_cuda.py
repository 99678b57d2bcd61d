"""The CUDA cast-transpose (csrc/kernels/quant_dual.cu, through
primus_turbo/pytorch/kernels/quantization/quant_cuda.py), the default for the 1x128 dual recipe
of bf16 inputs on NVIDIA, gives the same bits and scales as the Triton kernel
(PRIMUS_TURBO_QUANT_CUDA=0), on the model shapes, odd shapes (edge tiles, masked rows/columns,
unaligned qt rows, several tiles per persistent block), inf/-inf/NaN values, all-NaN / all-inf /
all-zero rows and columns, e4m3 and e5m2, zero-size inputs; inputs it does not take fall back to
Triton; the knob is validated; CPU tensors never take it; torch.compile traces (Triton).
The CUDA MX dual kernel (csrc/kernels/quant_dual_mx.cu, the default) is held to the same:
bitwise the Triton word kernel, outer-dim-major scales (second half of the file)."""

from __future__ import annotations

import unittest.mock

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

_NVIDIA = HAS_GPU and torch.version.hip is None
_KERNEL = _NVIDIA and quant_cuda.cuda_kernel_available()
_SKIP_GPU = pytest.mark.skipif(
    not _KERNEL,
    reason="needs an NVIDIA GPU and a CUDA build of primus_turbo.pytorch._C with quant_dual_fp8",
)


def _quant(x, dtype):
    return quantize_fp8_with_trans(x, dtype, G.BLOCKWISE, block_size=128)


def _input(m, n, special, device):
    x = bf16_specials(m, n, special, device) if m >= 10 else torch.randn(m, n, device=device)
    x = x.to(torch.bfloat16)
    if special and m >= 10 and n >= 10:
        x[5, :] = float("nan")  # an all-NaN row, an all-inf column, an all -inf row
        x[:, 7] = float("inf")
        x[min(m - 1, 33), :] = float("-inf")
    return x


def _compare(monkeypatch, x, dtype):
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA", "0")
    ref = _quant(x, dtype)  # Triton
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_CUDA")  # the default
    out = _quant(x, dtype)
    assert len(out) == len(ref) == 4
    for name, a, b in zip(("q", "scale", "q_t", "scale_t"), out, ref, strict=True):
        assert same_bits(a, b), f"{tuple(x.shape)} {dtype}: {name} differs"


# model shapes, then odd ones: edge tiles along both dims, M % 16 != 0 (byte-wise qt rows),
# 4096x2048 / 4160x2016: several tiles per persistent block (2 blocks per SM)
SHAPES = [(8192, 4096), (6144, 4096), (4096, 2048), (4160, 2016), (4168, 2008), (300, 1000),
          (131, 96), (40, 24)]  # fmt: skip


@_SKIP_GPU
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda v: "x".join(map(str, v)))
def test_cuda_dual_bitwise(monkeypatch, shape, dtype):
    m, n = shape
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_CUDA", raising=False)
    assert quant_cuda.cuda_dual_on(_input(m, n, False, "cuda"), dtype)  # not a silent fallback
    for special in (False, True):
        _compare(monkeypatch, _input(m, n, special, "cuda"), dtype)


@_SKIP_GPU
@pytest.mark.parametrize("shape", [(0, 256), (128, 0), (0, 0)])
def test_cuda_dual_zero_size(monkeypatch, shape):
    _compare(monkeypatch, torch.empty(shape, dtype=torch.bfloat16, device="cuda"), E4M3)


@_SKIP_GPU
@pytest.mark.parametrize(
    "shape,dt", [((64, 100), torch.bfloat16), ((64, 128), torch.float16), ((96, 64), torch.float32)]
)
def test_cuda_dual_fallback(monkeypatch, shape, dt):
    """Inputs the kernel does not take (N % 8 != 0, not bf16) run the Triton kernel."""
    x = torch.randn(shape, device="cuda").to(dt)
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_CUDA", raising=False)
    assert not quant_cuda.cuda_dual_on(x, E4M3)
    _compare(monkeypatch, x, E4M3)


@_SKIP_GPU
def test_cuda_dual_off_and_mx(monkeypatch):
    """PRIMUS_TURBO_QUANT_CUDA=0 turns it off; the MX dual recipe never takes it (Triton words
    kernel: it beat every CUDA variant, H200 call 7.4)."""
    x = _input(256, 256, False, "cuda")
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA", "0")
    assert not quant_cuda.cuda_dual_on(x, E4M3)
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_CUDA")
    with unittest.mock.patch.object(quant_cuda, "quant_dual_cuda", side_effect=AssertionError):
        quantize_fp8_with_trans(x, E4M3, G.MX_BLOCKWISE, block_size=32)


@_SKIP_GPU
def test_cuda_dual_compile(monkeypatch):
    """torch.compile of the dual quantization: under tracing the gate says no (Triton, the same
    bits), so the CUDA default changes nothing for compiled callers (the fp8 ops that use it are
    dynamo-disabled and run it eagerly)."""
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_CUDA", raising=False)
    x = _input(256, 384, True, "cuda")
    torch._dynamo.reset()
    fn = torch.compile(lambda t: _quant(t, E4M3), backend="eager")
    try:
        out = fn(x)
    except Exception as exc:  # the Triton path's own tracing limits: same with the kernel off
        monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA", "0")
        torch._dynamo.reset()
        with pytest.raises(type(exc)):
            torch.compile(lambda t: _quant(t, E4M3), backend="eager")(x)
        pytest.skip(f"the Triton quantization path does not trace: {type(exc).__name__}")
    finally:
        torch._dynamo.reset()
    for name, a, b in zip(("q", "scale", "q_t", "scale_t"), out, _quant(x, E4M3), strict=True):
        assert same_bits(a, b), f"compiled {name} differs"


def test_cuda_knob_cpu_fallback(monkeypatch):
    """CPU tensors never take the CUDA kernel: the knob on gives the Triton/interpreter result."""
    x = _input(64, 128, True, "cpu")
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA", "1")
    assert not quant_cuda.cuda_dual_on(x, E4M3)
    _compare(monkeypatch, x, E4M3)


def test_cuda_knob_validation(monkeypatch):
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA", "2")
    x = torch.zeros(32, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="PRIMUS_TURBO_QUANT_CUDA"):
        quant_cuda.cuda_dual_on(x, E4M3)


def _require_native_op(name: str) -> None:
    """Skip unless the loaded extension registers ``torch.ops.primus_turbo_cpp.<name>``."""
    from primus_turbo.build_info import native_status

    ok, _ = native_status()
    if not ok or not hasattr(torch.ops.primus_turbo_cpp, name):
        pytest.skip(f"primus_turbo.pytorch._C without {name} (rebuild the extension)")


def test_cuda_op_meta():
    """The op's Meta implementation (every build of _C that has it): the Triton layouts."""
    _require_native_op("quant_dual_fp8")
    x = torch.empty(300, 1000, dtype=torch.bfloat16, device="meta")
    q, s, qt, st = torch.ops.primus_turbo_cpp.quant_dual_fp8(x, E4M3, 448.0)
    assert q.shape == (300, 1000) and qt.shape == (1000, 300) and q.dtype == E4M3
    assert s.shape == (300, 8) and s.stride() == (1, 300) and s.dtype == torch.float32
    assert st.shape == (1000, 3) and st.stride() == (1, 1000)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        y = torch.empty(32, 990, dtype=torch.bfloat16, device="meta")
        torch.ops.primus_turbo_cpp.quant_dual_fp8(y, E4M3, 448.0)


# ---- 1x128 dual, variants of the CUDA kernel (PRIMUS_TURBO_QUANT_CUDA_B128=t, the default since
# session 9 round 2: one 128x128 tile per 256-thread block, 3 blocks per SM): bitwise the
# persistent kernel (B128=p) and Triton

B128_VARIANTS = ["t"]
# SHAPES plus ragged ones: M % 8 != 0 (byte-wise qt stores), one row, one 8-column vector,
# N % 128 = 8 (a warp tile with one live vector), M % 32 = 8 (a lane's rows half out)
B128_SHAPES = SHAPES + [(1, 8), (9, 264), (127, 128), (136, 8), (4104, 136)]


def _compare_b128(monkeypatch, x, dtype, variant):
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA", "0")
    tri = _quant(x, dtype)  # Triton
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_CUDA")
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA_B128", "p")
    base = _quant(x, dtype)  # the persistent CUDA kernel
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA_B128", variant)
    out = _quant(x, dtype)
    for name, a, b, c in zip(("q", "scale", "q_t", "scale_t"), out, base, tri, strict=True):
        assert same_bits(a, b), f"{tuple(x.shape)} {dtype} {variant}: {name} differs from p"
        assert same_bits(a, c), f"{tuple(x.shape)} {dtype} {variant}: {name} differs from Triton"


@_SKIP_GPU
@pytest.mark.parametrize("variant", B128_VARIANTS)
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", B128_SHAPES, ids=lambda v: "x".join(map(str, v)))
def test_cuda_b128_variant_bitwise(monkeypatch, shape, dtype, variant):
    m, n = shape
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_CUDA", raising=False)
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA_B128", variant)
    assert quant_cuda.cuda_dual_on(_input(m, n, False, "cuda"), dtype)  # not a silent fallback
    for special in (False, True):
        _compare_b128(monkeypatch, _input(m, n, special, "cuda"), dtype, variant)


@_SKIP_GPU
@pytest.mark.parametrize("variant", B128_VARIANTS)
def test_cuda_b128_variant_values(monkeypatch, variant):
    """All 65536 bf16 bit patterns (every finite value, +-inf, NaNs), row- and column-wise."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16).reshape(256, 256).cuda()
    for xx in (x, x.t().contiguous(), x.flip(0).contiguous()):
        for dtype in (E4M3, E5M2):
            _compare_b128(monkeypatch, xx, dtype, variant)


@_SKIP_GPU
@pytest.mark.parametrize("variant", B128_VARIANTS)
def test_cuda_b128_variant_zero_size(monkeypatch, variant):
    for shape in ((0, 256), (128, 0)):
        x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
        _compare_b128(monkeypatch, x, E4M3, variant)


def test_cuda_b128_knob(monkeypatch):
    """PRIMUS_TURBO_QUANT_CUDA_B128: unset / t = the default, p; anything else (t4, removed
    after call 9.2, included) is refused with the knob's name."""
    for raw, want in (("", 1), ("p", 0), ("P", 0), ("t", 1), (" T ", 1)):
        monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA_B128", raw)
        assert quant_cuda.cuda_b128_variant() == want
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_CUDA_B128")
    assert quant_cuda.cuda_b128_variant() == 1
    for bad in ("0", "1", "a", "t3", "t4", "tt"):
        monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA_B128", bad)
        with pytest.raises(ValueError, match="PRIMUS_TURBO_QUANT_CUDA_B128"):
            quant_cuda.cuda_b128_variant()


@pytest.mark.parametrize("raw", ["", "t", "p"])
def test_cuda_b128_index_limit_fallback(monkeypatch, raw):
    """t indexes rows and columns in 32 bits (the launch refuses M or N > 0x7fffff00): a
    larger dim takes p (the op without its variant argument); smaller ones pass the variant.
    CPU: the op is mocked, the inputs are meta tensors."""
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA_B128", raw)
    want = quant_cuda.cuda_b128_variant()
    calls = []

    class _Ops:
        @staticmethod
        def quant_dual_fp8(*args):
            calls.append(args[3] if len(args) > 3 else 0)
            return (None,) * 4

    lim = 2**31 - 256
    with unittest.mock.patch("primus_turbo.build_info.native_ops", return_value=_Ops):
        for shape, big in (
            ((lim - 1, 8), False),
            ((8, lim - 8), False),
            ((lim, 8), True),
            ((8, 2**31), True),
            ((2**32, 8), True),
        ):
            calls.clear()
            x = torch.empty(shape, dtype=torch.bfloat16, device="meta")
            quant_cuda.quant_dual_cuda(x, E4M3, 448.0)
            assert calls == [0 if big else want], (shape, raw, calls)


def test_cuda_b128_op_meta():
    """The op's variant argument (Meta): 0, 1 taken (same layouts), others (2 = the removed t4)
    refused."""
    _require_native_op("quant_dual_fp8")
    schema = torch.ops.primus_turbo_cpp.quant_dual_fp8.default._schema
    if "variant" not in [a.name for a in schema.arguments]:
        pytest.skip("primus_turbo.pytorch._C without quant_dual_fp8's variant (rebuild it)")
    x = torch.empty(300, 1000, dtype=torch.bfloat16, device="meta")
    for v in (0, 1):
        q, s, qt, st = torch.ops.primus_turbo_cpp.quant_dual_fp8(x, E4M3, 448.0, v)
        assert qt.shape == (1000, 300) and s.stride() == (1, 300) and st.shape == (1000, 3)
    for bad in (-1, 2):
        with pytest.raises(RuntimeError, match="variant"):
            torch.ops.primus_turbo_cpp.quant_dual_fp8(x, E4M3, 448.0, bad)


# ---- MX dual: the CUDA MXFP8 cast-transpose (csrc/kernels/quant_dual_mx.cu), the default on
# NVIDIA (PRIMUS_TURBO_QUANT_CUDA_MX unset / 1), bitwise the Triton word kernel
# (PRIMUS_TURBO_QUANT_CUDA_MX=0), both storing the E8M0 scales outer-dim-major

_KERNEL_MX = _NVIDIA and quant_cuda.cuda_mx_kernel_available()
_SKIP_GPU_MX = pytest.mark.skipif(
    not _KERNEL_MX,
    reason="needs an NVIDIA GPU and a CUDA build of primus_turbo.pytorch._C with quant_dual_mx_fp8",
)


def _quant_mx(x, dtype):
    return quantize_fp8_with_trans(x, dtype, G.MX_BLOCKWISE, block_size=32)


def _input_mx(m, n, special, device):
    x = _input(m, n, special, device)
    if special:
        x[12, :] = x[12, :] * 1e-38  # tiny and subnormal bf16 values
        x[13, : min(n, 64)] = 3e38  # huge finite values (a saturating block)
        x[32:64, min(n - 1, 70)] = float("nan")  # an all-NaN column block (m >= 64)
        x[min(m - 1, 90), :] = -0.0
    return x


def _compare_mx(monkeypatch, x, dtype):
    """The CUDA kernel (knob unset) against Triton (knob 0): same bits, same (outer) layouts."""
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA_MX", "0")
    ref = _quant_mx(x, dtype)  # Triton (the word kernel on NVIDIA)
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_CUDA_MX")
    out = _quant_mx(x, dtype)
    assert len(out) == len(ref) == 4
    for name, a, b in zip(("q", "scale", "q_t", "scale_t"), out, ref, strict=True):
        assert same_bits(a, b), f"{tuple(x.shape)} {dtype}: {name} differs"
    m, n = x.shape
    assert out[1].stride() == (1, m) and out[3].stride() == (1, n)  # outer-dim-major scales


# model shapes; M % 128 = 64 and N % 128 = 96 with N / 32 odd; N % 64 = 32 (half warp tiles); one
# 32 x 32 block; M = 96; shapes that were whole / partial 2x4 clusters of session 9's kernel
MX_SHAPES = [(8192, 4096), (6144, 4096), (4096, 2048), (4160, 2016), (320, 4064), (96, 160),
             (2048, 96), (32, 32), (64, 128), (256, 512), (128, 512), (1536, 1536),
             (28672, 4096), (4224, 4096), (2048, 2304)]  # fmt: skip


@_SKIP_GPU_MX
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", MX_SHAPES, ids=lambda v: "x".join(map(str, v)))
def test_cuda_mx_dual_bitwise(monkeypatch, shape, dtype):
    m, n = shape
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_CUDA_MX", raising=False)
    assert quant_cuda.cuda_mx_dual_on(_input_mx(m, n, False, "cuda"), dtype)  # no fallback
    for special in (False, True) if m >= 64 else (False,):
        _compare_mx(monkeypatch, _input_mx(m, n, special, "cuda"), dtype)


@_SKIP_GPU_MX
def test_cuda_mx_dual_values(monkeypatch):
    """Every finite exponent and the specials, column- and row-wise (against Triton)."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16).reshape(256, 256).cuda()
    xc = torch.cat((x, x.t()), 1)
    for xx in (x, x.t().contiguous(), x.flip(0).contiguous(), xc, torch.cat((xc, xc.flip(1)), 0)):
        for dtype in (E4M3, E5M2):
            _compare_mx(monkeypatch, xx, dtype)


@_SKIP_GPU_MX
def test_cuda_mx_dual_matches_reference(monkeypatch):
    """The default path's values equal the TORCH reference's (contiguous scales there)."""
    from primus_turbo.pytorch.reference import quantization as ref

    monkeypatch.delenv("PRIMUS_TURBO_QUANT_CUDA_MX", raising=False)
    x = _input_mx(256, 384, True, "cuda")
    q, s, qt, st = _quant_mx(x, E4M3)
    q_ref, s_ref = ref.quantize_mx_ref(x, E4M3)
    qt_ref, st_ref = ref.quantize_mx_ref(x.t().contiguous(), E4M3)
    for a, b in ((q, q_ref), (s, s_ref), (qt, qt_ref), (st, st_ref)):
        assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@_SKIP_GPU_MX
def test_cuda_mx_dual_fallback_and_default(monkeypatch):
    """Unset: the CUDA kernel; 0: the Triton kernel; inputs it does not take run Triton
    silently."""
    x = _input_mx(256, 256, False, "cuda")
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_CUDA_MX", raising=False)
    assert quant_cuda.cuda_mx_on() and quant_cuda.cuda_mx_dual_on(x, E4M3)
    with unittest.mock.patch.object(quant_cuda, "quant_dual_mx_cuda", side_effect=RuntimeError):
        with pytest.raises(RuntimeError):
            _quant_mx(x, E4M3)
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA_MX", "0")
    assert not quant_cuda.cuda_mx_dual_on(x, E4M3)
    with unittest.mock.patch.object(quant_cuda, "quant_dual_mx_cuda", side_effect=AssertionError):
        _quant_mx(x, E4M3)
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA_MX", "1")
    assert not quant_cuda.cuda_mx_dual_on(x.to(torch.float16), E4M3)
    assert not quant_cuda.cuda_mx_dual_on(x[:, :100], E4M3)
    assert not quant_cuda.cuda_mx_dual_on(x.t(), E4M3)
    from primus_turbo.triton.quantization.quant_launch import quant_mx

    with unittest.mock.patch.object(quant_cuda, "quant_dual_mx_cuda", side_effect=AssertionError):
        quant_mx(x.to(torch.float16), E4M3, dual=True)


@_SKIP_GPU_MX
def test_cuda_mx_dual_compile(monkeypatch):
    """Under torch.compile tracing the gate says no (Triton, the same bits and layouts)."""
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_CUDA_MX", raising=False)
    x = _input_mx(256, 384, True, "cuda")
    torch._dynamo.reset()
    try:
        out = torch.compile(lambda t: _quant_mx(t, E4M3), backend="eager")(x)
    except Exception as exc:  # the Triton path's own tracing limits
        pytest.skip(f"the Triton quantization path does not trace: {type(exc).__name__}")
    finally:
        torch._dynamo.reset()
    for name, a, b in zip(("q", "scale", "q_t", "scale_t"), out, _quant_mx(x, E4M3), strict=True):
        assert same_bits(a, b), f"compiled {name} differs"


def test_cuda_mx_knob(monkeypatch):
    """The knob is validated (the removed session-9 variants are refused); CPU tensors never
    take the kernel."""
    x = _input_mx(64, 128, True, "cpu")
    for bad in ("a", "f", "g", "o", "2", "3"):
        monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA_MX", bad)
        with pytest.raises(ValueError, match="PRIMUS_TURBO_QUANT_CUDA_MX"):
            quant_cuda.cuda_mx_dual_on(x, E4M3)
    for ok in ("1", "", "0", " 1 "):
        monkeypatch.setenv("PRIMUS_TURBO_QUANT_CUDA_MX", ok)
        assert not quant_cuda.cuda_mx_dual_on(x, E4M3)


def test_mx_scales_outer_dim_major():
    """The Triton launcher (the GPU, else the CPU interpreter) stores MX scales outer-dim-major."""
    from primus_turbo.triton.quantization.quant_launch import quant_mx

    x = _input_mx(64, 96, True, "cuda" if HAS_GPU else "cpu")
    q, s, qt, st = quant_mx(x, E4M3, dual=True)
    assert s.shape == (64, 3) and s.stride() == (1, 64)
    assert st.shape == (96, 2) and st.stride() == (1, 96)
    q, s = quant_mx(x, E4M3)
    assert s.shape == (64, 3) and s.stride() == (1, 64)


def test_cuda_mx_op_meta():
    """The MX op's Meta implementation: the Triton layouts (outer-dim-major scales)."""
    _require_native_op("quant_dual_mx_fp8")
    schema = torch.ops.primus_turbo_cpp.quant_dual_mx_fp8.default._schema
    if "variant" in [a.name for a in schema.arguments]:
        pytest.skip("primus_turbo.pytorch._C still has the session-9 variant argument: rebuild it")
    x = torch.empty(320, 2016, dtype=torch.bfloat16, device="meta")
    q, s, qt, st = torch.ops.primus_turbo_cpp.quant_dual_mx_fp8(x, E4M3)
    assert q.shape == (320, 2016) and qt.shape == (2016, 320) and q.dtype == E4M3
    assert s.shape == (320, 63) and s.stride() == (1, 320) and s.dtype == torch.uint8
    assert st.shape == (2016, 10) and st.stride() == (1, 2016)
    with pytest.raises(RuntimeError, match="multiples of 32"):
        y = torch.empty(32, 48, dtype=torch.bfloat16, device="meta")
        torch.ops.primus_turbo_cpp.quant_dual_mx_fp8(y, E4M3)
    q, s, qt, st = torch.ops.primus_turbo_cpp.quant_dual_mx_fp8(x, E5M2)
    assert qt.shape == (2016, 320) and qt.dtype == E5M2
