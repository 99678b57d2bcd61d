"""FP8 grouped GEMM on pre-quantized weights (``QuantizedTensor`` / ``QuantizedTensorPair``,
``quantize_grouped_weight``) and ``GroupedLinear``'s fp8 mode with its weight cache: outputs and
gradients bitwise equal to the quantize-in-op path, recipe mismatches rejected, autograd,
torch.compile, CUDA-graph capture (GPU)."""

from __future__ import annotations

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager, PrecisionType
from primus_turbo.pytorch.core.low_precision import (
    Float8QuantConfig,
    Format,
    ScalingGranularity,
    fp8_dtype_for_format,
)
from primus_turbo.pytorch.core.quantized_tensor import QuantizedTensor, QuantizedTensorPair
from primus_turbo.pytorch.modules import GroupedLinear
from primus_turbo.pytorch.ops.grouped_gemm_fp8 import quantize_grouped_weight
from primus_turbo.pytorch.reference import grouped_gemm_ref
from tests.pytorch.test_utils import rand, snr_db

pytestmark = pytest.mark.grouped_gemm

ROW, TENSOR = ScalingGranularity.ROWWISE, ScalingGranularity.TENSORWISE
_OP = "primus_turbo.pytorch.ops.grouped_gemm_fp8"


def _set_mode(monkeypatch, dgrad: str):
    import importlib

    mod = importlib.import_module(_OP)
    monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_FP8_DGRAD", dgrad)
    mod._mode.cache_clear()
    return mod


def _pin(backend: BackendType) -> None:
    GlobalBackendManager.set_grouped_gemm_backend(backend, precision=PrecisionType.FP8)


def _inputs(lens, k, n, trans_b, device):
    gl = torch.tensor(lens, dtype=torch.int64, device=device)
    a = rand(sum(lens), k, dtype=torch.bfloat16, device=device, requires_grad=True)
    shape = (len(lens), n, k) if trans_b else (len(lens), k, n)
    b = rand(*shape, dtype=torch.bfloat16, device=device, requires_grad=True)
    grad = rand(sum(lens), n, dtype=torch.bfloat16, device=device)
    return a, b, gl, grad


def _run(a, b_arg, gl, grad, trans_b, cfg, leaves):
    out = turbo.ops.grouped_gemm_fp8(a, b_arg, gl, trans_b=trans_b, config=cfg)
    out.backward(grad)
    grads = [t.grad for t in leaves]
    for t in leaves:
        t.grad = None
    return out.detach(), grads


def _same(x, y):
    return x is None and y is None or torch.equal(x, y)


def _compare(lens, k, n, trans_b, gran, fmt, device):
    """Pre-quantized (pair with and without the dgrad copy) vs the in-op quantization."""
    cfg = Float8QuantConfig(format=fmt, granularity=gran)
    a, b, gl, grad = _inputs(lens, k, n, trans_b, device)
    want, (ga, gb) = _run(a, b, gl, grad, trans_b, cfg, (a, b))
    for with_dgrad in (True, False):
        qb = quantize_grouped_weight(b, cfg, trans_b=trans_b, with_dgrad=with_dgrad)
        assert qb.source is b and (qb.data_t is not None) == with_dgrad
        got, (ga2, gb2) = _run(a, qb, gl, grad, trans_b, cfg, (a, b))
        assert torch.equal(got, want), (with_dgrad, "out")
        assert torch.equal(ga2, ga), (with_dgrad, "da")
        assert torch.equal(gb2, gb), (with_dgrad, "db")
    # a bare QuantizedTensor (no pair) behaves as the pair without data_t
    got, (ga2, gb2) = _run(a, qb.data, gl, grad, trans_b, cfg, (a, b))
    assert torch.equal(got, want) and torch.equal(ga2, ga) and torch.equal(gb2, gb)
    # pre-quantized activations too (rowwise along K / tensorwise), gradients to their source
    qa = QuantizedTensor.quantize(a, fp8_dtype_for_format(fmt, device), gran, axis=1)
    assert qa.source is a
    for b_arg in (b, qb):
        got, (ga2, gb2) = _run(qa, b_arg, gl, grad, trans_b, cfg, (a, b))
        assert torch.equal(got, want) and torch.equal(ga2, ga) and torch.equal(gb2, gb)


