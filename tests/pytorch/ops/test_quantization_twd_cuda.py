"""The CUDA delayed tensorwise cast (csrc/kernels/quant_tw_delayed.cu, through
primus_turbo/pytorch/kernels/quantization/quant_twd_cuda.py), the default path
(PRIMUS_TURBO_QUANT_CUDA_TWD unset), gives the bits of the Triton tw_delayed_kernel
(PRIMUS_TURBO_QUANT_CUDA_TWD=0): q, q^T, 1 / scale and the amax folded into the slot, on
model shapes, odd shapes, tiny and zero-size inputs, inf / NaN / all 65536 bf16 patterns, e4m3
and e5m2, several scales and prior slot values, store=False, the saturation guard (Triton's
guard kernel after the CUDA cast), repeated calls, CUDA graph replay, Fp8DelayedScaler; inputs
it does not take, torch.compile tracing and the interpreter stay on Triton; the knob is
validated; the op checks its arguments (CUDA and Meta)."""

from __future__ import annotations

import unittest.mock

import pytest
import torch

from primus_turbo.pytorch.kernels.quantization import quant_twd_cuda as twd
from primus_turbo.triton.quantization.quant_tw_launch import quant_tensorwise_delayed
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import bf16_specials

pytestmark = pytest.mark.quantization

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
KNOB = "PRIMUS_TURBO_QUANT_CUDA_TWD"
_NVIDIA = HAS_GPU and torch.version.hip is None
_KERNEL = _NVIDIA and twd.cuda_twd_available()
_SKIP_GPU = pytest.mark.skipif(
    not _KERNEL,
    reason="needs an NVIDIA sm_89+ GPU and a CUDA build of primus_turbo.pytorch._C with "
    "quant_tw_delayed_fp8",
)


def _bits(t):
    return None if t is None else t.detach().reshape(-1).view(torch.uint8).cpu()


def _knob(monkeypatch, variant):
    """None: the knob unset (the default path, the CUDA kernel); else its value."""
    if variant is None:
        monkeypatch.delenv(KNOB, raising=False)
    else:
        monkeypatch.setenv(KNOB, str(variant))


def _run(monkeypatch, variant, x, dtype, scale, amax0, dual, store=True, guard=None):
    _knob(monkeypatch, variant)
    amax = amax0.clone()
    out = quant_tensorwise_delayed(x, dtype, scale.clone(), amax, dual, store, guard)
    return out, amax


def _compare(monkeypatch, x, dtype, scale, amax0, dual, store=True, guard=None, variants=(None,)):
    ref, ref_amax = _run(monkeypatch, 0, x, dtype, scale, amax0, dual, store, guard)
    for v in variants:
        out, amax = _run(monkeypatch, v, x, dtype, scale, amax0, dual, store, guard)
        tag = f"{tuple(x.shape)} {dtype} dual={dual} store={store} guard={guard} knob {v}"
        assert torch.equal(_bits(amax), _bits(ref_amax)), f"{tag}: amax {amax} vs {ref_amax}"
        if not store:
            assert out is None and ref is None
            continue
        assert len(out) == len(ref) == (4 if dual else 2)
        for name, a, b in zip(("q", "scale_inv", "q_t", "scale_inv_t"), out, ref, strict=False):
            assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride(), name
            assert torch.equal(_bits(a), _bits(b)), f"{tag}: {name} differs"


def _f32(v, device="cuda"):
    return torch.full((1,), v, dtype=torch.float32, device=device)


def _input(m, n, special):
    if m >= 10 and n >= 10:
        return bf16_specials(m, n, special, "cuda")
    return (torch.randn(m, n, device="cuda") * 3.0).to(torch.bfloat16)


# model shapes, then odd ones: edge tiles along both dims, M % 8 != 0 (byte-wise q^T rows),
# a plain size that is no multiple of the 16384-value block, tiny
SHAPES = [(8192, 4096), (4096, 28672 // 4), (4160, 2016), (4168, 2008), (300, 1000), (131, 96),
          (40, 24), (1, 8), (3, 16)]  # fmt: skip


@_SKIP_GPU
@pytest.mark.parametrize("dual", [False, True], ids=["plain", "dual"])
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda v: "x".join(map(str, v)))
def test_twd_cuda_bitwise(monkeypatch, shape, dtype, dual):
    m, n = shape
    x = _input(m, n, False)
    _knob(monkeypatch, None)
    assert twd.cuda_twd_on(x, dtype, _f32(1.0), _f32(0.0), dual) == 1  # no silent fallback
    fmax = torch.finfo(dtype).max
    for special in (False, True):
        x = _input(m, n, special)
        for scale in (1.0, fmax / 9.0, 2.0**-10):
            _compare(monkeypatch, x, dtype, _f32(scale), _f32(0.0), dual)
    # prior slot values: larger than amax(x), -0.0, negative, NaN (integer max on the bits)
    for prior in (1e30, -0.0, -1.0, float("nan")):
        _compare(monkeypatch, x, dtype, _f32(2.0), _f32(prior), dual)


