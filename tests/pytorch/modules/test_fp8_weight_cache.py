"""The fp8 expert-weight cache of ``MoELayer`` / ``GroupedLinear`` (``Fp8WeightCache``): on by
default in fp8 mode, refreshed EAGERLY (in place, same buffers) by the optimizer step
post-hook, so a CUDA graph that captured the copies (forward + backward, or the whole step with
the optimizer inside) replays bitwise the eager results across optimizer steps."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity
from primus_turbo.pytorch.modules import grouped_linear as gl_mod
from primus_turbo.pytorch.ops.grouped_gemm_fp8 import quantize_grouped_weight
from tests.pytorch.test_utils import same_bits

pytestmark = pytest.mark.moe

ROW = ScalingGranularity.ROWWISE


def _layer(device, cache=None, d=16, f=8, e=2, k=2, seed=0):
    torch.manual_seed(seed)
    return turbo.modules.MoELayer(d, f, e, k, fp8_config=Float8QuantConfig(granularity=ROW),
                                  device=device, dtype=torch.bfloat16,
                                  fp8_weight_cache=cache)  # fmt: skip


def _count_quant(monkeypatch) -> list:
    calls = []
    real = gl_mod.quantize_grouped_weight
    monkeypatch.setattr(gl_mod, "quantize_grouped_weight",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))  # fmt: skip
    return calls


def _assert_fresh(layer, names=("w1", "w2")):
    """Every cached copy (forward and dgrad) equals a fresh quantization of the weight."""
    for name in names:
        pair = layer._fp8_cached[name][2]
        want = quantize_grouped_weight(getattr(layer, name).detach(), layer.fp8_config)
        assert same_bits(pair.data.qdata, want.data.qdata), name
        assert torch.equal(pair.data.scale_inv, want.data.scale_inv), name
        assert same_bits(pair.data_t.qdata, want.data_t.qdata), name
        assert torch.equal(pair.data_t.scale_inv, want.data_t.scale_inv), name


def _train_step(layer, x, g):
    out = layer(x)
    out.backward(g)
    return out.detach()


def test_fp8_weight_cache_step_refresh(monkeypatch, device):
    """Default on; ``optimizer.step()`` re-quantizes the copies right away, in place (bitwise a
    fresh quantization, same buffers), so the next forward quantizes nothing; an optimizer
    that does not own the weights marks them stale (re-quantized lazily, in place)."""
    layer = _layer(device)
    assert layer.fp8_weight_cache is True and "fp8_weight_cache=True" in repr(layer)
    x = torch.randn(6, 16, device=device, dtype=torch.bfloat16)
    g = torch.randn_like(x)
    _train_step(layer, x, g)
    bufs = {n: layer._fp8_cached[n][2].data.qdata.data_ptr() for n in ("w1", "w2")}
    old = layer._fp8_cached["w1"][2].data.qdata.clone()
    calls = _count_quant(monkeypatch)
    torch.optim.Adam(layer.parameters(), lr=0.05).step()
    assert len(calls) == 2  # w1 and w2, eagerly
    assert not same_bits(layer._fp8_cached["w1"][2].data.qdata, old)
    _assert_fresh(layer)
    assert {n: layer._fp8_cached[n][2].data.qdata.data_ptr() for n in bufs} == bufs
    _train_step(layer, x, g)
    assert len(calls) == 2  # hits
    torch.optim.SGD([layer.router_weight], lr=0.1).step()  # not the experts' optimizer
    _train_step(layer, x, g)
    assert len(calls) == 4  # stale: re-quantized lazily, into the same buffers
    assert {n: layer._fp8_cached[n][2].data.qdata.data_ptr() for n in bufs} == bufs
    _assert_fresh(layer)


def test_fp8_weight_cache_data_write_and_lifetime(device):
    """``.data`` writes need ``refresh_fp8_weights()``; a replaced parameter is re-quantized;
    copies of the layer get an empty cache; the cache goes with the layer."""
    layer = _layer(device)
    x = torch.randn(6, 16, device=device, dtype=torch.bfloat16)
    _train_step(layer, x, torch.randn_like(x))
    layer.w1.data.mul_(0.5)  # .data: no version bump
    layer.refresh_fp8_weights()
    _assert_fresh(layer)
    layer.last_aux_scores = None  # a non-leaf tensor: deepcopy refuses it
    twin = copy.deepcopy(layer)
    assert len(twin._fp8_cached) == 0 and twin._fp8_cached.config == layer.fp8_config
    with torch.no_grad():
        assert same_bits(twin(x), layer(x))
    layer.w2 = torch.nn.Parameter(layer.w2.detach() * 2)  # another tensor object
    _train_step(layer, x, torch.randn_like(x))
    _assert_fresh(layer)
    caches = [weakref.ref(m._fp8_cached) for m in (layer, twin)]
    keys = [id(m._fp8_cached) for m in (layer, twin)]
    assert all(gl_mod._LIVE.get(k) is r() for k, r in zip(keys, caches, strict=True))
    del layer, twin
    gc.collect()
    assert all(r() is None for r in caches)


def test_fp8_weight_cache_off_unchanged(monkeypatch, device):
    """``fp8_weight_cache=False``: nothing cached, nothing refreshed by the step hook, and
    outputs / gradients / updated weights bitwise those of the cached default across steps."""
    on, off = _layer(device), _layer(device, cache=False)
    assert off.fp8_weight_cache is False
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (on, off)]
    torch.manual_seed(3)
    x = torch.randn(6, 16, device=device, dtype=torch.bfloat16)
    g = torch.randn_like(x)
    for _ in range(2):
        outs = [_train_step(m, x, g) for m in (on, off)]
        assert same_bits(*outs)
        assert torch.equal(on.w1.grad, off.w1.grad) and torch.equal(on.w2.grad, off.w2.grad)
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert len(off._fp8_cached) == 0
    assert torch.equal(on.w1, off.w1) and torch.equal(on.w2, off.w2)


def test_grouped_linear_fp8_cache_default(device):
    cfg = Float8QuantConfig(granularity=ROW)
    assert turbo.modules.GroupedLinear(2, 8, 8, fp8_config=cfg).fp8_weight_cache is True
    assert turbo.modules.GroupedLinear(2, 8, 8).fp8_weight_cache is False
    m = turbo.modules.GroupedLinear(2, 8, 8, fp8_config=cfg, fp8_weight_cache=False)
    assert m.fp8_weight_cache is False
    with pytest.raises(TypeError, match="fp8_weight_cache"):
        turbo.modules.GroupedLinear(2, 8, 8, fp8_config=cfg, fp8_weight_cache="on")


# ---- CUDA graphs (GPU) ---------------------------------------------------------------------


def _gpu_pair(device):
    if device != "cuda":
        pytest.skip("CUDA graphs")
    a, b = (_layer(device, d=256, f=128, e=8, k=2, seed=0) for _ in range(2))
    torch.manual_seed(1)
    x = torch.randn(64, 256, device=device, dtype=torch.bfloat16)
    return a, b, x, torch.randn_like(x)


def _warm_up(layers_opts, x, g, steps: bool):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for layer, opt in layers_opts:
                opt.zero_grad(set_to_none=True)
                _train_step(layer, x, g)
                if steps:
                    opt.step()
    torch.cuda.current_stream().wait_stream(side)
    for _, opt in layers_opts:
        opt.zero_grad(set_to_none=True)


@pytest.mark.gpu
def test_fp8_weight_cache_graph_fwd_bwd_across_steps(monkeypatch, device):
    """A captured forward + backward (no weight quantization inside the graph: the cached
    copies are graph inputs), replayed across two eager optimizer steps: output, gradients and
    updated weights bitwise those of an eager twin."""
    a, b, x, g = _gpu_pair(device)
    opt_a, opt_b = (torch.optim.SGD(m.parameters(), lr=0.5) for m in (a, b))
    _warm_up([(a, opt_a), (b, opt_b)], x, g, steps=False)
    calls = _count_quant(monkeypatch)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_a = a(x)
        out_a.backward(g)
    assert not calls  # cache hits: the graph holds no weight quantization
    for _ in range(2):
        graph.replay()
        out_b = _train_step(b, x, g)
        assert same_bits(out_a, out_b)
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(pa.grad, pb.grad)
        opt_a.step()  # refreshes a's copies in place: the next replay reads them
        opt_b.step()
        opt_b.zero_grad(set_to_none=True)
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(pa, pb)
    _assert_fresh(a)


@pytest.mark.gpu
def test_fp8_weight_cache_graph_full_step(device):
    """A fully captured training step (forward, backward, ``Adam(capturable=True).step()``):
    the step hook's refresh is captured after the update, so two replays give bitwise the
    weights, outputs and fp8 copies of an eager twin; an eager forward afterwards agrees."""
    a, b, x, g = _gpu_pair(device)
    opt_a, opt_b = (torch.optim.Adam(m.parameters(), lr=1e-2, capturable=True) for m in (a, b))
    _warm_up([(a, opt_a), (b, opt_b)], x, g, steps=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_a = a(x)
        out_a.backward(g)
        opt_a.step()
    for _ in range(2):
        graph.replay()
        out_b = _train_step(b, x, g)
        opt_b.step()
        opt_b.zero_grad(set_to_none=True)
        assert same_bits(out_a, out_b)
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(pa, pb)
        for name in ("w1", "w2"):
            qa, qb = a._fp8_cached[name][2], b._fp8_cached[name][2]
            assert same_bits(qa.data.qdata, qb.data.qdata)
            assert same_bits(qa.data_t.qdata, qb.data_t.qdata)
    _assert_fresh(a)
    with torch.no_grad():
        assert same_bits(a(x), b(x))