@pytest.mark.parametrize(
    "trans_b,gran,backend",
    [(True, ROW, BackendType.TRITON), (False, TENSOR, BackendType.TRITON),
     (False, ROW, BackendType.TORCH), (True, TENSOR, BackendType.TORCH)],
    ids=["NT-ROWWISE-TRITON", "NN-TENSORWISE-TRITON", "NN-ROWWISE-TORCH", "NT-TENSORWISE-TORCH"],
)  # fmt: skip
def test_prequant_bitwise(trans_b, gran, backend, device):
    _pin(backend)
    _compare([5, 0, 11], 32, 24, trans_b, gran, Format.E4M3, device)


def test_prequant_bitwise_torch_hybrid(device):
    """TORCH backend, HYBRID (E4M3 forward copy, E5M2 dgrad copy)."""
    _pin(BackendType.TORCH)
    _compare([7, 0, 9], 48, 16, True, ROW, Format.HYBRID, device)
    w = rand(2, 16, 48, dtype=torch.bfloat16, device=device)
    qb = quantize_grouped_weight(w, Float8QuantConfig(format=Format.HYBRID, granularity=ROW))
    assert qb.data.real_dtype == fp8_dtype_for_format(Format.E4M3, device)
    assert qb.data_t.real_dtype == fp8_dtype_for_format(Format.E5M2, device)


def test_prequant_dgrad_hp_mode(monkeypatch, device):
    """``PRIMUS_TURBO_GROUPED_GEMM_FP8_DGRAD=hp``: the dgrad on the source in high precision,
    equal to the in-op path."""
    mod = _set_mode(monkeypatch, "hp")
    try:
        _pin(BackendType.TORCH)
        _compare([4, 6], 32, 16, True, ROW, Format.E4M3, device)
    finally:
        mod._mode.cache_clear()


@pytest.mark.parametrize("dgrad", ["fp8", "hp"])
def test_prequant_without_source(dgrad, monkeypatch, device):
    """Weights quantized without a source (inference-style, or a frozen fp8 copy): no weight
    gradient; the dgrad from ``data_t``, else from the dequantized forward copy (re-quantized
    along N for ``fp8``); all close to the fp32 reference of the dequantized weights."""
    mod = _set_mode(monkeypatch, dgrad)
    try:
        _pin(BackendType.TORCH)
        cfg = Float8QuantConfig(granularity=ROW)
        a, b, gl, grad = _inputs([9, 0, 14], 64, 32, True, device)
        for with_dgrad in (True, False):
            qb = quantize_grouped_weight(b, cfg, with_dgrad=with_dgrad, keep_source=False)
            assert qb.source is None
            out, (ga,) = _run(a, qb, gl, grad, True, cfg, (a,))
            assert b.grad is None
            a_ref = a.detach().float().requires_grad_()
            ref = grouped_gemm_ref(a_ref, qb.data.dequantize(torch.float32), gl.cpu(), True,
                                   torch.float32)  # fmt: skip
            ref.backward(grad.float())
            assert snr_db(ref.detach().cpu(), out.float().cpu()) > 25
            assert snr_db(a_ref.grad.cpu(), ga.float().cpu()) > 25
    finally:
        mod._mode.cache_clear()


def test_prequant_activation_without_source(device):
    """Activations quantized without a source: no input gradient, the weight gradient from
    the dequantized fp8 activations (close to the fp32 reference on them)."""
    _pin(BackendType.TORCH)
    cfg = Float8QuantConfig(granularity=ROW)
    a, b, gl, grad = _inputs([9, 0, 14], 64, 32, True, device)
    f8 = fp8_dtype_for_format(Format.E4M3, device)
    qa = QuantizedTensor.quantize(a, f8, ROW, axis=1, keep_source=False)
    out, (gb,) = _run(qa, b, gl, grad, True, cfg, (b,))
    assert a.grad is None and out.dtype == torch.bfloat16
    a_ref = qa.dequantize(torch.float32)
    b_ref = b.detach().float().requires_grad_()
    ref = grouped_gemm_ref(a_ref, b_ref, gl.cpu(), True, torch.float32)
    ref.backward(grad.float())
    assert snr_db(ref.detach().cpu(), out.float().cpu()) > 25
    assert snr_db(b_ref.grad.cpu(), gb.float().cpu()) > 25


