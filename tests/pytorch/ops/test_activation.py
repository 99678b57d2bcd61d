"""SwiGLU / GeGLU (plain and with router probs): forward, dx and dprobs vs the fp32 reference."""

from __future__ import annotations

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.reference.activation import glu_ref
from tests.pytorch.test_utils import assert_close, rand

pytestmark = pytest.mark.activation


def compile_backend(device: str) -> str:
    """Inductor on GPU; on CPU aot_eager (full-graph tracing through the custom ops and their
    fakes is what is tested; inductor's C++ codegen would cost ~20 s of the CPU budget)."""
    return "inductor" if device == "cuda" else "aot_eager"


DTYPES = [torch.bfloat16, torch.float32]  # fp16: test_glu_fp16 (interpreter time budget)
SHAPES = [(1, 1), (7, 37), (3, 130), (0, 8)]  # (T, H); odd, > one block, zero rows
GPU_SHAPES = [(4096, 1408), (1000, 2880), (257, 8192)]
ACTS = {"silu": ("swiglu", "swiglu_with_probs"), "gelu": ("geglu", "geglu_with_probs")}


def _check(t, h, dtype, act, with_probs, device, use_mask=False, lead=()):
    plain, with_p = ACTS[act]
    x = rand(*lead, t, 2 * h, dtype=dtype, device=device, requires_grad=True)
    n = x.numel() // (2 * h) if h else t
    probs = rand(n, dtype=torch.float32, device=device, requires_grad=True) if with_probs else None
    mask = (torch.rand(n, device=device) > 0.3).to(torch.int64) if use_mask else None
    if with_probs:
        out = getattr(turbo.ops, with_p)(x, probs, mask)
    else:
        out = getattr(turbo.ops, plain)(x)
    assert out.shape == (n, h) and out.dtype == dtype
    x_ref = x.detach().float().requires_grad_()
    p_ref = probs.detach().clone().requires_grad_() if with_probs else None
    ref = glu_ref(x_ref, p_ref, mask, act)
    assert_close(out, ref, dtype)
    grad = rand(n, h, dtype=dtype, device=device)
    out.backward(grad)
    ref.backward(grad.float())
    assert x.grad.shape == x.shape and x.grad.dtype == dtype
    assert_close(x.grad, x_ref.grad, dtype)
    if with_probs:
        assert probs.grad.dtype == torch.float32
        # dprobs sums H products: scale the tolerance with sqrt(H) for low-precision inputs
        tol = 1e-4 if dtype == torch.float32 else 1e-2 * max(1.0, h**0.5)
        torch.testing.assert_close(probs.grad.cpu(), p_ref.grad.cpu(), rtol=1e-2, atol=tol)


@pytest.mark.parametrize("with_probs", [False, True], ids=["plain", "probs"])
@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t,h", SHAPES, ids=str)
def test_glu_fwd_bwd(t, h, dtype, act, with_probs, device):
    _check(t, h, dtype, act, with_probs, device)


@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_glu_fp16(act, device):
    _check(9, 48, torch.float16, act, True, device)


@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_glu_row_mask_and_leading_dims(act, device):
    _check(5, 24, torch.bfloat16, act, True, device, use_mask=True, lead=(2,))


@pytest.mark.gpu
@pytest.mark.parametrize("with_probs", [False, True], ids=["plain", "probs"])
@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("t,h", GPU_SHAPES, ids=str)
def test_glu_fwd_bwd_gpu_shapes(t, h, act, with_probs, device):
    _check(t, h, torch.bfloat16, act, with_probs, device)


def test_glu_torch_compile(device):
    torch._dynamo.reset()
    fn = torch.compile(
        lambda x, p: turbo.ops.swiglu_with_probs(x, p, None) * 2.0,
        fullgraph=True,
        backend=compile_backend(device),
    )
    x = rand(6, 40, dtype=torch.bfloat16, device=device, requires_grad=True)
    p = rand(6, dtype=torch.float32, device=device, requires_grad=True)
    out = fn(x, p)
    out.backward(torch.ones_like(out))
    x_ref = x.detach().float().requires_grad_()
    p_ref = p.detach().clone().requires_grad_()
    ref = glu_ref(x_ref, p_ref) * 2.0
    ref.backward(torch.ones_like(ref))
    assert_close(out, ref, torch.bfloat16)
    assert_close(x.grad, x_ref.grad, torch.bfloat16)
    torch.testing.assert_close(p.grad.cpu(), p_ref.grad.cpu(), rtol=1e-2, atol=5e-2)


@pytest.mark.deterministic
def test_glu_deterministic(device):
    t, h = (8, 96) if device == "cpu" else (4096, 4096)
    x = rand(t, 2 * h, dtype=torch.bfloat16, device=device, requires_grad=True)
    p = rand(t, dtype=torch.float32, device=device, requires_grad=True)
    g = rand(t, h, dtype=torch.bfloat16, device=device)
    first = None
    for _ in range(3):
        x.grad = p.grad = None
        out = turbo.ops.swiglu_with_probs(x, p)
        out.backward(g)
        cur = (out.detach().clone(), x.grad.clone(), p.grad.clone())
        if first is None:
            first = cur
        for a, b in zip(first, cur, strict=True):
            assert torch.equal(a, b)


