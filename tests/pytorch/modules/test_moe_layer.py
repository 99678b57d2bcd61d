"""MoELayer: forward and every parameter/input gradient vs the loop-of-experts reference layer."""

from __future__ import annotations

import zlib

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.reference.moe import moe_layer_ref
from tests.pytorch.test_utils import assert_close, same_bits, snr_db

pytestmark = pytest.mark.moe

# (T, D, F, E, topk, score_function, groups, selected_groups, activation)
CASES = [
    (7, 32, 16, 4, 2, "softmax", 1, 1, "swiglu"),
    (5, 24, 8, 8, 4, "sigmoid", 4, 2, "geglu"),  # group-limited
    (4, 16, 8, 1, 1, "softmax", 1, 1, "swiglu"),  # single expert
]
# Real hidden sizes (the long bf16 reductions are what the gates measure); expert counts cut
# where the weights would be large: each case holds bf16 weights, fp32 reference copies and
# both sets of gradients (~6x the bf16 weight bytes), and under xdist up to 8 workers share one
# GPU. Mixtral-8x7B at E=8 needed ~17 GB per case (a likely cause of its one unexplained
# failure under 8 workers, passing alone); E=4 halves that without changing the numerics.
GPU_CASES = [
    (4096, 2048, 768, 32, 8, "softmax", 1, 1, "swiglu"),  # Qwen3-MoE-like (E cut)
    (2048, 2880, 2880, 32, 4, "softmax", 1, 1, "swiglu"),  # gpt-oss-20b
    (2048, 4096, 14336, 4, 2, "softmax", 1, 1, "swiglu"),  # Mixtral-8x7B-like (E cut)
    (2048, 7168, 2048, 16, 8, "sigmoid", 8, 4, "swiglu"),  # DeepSeek-V3-like (E cut)
]


def _check(t, d, f, e, k, fn, groups, sel, act, device, min_snr=30.0):
    """SNR gates vs the fp32 loop-of-experts reference (the layer rounds h, the activation and
    y to bf16 once each: an estimated ~45-50 dB at any size, and the H200 benchmark saw 47-80 dB
    against the bf16 loop, so 30 dB leaves a wide margin; the failure message lists all). The seed
    is fixed per case: conftest's ``hash(nodeid)`` seed changes with every interpreter
    (``PYTHONHASHSEED``), so a failure would otherwise not reproduce on a re-run."""
    torch.manual_seed(zlib.crc32(repr((t, d, f, e, k, fn, groups, sel, act)).encode()))
    layer = turbo.modules.MoELayer(
        d, f, e, k, score_function=fn, groups=groups, selected_groups=sel, activation=act,
        scaling_factor=1.0, device=device, dtype=torch.bfloat16,
    )  # fmt: skip
    x = torch.randn(t, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    out = layer(x)
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    params = [layer.router_weight, layer.w1, layer.w2]
    ref_params = [p.detach().float().requires_grad_() for p in params]
    x_ref = x.detach().float().requires_grad_()
    ref = moe_layer_ref(x_ref, *ref_params, k, fn, groups, sel, 1.0, act)
    snrs = {"out": snr_db(ref.detach(), out.detach().float())}
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g.float())
    grads = [("x", x.grad, x_ref.grad)] + [
        (n, p.grad, r.grad)
        for n, p, r in zip(("router", "w1", "w2"), params, ref_params, strict=True)
    ]
    for name, got, want in grads:
        assert got is not None and got.dtype == torch.bfloat16, name
        assert torch.isfinite(got).all(), f"{name}: non-finite gradient"
        if want.abs().max() == 0:
            assert got.abs().max() == 0, name
            continue
        snrs[name] = snr_db(want, got.float())
    del layer, ref_params, x_ref, ref, grads
    if device == "cuda":  # hand cached blocks back: other xdist workers share this GPU
        torch.cuda.empty_cache()
    report = ", ".join(f"{n} {v:.1f} dB" for n, v in snrs.items())
    for name, snr in snrs.items():
        # the router weight's gradient flows only through probs: a small, noisier signal
        assert snr > (min_snr - 10 if name == "router" else min_snr), f"{name}: {report}"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_moe_layer(case, device):
    _check(*case, device)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_moe_layer_gpu_shapes(case, device):
    _check(*case, device)