def test_prequant_recipe_mismatch(device):
    """Pre-quantized weights that do not match the op's recipe raise clear errors."""
    e4m3 = Float8QuantConfig(granularity=ROW)
    a, b, gl, _ = _inputs([3, 5], 32, 16, True, device)
    f8, f5 = fp8_dtype_for_format(Format.E4M3, device), fp8_dtype_for_format(Format.E5M2, device)
    op = turbo.ops.grouped_gemm_fp8
    with pytest.raises(TypeError, match=r"argument 'b' expected fp8 data of dtype"):
        op(a, QuantizedTensor.quantize(b, f5, ROW, axis=2), gl, config=e4m3)
    with pytest.raises(ValueError, match=r"argument 'b' expected ROWWISE scaling"):
        op(a, QuantizedTensor.quantize(b, f8, TENSOR, axis=2), gl, config=e4m3)
    with pytest.raises(ValueError, match=r"ROWWISE scales along axis 2"):
        op(a, QuantizedTensor.quantize(b, f8, ROW, axis=1), gl, config=e4m3)
    with pytest.raises(ValueError, match=r"ROWWISE scales along axis 1"):  # NN wants K = axis 1
        op(a, QuantizedTensor.quantize(b, f8, ROW, axis=2), gl, trans_b=False, config=e4m3)
    bad_t = QuantizedTensorPair(QuantizedTensor.quantize(b, f8, ROW, axis=2),
                                QuantizedTensor.quantize(b, f5, ROW, axis=1))  # fmt: skip
    with pytest.raises(TypeError, match=r"argument 'b.data_t' expected fp8 data"):
        op(a, bad_t, gl, config=e4m3)
    wrong_k = quantize_grouped_weight(rand(2, 16, 48, dtype=torch.bfloat16, device=device), e4m3)
    with pytest.raises(ValueError, match=r"reduction size K=32"):
        op(a, wrong_k, gl, config=e4m3)
    with pytest.raises(ValueError, match=r"argument 'a' expected ROWWISE scales along axis 1"):
        op(QuantizedTensor.quantize(a, f8, ROW, axis=0), b, gl, config=e4m3)
    with pytest.raises(TypeError, match=r"argument 'a' expected fp8 data of dtype"):
        op(QuantizedTensor.quantize(a, f5, ROW, axis=1), b, gl, config=e4m3)
    with pytest.raises(NotImplementedError, match="BLOCKWISE"):
        QuantizedTensor.quantize(b, f8, ScalingGranularity.BLOCKWISE)
    with pytest.raises(TypeError, match="an fp8 dtype"):
        QuantizedTensor.quantize(b, torch.bfloat16, ROW)
    with pytest.raises(ValueError, match="data_t"):
        QuantizedTensorPair(QuantizedTensor.quantize(b, f8, ROW),
                            QuantizedTensor.quantize(b[:1], f8, ROW))  # fmt: skip


def test_quantized_tensor_layout_and_dequantize(device):
    """Scales keep the source's shape with size 1 along the scaled axis; ``qdata`` is stored
    with that axis innermost; dequantize is close to the source."""
    x = rand(3, 20, 12, dtype=torch.bfloat16, device=device, requires_grad=True)
    f8 = fp8_dtype_for_format(Format.E4M3, device)
    q = QuantizedTensor.quantize(x, f8, ROW, axis=1)
    assert q.shape == x.shape and q.scale_inv.shape == (3, 1, 12) and q.quantized_axis == 1
    assert q.qdata.transpose(1, 2).is_contiguous() and q.source is x and q.dtype == torch.bfloat16
    assert snr_db(x.detach().float().cpu(), q.dequantize(torch.float32).cpu()) > 25
    t = QuantizedTensor.quantize(x, f8, TENSOR, keep_source=False)
    assert t.scale_inv.dim() == 0 and t.source is None and "TENSORWISE" in repr(t)
    assert t.dequantize().dtype == torch.bfloat16


def test_prequant_compile(device):
    """Under torch.compile the op (dynamo-disabled) runs eagerly on the pre-quantized operand:
    bitwise equal to eager."""
    _pin(BackendType.TORCH)
    cfg = Float8QuantConfig(granularity=ROW)
    a, b, gl, _ = _inputs([3, 0, 6], 32, 16, True, device)
    qb = quantize_grouped_weight(b, cfg)

    def f(x):
        return turbo.ops.grouped_gemm_fp8(x * 2, qb, gl, config=cfg) + 1

    with torch.no_grad():
        assert torch.equal(torch.compile(f)(a), f(a))


def _linear(device, cache: bool, dtype=torch.bfloat16):
    torch.manual_seed(0)
    cfg = Float8QuantConfig(granularity=ROW)
    return GroupedLinear(3, 32, 24, device=device, dtype=dtype, fp8_config=cfg,
                         fp8_weight_cache=cache)  # fmt: skip