@_SKIP_GPU
@pytest.mark.parametrize("dual", [False, True], ids=["plain", "dual"])
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_twd_cuda_all_bf16_patterns(monkeypatch, dtype, dual):
    x = torch.arange(65536, dtype=torch.int32, device="cuda").to(torch.int16)
    x = x.view(torch.bfloat16).reshape(256, 256)
    for xx in (x, x.flip(0).contiguous(), x.t().contiguous()):
        for scale in (1.0, 2.0**-120, 2.0**100, 3.0, float("inf"), 0.0):
            _compare(monkeypatch, xx, dtype, _f32(scale), _f32(0.0), dual)


@_SKIP_GPU
@pytest.mark.parametrize("dual", [False, True], ids=["plain", "dual"])
def test_twd_cuda_all_special(monkeypatch, dual):
    for v in (float("nan"), float("inf"), float("-inf"), 0.0, -0.0):
        x = torch.full((256, 384), v, dtype=torch.bfloat16, device="cuda")
        _compare(monkeypatch, x, E4M3, _f32(1.0), _f32(0.0), dual)
        _compare(monkeypatch, x, E4M3, _f32(1.0), _f32(-1.0), dual)


@_SKIP_GPU
@pytest.mark.parametrize("dual", [False, True], ids=["plain", "dual"])
@pytest.mark.parametrize("shape", [(4096, 4096), (300, 1000), (40, 24)],
                         ids=lambda v: "x".join(map(str, v)))  # fmt: skip
def test_twd_cuda_store_false(monkeypatch, shape, dual):
    for special in (False, True):
        x = _input(*shape, special)
        _compare(monkeypatch, x, E4M3, _f32(1.0), _f32(0.0), dual, store=False)
        _compare(monkeypatch, x, E4M3, _f32(1.0), _f32(0.5), dual, store=False)


@_SKIP_GPU
@pytest.mark.parametrize("dual", [False, True], ids=["plain", "dual"])
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_twd_cuda_guard(monkeypatch, dtype, dual):
    """The guard kernel (Triton) follows the CUDA cast: not firing, and firing (the given scale
    saturates: everything re-cast with the recorded amax's scale)."""
    x = _input(1000, 2048, True)
    for scale in (1.0, 1e6):
        for margin in (0, 2):
            _compare(monkeypatch, x, dtype, _f32(scale), _f32(0.0), dual, guard=margin)


@_SKIP_GPU
@pytest.mark.parametrize("shape", [(0, 256), (128, 0), (0, 0)])
@pytest.mark.parametrize("dual", [False, True], ids=["plain", "dual"])
def test_twd_cuda_zero_size(monkeypatch, shape, dual):
    x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    _compare(monkeypatch, x, E4M3, _f32(4.0), _f32(0.25), dual)
    _compare(monkeypatch, x, E4M3, _f32(4.0), _f32(0.25), dual, store=False)


@_SKIP_GPU
@pytest.mark.parametrize("dual", [False, True], ids=["plain", "dual"])
def test_twd_cuda_accumulates(monkeypatch, dual):
    """Repeated calls on one slot: max over every call (growing and shrinking inputs)."""
    xs = [_input(512, 1024, False) * f for f in (1.0, 4.0, 0.25, 8.0)]
    amaxes = {}
    for v in (0, None):
        _knob(monkeypatch, v)
        amax = _f32(0.0)
        seen = []
        for x in xs:
            quant_tensorwise_delayed(x, E4M3, _f32(1.0), amax, dual)
            seen.append(amax.clone())
        amaxes[v] = torch.cat(seen)
    expect = torch.cummax(torch.stack([x.float().abs().max() for x in xs]), 0).values
    assert torch.equal(amaxes[0], expect.to(amaxes[0].device))
    assert torch.equal(_bits(amaxes[None]), _bits(amaxes[0]))


@_SKIP_GPU
@pytest.mark.parametrize("dual", [False, True], ids=["plain", "dual"])
def test_twd_cuda_graph_replay(monkeypatch, dual):
    _knob(monkeypatch, None)
    x = _input(1024, 2048, False)
    scale, amax = _f32(2.0), _f32(0.0)
    quant_tensorwise_delayed(x, E4M3, scale, amax, dual)  # warm-up (compiles, caches)
    amax.zero_()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = quant_tensorwise_delayed(x, E4M3, scale, amax, dual)
    amax.zero_()
    for f, s in ((1.0, 2.0), (3.0, 0.5)):
        x.copy_(_input(1024, 2048, False) * f)
        scale.fill_(s)
        amax_before = amax.clone()
        g.replay()
        torch.cuda.synchronize()
        ref, ref_amax = _run(monkeypatch, 0, x, E4M3, scale, amax_before, dual)
        assert torch.equal(_bits(amax), _bits(ref_amax))
        for a, b in zip(out, ref, strict=True):
            assert torch.equal(_bits(a), _bits(b))


