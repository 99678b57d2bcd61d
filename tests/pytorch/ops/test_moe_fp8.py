"""FP8 activations upstream of the MoE expert GEMMs: the fp8 permute (tokens quantized before
the permutation, moved with their scales), SwiGLU/GeGLU fused with rowwise quantization, the
grad-only (gradient sink) source of a pre-quantized ``a`` in ``grouped_gemm_fp8``, and the
MoE layer's ``fp8_act="fused"`` mode.

The fused paths must be bitwise equal to quantizing after the unfused op (rowwise scales along
the row do not depend on the row order); gradients equal the unfused ones where they use the
same inputs (the input gradients) and pass SNR gates vs the fp32 reference where they use the
dequantized fp8 activations (the expert weight gradients)."""

from __future__ import annotations

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import (
    Float8QuantConfig,
    ScalingGranularity,
    fp8_dtype_for_format,
)
from primus_turbo.pytorch.ops.activation import (
    geglu_with_probs,
    geglu_with_probs_fp8,
    swiglu_with_probs,
    swiglu_with_probs_fp8,
)
from primus_turbo.pytorch.ops.moe import moe_permute
from primus_turbo.pytorch.ops.moe_fp8 import moe_quantize_permute_fp8
from primus_turbo.pytorch.ops.quantization import quantize_fp8
from primus_turbo.pytorch.reference.moe import moe_layer_ref
from tests.pytorch.test_utils import same_bits, snr_db

pytestmark = pytest.mark.moe

ROW = ScalingGranularity.ROWWISE


def _fp8(device) -> torch.dtype:
    return fp8_dtype_for_format(Float8QuantConfig().format, torch.device(device))


def _quant_rows(y: torch.Tensor, dtype):
    q, s = quantize_fp8(y.detach(), dtype, ROW, axis=-1)
    return q, s.reshape(-1, 1)


# ---- SwiGLU / GeGLU fused with the rowwise quantization ----------------------------------------


@pytest.mark.parametrize("act", ["swiglu", "geglu"])
@pytest.mark.parametrize("t,h,probs", [(5, 24, True), (3, 7, False), (1, 1, True), (0, 8, True)])
def test_glu_fp8_bitwise(act, t, h, probs, device):
    """q and scales bitwise equal to quantizing the unfused output; x/probs gradients bitwise
    equal to the unfused backward (the sink's gradient is the output gradient)."""
    fused, plain = (
        (swiglu_with_probs_fp8, swiglu_with_probs)
        if act == "swiglu"
        else (geglu_with_probs_fp8, geglu_with_probs)
    )
    dt = _fp8(device)
    x = (torch.randn(t, 2 * h, device=device) * 3).to(torch.bfloat16).requires_grad_()
    p = torch.rand(t, device=device, requires_grad=True) if probs else None
    x2 = x.detach().clone().requires_grad_()
    p2 = p.detach().clone().requires_grad_() if probs else None
    qt = fused(x, p, dt)
    y = plain(x2, p2) if probs else plain(x2, torch.ones(t, device=device))
    q, s = _quant_rows(y, dt)
    assert qt.qdata.dtype == dt and qt.grad_only and qt.scale_inv.shape == (t, 1)
    assert same_bits(qt.qdata, q)
    if t:
        assert torch.equal(qt.scale_inv, s)
    if t:
        g = torch.randn(t, h, device=device, dtype=torch.bfloat16)
        torch.autograd.backward([qt.source], [g])
        y.backward(g)
        assert same_bits(x.grad, x2.grad)
        if probs:
            assert torch.equal(p.grad, p2.grad)