def test_moe_layer_training_step(device):
    layer = turbo.modules.MoELayer(16, 8, 4, 2, device=device, dtype=torch.bfloat16)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    x = torch.randn(2, 3, 16, device=device, dtype=torch.bfloat16)
    before = [p.detach().clone() for p in layer.parameters()]
    loss = layer(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    assert layer.last_aux_scores.shape == (6, 4)
    assert all(not torch.equal(a, p) for a, p in zip(before, layer.parameters(), strict=True))


def test_moe_layer_bad_inputs(device):
    with pytest.raises(ValueError, match="MoELayer.*'activation'"):
        turbo.modules.MoELayer(8, 4, 2, 1, activation="relu")
    layer = turbo.modules.MoELayer(8, 4, 2, 1, device=device, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="MoELayer.*'x'.*last dim 8"):
        layer(torch.randn(3, 7, device=device, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="MoELayer.*'x'.*dtype"):
        layer(torch.randn(3, 8, device=device))
    with pytest.raises(ValueError, match="MoELayer.*'router_dtype'.*torch.float32 or None"):
        turbo.modules.MoELayer(8, 4, 2, 1, router_dtype=torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_moe_layer_router_dtype(dtype, device):
    """fp32 router (default): the logits of the 16-bit GEMM with fp32 output match the fp32
    GEMM of the casts (exact products; only the summation order may differ) and the backward is
    bitwise that of ``F.linear(x.float(), w.float())`` (the same fp32 GEMMs); ``None``: the
    GEMM in the tokens' dtype, forward and backward."""
    t, d, e = (37, 48, 8) if device == "cpu" else (1031, 2048, 128)
    layer = turbo.modules.MoELayer(d, 16, e, 2, device=device, dtype=dtype)
    x = torch.randn(t, d, device=device, dtype=dtype, requires_grad=True)
    g = torch.randn(t, e, device=device)
    logits = layer._router_logits(x)
    assert logits.dtype == torch.float32
    (dx, dw) = torch.autograd.grad(logits, [x, layer.router_weight], g)
    x_ref = x.detach().requires_grad_()
    w_ref = layer.router_weight.detach().requires_grad_()
    ref = torch.nn.functional.linear(x_ref.float(), w_ref.float())
    torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)
    ref.backward(g)
    assert same_bits(dx, x_ref.grad) and same_bits(dw, w_ref.grad)
    layer.router_dtype = None
    low = layer._router_logits(x)
    assert low.dtype == dtype
    torch.testing.assert_close(low, torch.nn.functional.linear(x, layer.router_weight))


@pytest.mark.parametrize("granularity", ["TENSORWISE", "ROWWISE"])
def test_moe_layer_fp8(granularity, device):
    """FP8 expert GEMMs: output and input gradient vs the fp32 loop reference by SNR."""
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity

    cfg = Float8QuantConfig(granularity=ScalingGranularity[granularity])
    t, d, f, e, k = (8, 32, 16, 4, 2) if device == "cpu" else (2048, 2048, 768, 32, 8)
    layer = turbo.modules.MoELayer(d, f, e, k, fp8_config=cfg, device=device, dtype=torch.bfloat16)
    x = torch.randn(t, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    out = layer(x)
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    ref_params = [p.detach().float().requires_grad_() for p in layer.parameters()]
    x_ref = x.detach().float().requires_grad_()
    ref = moe_layer_ref(x_ref, *ref_params, k)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g.float())
    assert snr_db(ref.detach(), out.detach().float()) > 20
    assert snr_db(x_ref.grad, x.grad.float()) > 20
    assert snr_db(ref_params[1].grad, layer.w1.grad.float()) > 20


def test_moe_layer_torch_compile(device):
    torch._dynamo.reset()
    layer = turbo.modules.MoELayer(16, 8, 4, 2, device=device, dtype=torch.bfloat16)
    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    x = torch.randn(5, 16, device=device, dtype=torch.bfloat16, requires_grad=True)
    out = compiled(x)
    out.float().sum().backward()
    grads = [x.grad.clone()] + [p.grad.clone() for p in layer.parameters()]
    x.grad = None
    layer.zero_grad()
    eager = layer(x)
    eager.float().sum().backward()
    assert_close(out, eager, torch.bfloat16)
    for got, want in zip(grads, [x.grad] + [p.grad for p in layer.parameters()], strict=True):
        assert_close(got, want, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", [None, "ROWWISE"])
def test_moe_layer_make_graphed_callables(granularity, device):
    """``torch.cuda.make_graphed_callables`` over the layer (what an eager training loop uses to
    take the launches off the host: the layer never synchronises): two replays on fresh
    inputs give bitwise the output and every gradient of an eager twin with the same
    parameters (same kernels, plans chosen in the eager warm-up)."""
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity

    cfg = None if granularity is None else Float8QuantConfig(
        granularity=ScalingGranularity[granularity])  # fmt: skip
    t, d, f, e, k = 1024, 1024, 384, 16, 4
    layers = [turbo.modules.MoELayer(d, f, e, k, fp8_config=cfg, device=device,
                                     dtype=torch.bfloat16) for _ in range(2)]  # fmt: skip
    layers[1].load_state_dict(layers[0].state_dict())
    sample = torch.randn(t, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    for _ in range(2):  # eager warm-up: tuners, weight caches
        layers[0](sample).backward(torch.randn(t, d, device=device, dtype=torch.bfloat16))
    graphed = torch.cuda.make_graphed_callables(layers[0], (sample,))
    outs = []
    for _ in range(2):
        for m in layers:
            m.zero_grad(set_to_none=True)
        x = torch.randn(t, d, device=device, dtype=torch.bfloat16)
        g = torch.randn(t, d, device=device, dtype=torch.bfloat16)
        xa, xb = (x.clone().requires_grad_() for _ in range(2))
        out_a, out_b = graphed(xa), layers[1](xb)
        out_a.backward(g)
        out_b.backward(g)
        assert same_bits(out_a, out_b)
        assert same_bits(xa.grad, xb.grad)
        for pa, pb in zip(layers[0].parameters(), layers[1].parameters(), strict=True):
            assert same_bits(pa.grad, pb.grad)
        outs.append(out_a.detach().clone())
    assert not torch.equal(outs[0], outs[1])  # the replays read the new inputs


def test_moe_layer_releases_previous_graph(device):
    """A call drops the previous call's ``last_aux_scores`` (and with it that call's autograd
    graph) before it touches its input, so the parameters and a reused input get fresh
    gradient accumulator nodes, made on the stream current now (what lets a CUDA-graph capture
    follow eager calls, ``test_moe_layer_make_graphed_callables``); the new scores are kept
    for an aux loss."""

    def accumulator(p):
        return p.view_as(p).grad_fn.next_functions[0][0]

    layer = turbo.modules.MoELayer(16, 8, 4, 2, device=device, dtype=torch.bfloat16)
    x = torch.randn(5, 16, device=device, dtype=torch.bfloat16, requires_grad=True)
    leaves = [x, *layer.parameters()]
    layer(x)  # its output is dropped; its scores (and graph) stay on the layer
    for t in (x, layer.router_weight):  # (no reference to a node may outlive this line)
        accumulator(t).metadata["call"] = 1
    # the scores hold the input's and the router weight's nodes
    assert [accumulator(t).metadata.get("call") for t in (x, layer.router_weight)] == [1, 1]
    out = layer(x)
    assert not any("call" in accumulator(t).metadata for t in leaves)
    aux = layer.last_aux_scores
    assert aux is not None and aux.shape == (5, 4) and aux.requires_grad
    (out.float().sum() + aux.sum()).backward()
    assert layer.router_weight.grad is not None