@_SKIP_GPU
def test_twd_cuda_through_scaler(monkeypatch):
    """Fp8DelayedScaler.quantize (first call: store=False, then the cast) takes the kernel by
    default (knob unset), Triton at 0; the same bits."""
    from primus_turbo.pytorch.ops.fp8_delayed import Fp8DelayedScaler

    x = _input(2048, 1024, False)
    outs = {}
    taken = []  # what quant_twd_cuda returned (True: the CUDA kernel ran)
    real = twd.quant_twd_cuda

    def spy(*args, **kwargs):
        taken.append(real(*args, **kwargs))
        return taken[-1]

    for v in (0, None):
        _knob(monkeypatch, v)
        sc = Fp8DelayedScaler(amax_history_len=4)
        taken.clear()
        with unittest.mock.patch.object(twd, "quant_twd_cuda", spy):
            a = sc.quantize(x, E4M3, dual=True)
            sc.update()
            b = sc.quantize(x * 2, E4M3, dual=True)
        assert taken == [v is None] * 3
        outs[v] = [*a, *b, sc.amax_history.clone(), sc.scale.clone()]
    for a, b in zip(outs[0], outs[None], strict=True):
        assert torch.equal(_bits(a), _bits(b))


@_SKIP_GPU
def test_twd_cuda_fallbacks(monkeypatch):
    """Inputs the kernel does not take run Triton (same results as the knob at 0)."""
    _knob(monkeypatch, None)
    base = _input(130, 1024, False)
    flat = base.reshape(-1)
    odd = flat[1 : 1 + 128 * 1024].view(128, 1024)  # contiguous, 2 bytes off a 16-byte boundary
    s, a = _f32(1.0), _f32(0.0)
    assert not twd.cuda_twd_on(odd, E4M3, s, a, False)
    assert not twd.cuda_twd_on(base.half(), E4M3, s, a, False)
    assert not twd.cuda_twd_on(_input(64, 36, False), E4M3, s, a, True)  # N % 8 != 0 (dual)
    assert twd.cuda_twd_on(_input(64, 36, False), E4M3, s, a, False)  # 2304 values: plain ok
    assert not twd.cuda_twd_on(_input(3, 5, False), E4M3, s, a, False)  # 15 values
    assert not twd.cuda_twd_on(base, E4M3, s.double(), a, False)
    assert not twd.cuda_twd_on(base, E4M3, s, torch.zeros(2, device="cuda"), False)
    assert twd.cuda_twd_on(base, E4M3, s, a, False) == 1
    with unittest.mock.patch.object(torch.compiler, "is_compiling", return_value=True):
        assert not twd.cuda_twd_on(base, E4M3, s, a, False)  # tracing keeps Triton
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not twd.cuda_twd_on(base, E4M3, s, a, False)  # the interpreter runs Triton
    monkeypatch.delenv("TRITON_INTERPRET")
    for x, dual in ((odd, False), (odd, True), (_input(64, 36, False), True),
                    (_input(3, 5, False), False)):  # fmt: skip
        _compare(monkeypatch, x, E4M3, _f32(1.0), _f32(0.0), dual)


@_SKIP_GPU
def test_twd_cuda_op_checks():
    """The op's argument checks (CUDA and Meta)."""
    from primus_turbo.build_info import native_ops

    op = native_ops().quant_tw_delayed_fp8
    for dev in ("cuda", "meta"):
        x = torch.empty(256, 128, dtype=torch.bfloat16, device=dev)
        q = torch.empty(256, 128, dtype=E4M3, device=dev)
        qt = torch.empty(128, 256, dtype=E4M3, device=dev)
        s = torch.empty(1, dtype=torch.float32, device=dev)
        if dev == "cuda":
            s.fill_(1.0)
        a, si = s.clone().zero_(), s.clone()
        op(x, s, a, q, qt, si, True, 1)
        op(x, s, a, None, None, None, True, 1)  # store=False
        with pytest.raises(RuntimeError, match="argument 'qt'"):
            op(x, s, a, q, q, si, True, 1)
        for bad in (0, 2):  # 1 is the only variant (2, streaming stores, was removed)
            with pytest.raises(RuntimeError, match="argument 'variant'"):
                op(x, s, a, q, qt, si, True, bad)
        with pytest.raises(RuntimeError, match="argument 'x'"):
            op(x.float(), s, a, q, qt, si, True, 1)
        with pytest.raises(RuntimeError, match="argument 'amax'"):
            op(x, s, a.double(), q, qt, si, True, 1)


def test_twd_cuda_knob(monkeypatch):
    monkeypatch.delenv(KNOB, raising=False)
    assert twd.cuda_twd_variant() == 1  # the default: the CUDA kernel
    for raw, v in (("0", 0), ("1", 1), (" 1 ", 1), ("", 1)):
        monkeypatch.setenv(KNOB, raw)
        assert twd.cuda_twd_variant() == v
    for raw in ("2", "t"):  # 2 (streaming stores) was removed: refused like any unknown value
        monkeypatch.setenv(KNOB, raw)
        with pytest.raises(ValueError, match=KNOB):
            twd.cuda_twd_variant()
    monkeypatch.delenv(KNOB)  # CPU tensors never take the kernel
    x = torch.randn(16, 16).to(torch.bfloat16)
    s = torch.ones(1)
    assert twd.cuda_twd_on(x, E4M3, s, s, True) == 0