def test_glu_bad_inputs(device):
    x = rand(4, 10, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="swiglu.*'x'.*even"):
        turbo.ops.swiglu(rand(4, 9, dtype=torch.bfloat16, device=device))
    with pytest.raises(TypeError, match="swiglu_with_probs.*'probs'.*float32"):
        turbo.ops.swiglu_with_probs(x, rand(4, dtype=torch.bfloat16, device=device))
    with pytest.raises(ValueError, match="geglu_with_probs.*'probs'.*4 elements"):
        turbo.ops.geglu_with_probs(x, rand(5, dtype=torch.float32, device=device))
    with pytest.raises(TypeError, match="swiglu.*'x'.*dtype"):
        turbo.ops.swiglu(torch.ones(4, 10, dtype=torch.int32, device=device))


def test_tokens_per_expert_to_mask(device):
    tpe = torch.tensor([2, 0, 3], device=device)
    mask = turbo.ops.tokens_per_expert_to_mask(tpe, 8)
    assert mask.dtype == torch.int64
    assert mask.tolist() == [1, 1, 1, 1, 1, 0, 0, 0]


@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_glu_torch_fallback_matches_triton(act, device, monkeypatch):
    """The non-Triton path (CPU without the interpreter) gives the same result as the kernel."""
    from primus_turbo.pytorch.kernels.activation import glu_impl

    x = rand(6, 40, dtype=torch.float32, device=device, requires_grad=True)
    p = rand(6, dtype=torch.float32, device=device, requires_grad=True)
    fn = turbo.ops.swiglu_with_probs if act == "silu" else turbo.ops.geglu_with_probs
    out = fn(x, p)
    out.backward(torch.ones_like(out))
    grads = (x.grad.clone(), p.grad.clone())
    x.grad = p.grad = None
    monkeypatch.setattr(glu_impl, "_use_triton", lambda t: False)
    out2 = fn(x, p)
    out2.backward(torch.ones_like(out2))
    assert_close(out2, out, torch.float32)
    assert_close(x.grad, grads[0], torch.float32)
    assert_close(p.grad, grads[1], torch.float32)


def test_glu_tile_rule(monkeypatch):
    """``glu_tile``: ``auto`` (default) = GeGLU on 512-element 2-D tiles, SwiGLU on 512 where H
    needs the 128-wide block, else 1024, and 2048 for a forward with H a multiple of 2048; the
    2-D tile takes the width with the least padding (widest on a tie); ``2d`` = 512 elements
    for both; ``row`` the one-row block; a bad knob value raises."""
    from primus_turbo.triton.activation.glu_kernel import ACT_GELU, ACT_SILU, _block_h, glu_tile

    monkeypatch.delenv("PRIMUS_TURBO_GLU_TILE", raising=False)
    session12 = {2880: (4, 128, 4), 768: (2, 256, 4), 2048: (1, 512, 4), 14336: (1, 512, 4),
                 40: (4, 128, 4)}  # fmt: skip
    for h, tile in session12.items():
        assert glu_tile(h, ACT_GELU) == glu_tile(h, ACT_GELU, forward=False) == tile
    silu_fwd = {2880: (4, 128, 4), 768: (4, 256, 4), 2048: (1, 2048, 4), 14336: (1, 2048, 4),
                40: (4, 128, 4)}  # fmt: skip
    silu_bwd = {**silu_fwd, 2048: (1, 1024, 4), 14336: (1, 1024, 4)}
    for h in silu_fwd:
        assert glu_tile(h, ACT_SILU) == silu_fwd[h]
        assert glu_tile(h, ACT_SILU, forward=False) == silu_bwd[h]
    monkeypatch.setenv("PRIMUS_TURBO_GLU_TILE", "2d")
    for h, tile in session12.items():
        assert glu_tile(h, ACT_SILU) == glu_tile(h, ACT_SILU, forward=False) == tile
    monkeypatch.setenv("PRIMUS_TURBO_GLU_TILE", "2d:1024")
    assert glu_tile(2048, ACT_SILU) == (1, 1024, 4)
    assert glu_tile(2880, ACT_SILU) == (8, 128, 4)
    monkeypatch.setenv("PRIMUS_TURBO_GLU_TILE", "row")
    assert glu_tile(2880, ACT_GELU) == (1, *_block_h(2880))
    monkeypatch.setenv("PRIMUS_TURBO_GLU_TILE", "wide")
    with pytest.raises(ValueError, match="PRIMUS_TURBO_GLU_TILE.*'wide'"):
        glu_tile(64, ACT_GELU)


@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("t,h", [(13, 40), (5, 300)], ids=str)
def test_glu_tile_knob_same_results(t, h, act, device, monkeypatch):
    """Every ``PRIMUS_TURBO_GLU_TILE`` setting: the output and dx bitwise those of the one-row
    block (elementwise math), dprobs equal up to the summation order; masked rows, probs."""
    _, with_p = ACTS[act]
    x0 = rand(t, 2 * h, dtype=torch.bfloat16, device=device)
    p0 = rand(t, dtype=torch.float32, device=device)
    mask = (torch.arange(t, device=device) % 4 != 1).to(torch.int64)
    g = rand(t, h, dtype=torch.bfloat16, device=device)
    got = {}
    for tile in ("row", "2d", "2d:1024", "2d:2048", "auto"):
        monkeypatch.setenv("PRIMUS_TURBO_GLU_TILE", tile)
        x = x0.clone().requires_grad_()
        p = p0.clone().requires_grad_()
        out = getattr(turbo.ops, with_p)(x, p, mask)
        out.backward(g)
        got[tile] = (out.detach(), x.grad, p.grad)
    for tile in ("2d", "2d:1024", "2d:2048", "auto"):
        assert torch.equal(got[tile][0], got["row"][0])
        assert torch.equal(got[tile][1], got["row"][1])
        torch.testing.assert_close(got[tile][2], got["row"][2], rtol=1e-5, atol=1e-5)