def test_glu_fp8_bad_inputs(device):
    x = torch.randn(4, 8, device=device, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="swiglu_with_probs_fp8.*'dtype'"):
        swiglu_with_probs_fp8(x, None, torch.bfloat16)
    with pytest.raises(ValueError, match="swiglu_with_probs_fp8.*'x'.*even"):
        swiglu_with_probs_fp8(x[:, :7], None, _fp8(device))
    with pytest.raises(ValueError, match="swiglu_with_probs_fp8.*'probs'"):
        swiglu_with_probs_fp8(x, torch.rand(3, device=device), _fp8(device))
    with pytest.raises(TypeError, match="swiglu_with_probs_fp8.*'x'"):
        swiglu_with_probs_fp8(x.float(), None, _fp8(device))


# ---- fp8 permute -------------------------------------------------------------------------------


def _ids(t, k, e, drop=False):
    idx = torch.stack([torch.randperm(e)[:k] for _ in range(t)]) if t else torch.zeros(0, k)
    idx = idx.to(torch.int64)
    if drop and t:
        idx[0, 0] = -1  # a dropped copy
    return idx


@pytest.mark.parametrize("impl", ["v2", "v1"])
@pytest.mark.parametrize(
    "t,h,e,k,pad,drop",
    [
        (6, 20, 4, 2, 0, False),
        (5, 9, 3, 3, 0, True),
        (4, 16, 4, 1, 4, False),
        (0, 8, 2, 2, 0, False),
    ],
)
def test_moe_permute_fp8_bitwise(impl, t, h, e, k, pad, drop, device, monkeypatch):
    """Quantize-then-permute == permute-then-quantize, bitwise (data, scales; padding rows:
    zero data, scale 0 vs amax 1e-12 when quantized after: compared on routed rows only); maps
    and permuted probs equal; probs and tokens gradients (through the sink) equal."""
    monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_IMPL", impl)
    dt = _fp8(device)
    x = torch.randn(t, h, device=device).to(torch.bfloat16).requires_grad_()
    idx = _ids(t, k, e, drop).to(device)
    probs = torch.rand(t, k, device=device, requires_grad=True)
    kw = {"num_local_experts": e, "pad_multiple": pad}
    num = t * k + e * pad if pad else -1
    a, rm, tpe, pp = moe_quantize_permute_fp8(
        x, idx, dtype=dt, probs=probs, num_permuted_tokens=num, **kw
    )
    x2 = x.detach().clone().requires_grad_()
    p2 = probs.detach().clone().requires_grad_()
    perm, rm2, tpe2, *_, pp2 = moe_permute(x2, idx, probs=p2, num_permuted_tokens=num, **kw)
    q, s = _quant_rows(perm, dt)
    assert torch.equal(rm, rm2) and torch.equal(tpe, tpe2) and torch.equal(pp, pp2)
    routed = torch.zeros(perm.shape[0], dtype=torch.bool, device=device)
    routed[rm[rm >= 0]] = True
    assert same_bits(a.qdata, q) or torch.equal(
        a.qdata.view(torch.uint8)[routed], q.view(torch.uint8)[routed]
    )
    assert torch.equal(a.scale_inv[routed], s[routed])
    assert not (a.qdata.view(torch.uint8)[~routed]).any()
    if t:
        g = torch.randn(perm.shape, device=device, dtype=torch.bfloat16)
        gp = torch.randn(pp.shape, device=device)
        torch.autograd.backward([a.source, pp], [g, gp])
        torch.autograd.backward([perm, pp2], [g, gp])
        assert same_bits(x.grad, x2.grad) and torch.equal(probs.grad, p2.grad)


def test_moe_permute_fp8_api(device):
    """``moe_permute(use_fp8=True)`` with ``[T, S]`` scales and a bool routing map; tokens fp8."""
    t, h, e, k, s_per = 5, 16, 4, 2, 3
    dt = _fp8(device)
    q = torch.randn(t, h, device=device).to(dt)
    sc = torch.rand(t, s_per, device=device) + 0.5
    idx = _ids(t, k, e).to(device)
    rmap = torch.zeros(t, e, dtype=torch.bool, device=device).scatter(1, idx, True)
    out = moe_permute(q, rmap, num_local_experts=e, num_topk=k, scaling_factor=sc,
                      scales_per_token=s_per, use_fp8=True)  # fmt: skip
    perm, row_map, _, _, _, psc, _ = out
    assert perm.dtype == dt and psc.shape == (t * k, s_per)
    for tok in range(t):
        for j in range(k):
            r = int(row_map[tok, j])
            assert torch.equal(perm[r].view(torch.uint8), q[tok].view(torch.uint8))
            assert torch.equal(psc[r], sc[tok])