def test_grouped_linear_fp8_cache(monkeypatch, device):
    """``GroupedLinear(fp8_config, fp8_weight_cache=True)``: the weight is quantized once across
    micro-batches, again after an optimizer step or an in-place change; outputs and gradients
    equal the uncached module's."""
    _pin(BackendType.TORCH)
    _check_linear_cache(monkeypatch, device)


def _check_linear_cache(monkeypatch, device):
    from primus_turbo.pytorch.modules import grouped_linear as gl_mod

    calls = []
    real = gl_mod.quantize_grouped_weight
    monkeypatch.setattr(gl_mod, "quantize_grouped_weight",
                        lambda *a, **k: calls.append(1) or real(*a, **k))  # fmt: skip
    cached, plain = _linear(device, True), _linear(device, False)
    assert torch.equal(cached.weight, plain.weight) and "fp8_weight_cache=True" in repr(cached)
    lens = torch.tensor([5, 0, 7], device=device)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (cached, plain)]

    def micro_batch(seed):
        torch.manual_seed(seed)
        x = rand(12, 32, dtype=torch.bfloat16, device=device)
        g = rand(12, 24, dtype=torch.bfloat16, device=device)
        outs = []
        for m in (cached, plain):
            xi = x.clone().requires_grad_()
            out = m(xi, lens)
            out.backward(g)
            outs.append((out.detach(), xi.grad))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])

    micro_batch(1)
    micro_batch(2)  # gradient accumulation: the cached copies are reused
    assert len(calls) == 1
    assert torch.equal(cached.weight.grad, plain.weight.grad)
    for opt in reversed(opts):  # the cached module's optimizer last (another one marks it stale)
        opt.step()
        opt.zero_grad()
    assert len(calls) == 2  # refreshed eagerly by its optimizer's step
    micro_batch(3)  # reused
    assert len(calls) == 2
    with torch.no_grad():
        for m in (cached, plain):
            m.weight.mul_(0.5)  # in-place: version counter
    micro_batch(4)
    assert len(calls) == 3
    with torch.no_grad():  # inference: the forward copy is enough, the training one is reused
        cached(rand(12, 32, dtype=torch.bfloat16, device=device), lens)
    assert len(calls) == 3


def test_grouped_linear_fp8_compile_and_args(device):
    _pin(BackendType.TORCH)
    m = _linear(device, True)
    lens = torch.tensor([4, 4, 0], device=device)
    x = rand(8, 32, dtype=torch.bfloat16, device=device)
    with torch.no_grad():
        assert torch.equal(torch.compile(m)(x, lens), m(x, lens))
    with pytest.raises(ValueError, match="fp8_weight_cache"):
        GroupedLinear(2, 8, 8, fp8_weight_cache=True)
    with pytest.raises(TypeError, match="fp8_config"):
        GroupedLinear(2, 8, 8, fp8_config="rowwise")


@pytest.mark.gpu
@pytest.mark.parametrize("gran", [ROW, TENSOR], ids=lambda g: g.name)
def test_prequant_gpu_shapes(gran, device):
    """Qwen3-like experts (G=16, ragged, K=768, N=2048; empty groups) on the default backend:
    bitwise equal to the in-op path; the pre-quantized forward captured in a CUDA graph
    replays with the same result (the weights are not in the graph)."""
    cfg = Float8QuantConfig(granularity=gran)
    lens = [512, 0, 1000, 3, 700, 129, 0, 511, 513, 64, 900, 1, 0, 300, 2048, 256]
    _compare(lens, 768, 2048, True, gran, Format.E4M3, device)
    a, b, gl, _ = _inputs(lens, 768, 2048, True, device)
    qb = quantize_grouped_weight(b, cfg)
    with torch.no_grad():
        want = turbo.ops.grouped_gemm_fp8(a, b, gl, config=cfg)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            turbo.ops.grouped_gemm_fp8(a, qb, gl, config=cfg)  # warm-up off the default stream
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                captured = turbo.ops.grouped_gemm_fp8(a, qb, gl, config=cfg)
        torch.cuda.current_stream().wait_stream(stream)
        captured.zero_()
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(captured, want)


@pytest.mark.gpu
def test_grouped_linear_fp8_cache_gpu(monkeypatch, device):
    """The same on the default GPU backend."""
    _check_linear_cache(monkeypatch, device)