def test_moe_permute_fp8_bad_inputs(device):
    t, h, e = 4, 8, 2
    idx = _ids(t, 1, e).to(device)
    x = torch.randn(t, h, device=device, dtype=torch.bfloat16)
    q = x.to(_fp8(device))
    s = torch.rand(t, device=device)
    with pytest.raises(TypeError, match="moe_permute.*'tokens'.*fp8"):
        moe_permute(x, idx, num_local_experts=e, scaling_factor=s, use_fp8=True)
    with pytest.raises(ValueError, match="moe_permute.*'scaling_factor'"):
        moe_permute(q, idx, num_local_experts=e, use_fp8=True)
    with pytest.raises(ValueError, match="moe_permute.*'scaling_factor'.*shape"):
        moe_permute(q, idx, num_local_experts=e, scaling_factor=s[:3], use_fp8=True)
    with pytest.raises(TypeError, match="moe_permute.*'scaling_factor'"):
        moe_permute(q, idx, num_local_experts=e, scaling_factor=s.double(), use_fp8=True)
    with pytest.raises(ValueError, match="moe_permute.*'scaling_factor'.*use_fp8=False"):
        moe_permute(x, idx, num_local_experts=e, scaling_factor=s)
    with pytest.raises(TypeError, match="moe_permute.*'tokens'"):
        moe_permute(q, idx, num_local_experts=e)  # fp8 rows need use_fp8=True
    with pytest.raises(TypeError, match="moe_quantize_permute_fp8.*'dtype'"):
        moe_quantize_permute_fp8(x, idx, num_local_experts=e, dtype=torch.bfloat16)


# ---- grouped_gemm_fp8 with a grad-only source ------------------------------------------------


def test_grouped_gemm_fp8_grad_only_source(device):
    """A pre-quantized ``a`` whose source is a gradient sink: the forward and the input gradient
    equal those with the real bf16 source; the weight gradient is the one of the dequantized
    fp8 ``a`` (equal to passing the dequantized values as the source)."""
    from primus_turbo.pytorch.core.quantized_tensor import QuantizedTensor
    from primus_turbo.pytorch.ops.activation import grad_sink
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import grouped_gemm_fp8

    cfg = Float8QuantConfig(granularity=ROW)
    dt = _fp8(device)
    m, k, n, g = 12, 32, 16, 3
    lens = torch.tensor([5, 0, 7], device=device)
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(g, n, k, device=device, dtype=torch.bfloat16)
    qa = QuantizedTensor.quantize(a, dt, ROW, axis=1)
    deq = qa.dequantize().requires_grad_()
    outs = []
    for src, grad_only in ((grad_sink(a, (m, k)).requires_grad_(), True), (deq, False)):
        bb = b.clone().requires_grad_()
        qx = QuantizedTensor(qa.qdata, qa.scale_inv, a.dtype, ROW, 1, src, grad_only)
        y = grouped_gemm_fp8(qx, bb, lens, config=cfg)
        gy = torch.ones_like(y)
        ga, gb = torch.autograd.grad(y, (src, bb), gy)
        outs.append((y, ga, gb))
    (y1, ga1, gb1), (y2, ga2, gb2) = outs
    assert same_bits(y1, y2) and torch.equal(ga1, ga2) and torch.equal(gb1, gb2)


# ---- the MoE layer -----------------------------------------------------------------------------


def _layer_pair(d, f, e, k, device, fn="softmax", groups=1, sel=1):
    cfg = Float8QuantConfig(granularity=ROW)
    layers = []
    for act, cache in (("op", False), ("fused", True)):
        torch.manual_seed(0)
        layers.append(turbo.modules.MoELayer(
            d, f, e, k, score_function=fn, groups=groups, selected_groups=sel, fp8_config=cfg,
            device=device, dtype=torch.bfloat16, fp8_act=act, fp8_weight_cache=cache,
        ))  # fmt: skip
    return layers


def _run_layer_pair(t, d, f, e, k, device, **kw):
    """The fused layer vs the per-op one (same parameters): forward, input and router
    gradients bitwise equal; every gradient vs the fp32 loop reference above 20 dB."""
    op_l, fu_l = _layer_pair(d, f, e, k, device, **kw)
    torch.manual_seed(1)
    x = torch.randn(t, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    out, out2 = op_l(x), fu_l(x2)
    g = torch.randn_like(out)
    out.backward(g)
    out2.backward(g)
    assert same_bits(out, out2)
    assert same_bits(x.grad, x2.grad)
    assert torch.equal(op_l.router_weight.grad, fu_l.router_weight.grad)
    ref_params = [p.detach().float().requires_grad_() for p in fu_l.parameters()]
    x_ref = x.detach().float().requires_grad_()
    ref = moe_layer_ref(x_ref, *ref_params, k, kw.get("fn", "softmax"), kw.get("groups", 1),
                        kw.get("sel", 1))  # fmt: skip
    ref.backward(g.float())
    assert snr_db(ref.detach(), out2.detach().float()) > 20
    assert snr_db(x_ref.grad, x2.grad.float()) > 20
    # expert weight grads: > 20 dB; the router's (through the probs gradient, behind two fp8
    # GEMMs' rounding and a softmax/sigmoid) is equal to the "op" layer's bitwise (above), so
    # its gate only guards gross errors
    for rp, p, gate in zip(ref_params, fu_l.parameters(), (15, 20, 20), strict=True):
        assert snr_db(rp.grad, p.grad.float()) > gate, p.shape
    return fu_l


def test_moe_layer_fp8_fused(device):
    _run_layer_pair(8, 32, 16, 4, 2, device)


def test_moe_layer_fp8_weight_cache_refresh(device):
    """The cached fp8 weights are reused until an optimizer step, then re-quantized into the
    same buffers (a captured CUDA graph reads them)."""
    layer = _run_layer_pair(6, 16, 8, 2, 2, device)
    pair = layer._fp8_cached["w1"][2]
    buf, old = pair.data.qdata, pair.data.qdata.clone()
    x = torch.randn(6, 16, device=device, dtype=torch.bfloat16)
    layer(x).sum().backward()
    assert layer._fp8_cached["w1"][2] is pair
    opt = torch.optim.SGD(layer.parameters(), lr=1.0)
    opt.step()  # refreshed right here (eager, in place), before any forward
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import quantize_grouped_weight as qgw

    assert same_bits(pair.data.qdata, qgw(layer.w1.detach(), layer.fp8_config).data.qdata)
    layer(x)
    pair2 = layer._fp8_cached["w1"][2]
    assert pair2 is pair and pair2.data.qdata.data_ptr() == buf.data_ptr()
    assert not torch.equal(pair2.data.qdata.view(torch.uint8), old.view(torch.uint8))
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import quantize_grouped_weight

    want = quantize_grouped_weight(layer.w1.detach(), layer.fp8_config)
    assert same_bits(pair2.data.qdata, want.data.qdata)
    layer.refresh_fp8_weights()
    assert layer._fp8_cached["w1"][2] is pair


def test_moe_layer_fp8_act_bad_inputs(monkeypatch):
    tw = Float8QuantConfig(granularity=ScalingGranularity.TENSORWISE)
    with pytest.raises(ValueError, match="MoELayer.*'fp8_act'"):
        turbo.modules.MoELayer(8, 4, 2, 1, fp8_config=tw, fp8_act="fused")
    with pytest.raises(ValueError, match="MoELayer.*'fp8_act'"):
        turbo.modules.MoELayer(8, 4, 2, 1, fp8_config=tw, fp8_act="early")
    with pytest.raises(ValueError, match="MoELayer.*'fp8_weight_cache'"):
        turbo.modules.MoELayer(8, 4, 2, 1, fp8_weight_cache=True)
    with pytest.raises(TypeError, match="MoELayer.*'fp8_weight_cache'"):
        turbo.modules.MoELayer(8, 4, 2, 1, fp8_config=tw, fp8_weight_cache="on")
    row = Float8QuantConfig(granularity=ROW)
    monkeypatch.delenv("PRIMUS_TURBO_MOE_FP8_ACT", raising=False)  # defaults: the measured winners
    layer = turbo.modules.MoELayer(8, 4, 2, 1, fp8_config=row)
    assert layer.fp8_act == "fused" and layer.fp8_weight_cache is True
    assert turbo.modules.MoELayer(8, 4, 2, 1, fp8_config=tw).fp8_act == "op"
    monkeypatch.setenv("PRIMUS_TURBO_MOE_FP8_ACT", "op")
    assert turbo.modules.MoELayer(8, 4, 2, 1, fp8_config=row).fp8_act == "op"
    monkeypatch.setenv("PRIMUS_TURBO_MOE_FP8_ACT", "fused")
    assert turbo.modules.MoELayer(8, 4, 2, 1, fp8_config=tw).fp8_act == "op"  # TENSORWISE
    assert turbo.modules.MoELayer(8, 4, 2, 1, fp8_config=row).fp8_act == "fused"
    monkeypatch.setenv("PRIMUS_TURBO_MOE_FP8_ACT", "bogus")
    with pytest.raises(ValueError, match="PRIMUS_TURBO_MOE_FP8_ACT"):
        turbo.modules.MoELayer(8, 4, 2, 1, fp8_config=row)


def test_moe_layer_fp8_default_cache(device):
    """Defaults (fused activations, weight cache on): the cache is filled by a forward and
    reused until an optimizer step; outputs equal the uncached layer (cache off: empty)."""
    row = Float8QuantConfig(granularity=ROW)
    layers = []
    for cache in (None, False):
        torch.manual_seed(0)
        layers.append(turbo.modules.MoELayer(
            16, 8, 2, 2, fp8_config=row, device=device, dtype=torch.bfloat16,
            fp8_weight_cache=cache,
        ))  # fmt: skip
    x = torch.randn(6, 16, device=device, dtype=torch.bfloat16)
    out, want = layers[0](x), layers[1](x)
    assert same_bits(out, want) and set(layers[0]._fp8_cached) == {"w1", "w2"}
    assert not layers[1]._fp8_cached


def test_moe_layer_fp8_fused_compile(device):
    """torch.compile (not fullgraph: the fp8 experts are a graph break) of the default fused
    layer: output and gradients bitwise equal to eager."""
    torch.manual_seed(0)
    layer = turbo.modules.MoELayer(16, 8, 4, 2, fp8_config=Float8QuantConfig(granularity=ROW),
                                   device=device, dtype=torch.bfloat16)  # fmt: skip
    assert layer.fp8_act == "fused"
    x = torch.randn(6, 16, device=device, dtype=torch.bfloat16, requires_grad=True)
    grads = []
    for fn in (layer, torch.compile(layer, backend="aot_eager")):
        torch._dynamo.reset()
        out = fn(x)
        out.float().sum().backward()
        grads.append((out.detach(), x.grad, layer.w1.grad, layer.router_weight.grad))
        x.grad = None
        layer.zero_grad(set_to_none=True)
    for a, b in zip(*grads, strict=True):
        assert same_bits(a, b)


@pytest.mark.gpu
def test_moe_layer_fp8_default_cache_graph(device):
    """The default cache is a graph input under CUDA-graph capture, refreshed in place by the
    optimizer step hook, so a replay after an optimizer step reads the new weights, bitwise as
    eager."""
    if device != "cuda":
        pytest.skip("CUDA graphs")
    torch.manual_seed(0)
    layer = turbo.modules.MoELayer(256, 128, 8, 2, fp8_config=Float8QuantConfig(granularity=ROW),
                                   device=device, dtype=torch.bfloat16)  # fmt: skip
    x = torch.randn(64, 256, device=device, dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(2):
            layer(x)
    torch.cuda.current_stream().wait_stream(side)
    assert set(layer._fp8_cached) == {"w1", "w2"}
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        out = layer(x)
    graph.replay()
    before = out.clone()
    for w in (layer.w1, layer.w2):
        w.grad = torch.randn_like(w)
    torch.optim.SGD([layer.w1, layer.w2], lr=0.5).step()
    graph.replay()
    with torch.no_grad():
        want = layer(x)
    assert not torch.equal(before, out)
    assert same_bits(out, want)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case",
    [
        (4096, 2048, 768, 32, 8, {}),  # Qwen3-30B-A3B-like (E cut)
        (2048, 2880, 2880, 8, 4, {}),  # gpt-oss-20b-like (E cut)
        (2048, 7168, 2048, 16, 8, {"fn": "sigmoid", "groups": 8, "sel": 4}),  # DeepSeek-V3-like
    ],
    ids=["qwen3", "gpt-oss", "deepseek-v3"],
)
def test_moe_layer_fp8_fused_gpu(case, device):
    if device != "cuda":
        pytest.skip("GPU shapes")
    t, d, f, e, k, kw = case
    _run_layer_pair(t, d, f, e, k, device, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "t,h,e,k", [(4096, 7168, 32, 8), (4096, 2880, 32, 4), (3001, 2048, 128, 8)]
)
def test_moe_quantize_permute_fp8_gpu(t, h, e, k, device):
    if device != "cuda":
        pytest.skip("GPU shapes")
    dt = _fp8(device)
    x = torch.randn(t, h, device=device).to(torch.bfloat16)
    idx = torch.topk(torch.rand(t, e, device=device), k, dim=1).indices
    a, rm, _, _ = moe_quantize_permute_fp8(x, idx, num_local_experts=e, dtype=dt)
    perm = moe_permute(x, idx, num_local_experts=e)[0]
    q, s = _quant_rows(perm, dt)
    assert same_bits(a.qdata, q) and torch.equal(a.scale_inv, s)
    y = torch.randn(t * k, 2 * 2048, device=device).to(torch.bfloat16)
    p = torch.rand(t * k, device=device)
    qt = swiglu_with_probs_fp8(y, p, dt)
    q2, s2 = _quant_rows(swiglu_with_probs(y, p), dt)
    assert same_bits(qt.qdata, q2) and torch.equal(qt.scale_inv, s2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m,k", [(32768, 7168), (3001, 2880), (7, 20)])
def test_dequant_rows_gpu(m, k, dtype, device):
    """The dequantization of a grad-only ``a`` for the wgrad and of source-less fp8 weights for
    the dgrad (Triton on CUDA) equals ``dequantize_fp8`` (ROWWISE, the CPU path) bitwise."""
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import _dequant_rows
    from primus_turbo.pytorch.ops.quantization import dequantize_fp8

    if device != "cuda":
        pytest.skip("the Triton dequantization runs on CUDA only")
    q = torch.randn(m, k, device=device).to(_fp8(device))
    s = torch.rand(m, device=device) * 4
    want = (q.float() * s[:, None]).to(dtype)
    assert same_bits(dequantize_fp8(q, dtype, ROW, axis=-1, scale_inv=s[:, None]), want)
    assert same_bits(_dequant_rows(q, s, dtype), want)
