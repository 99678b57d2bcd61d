"""Top-k router: probs/indices and the gradient w.r.t. logits vs the fp32 reference, group-limited
top-k, ties (lowest index wins), dense form, compile, bad inputs."""

from __future__ import annotations

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.reference.moe import router_ref

pytestmark = pytest.mark.moe

# (T, E, topk, groups, selected_groups, score_function)
CASES = [
    (7, 8, 2, 1, 1, "softmax"),
    (9, 16, 4, 1, 1, "sigmoid"),
    (5, 1, 1, 1, 1, "softmax"),  # single expert
    (11, 32, 8, 8, 4, "sigmoid"),  # DeepSeek-V3-like group-limited
    (6, 16, 4, 4, 2, "softmax"),
    (0, 8, 2, 1, 1, "sigmoid"),
]
GPU_CASES = [(4096, 256, 8, 8, 4, "sigmoid"), (8192, 128, 8, 1, 1, "softmax")]


def _check(t, e, topk, groups, sel, fn, device, dtype=torch.float32, scale=2.5):
    logits = torch.randn(t, e, device=device).to(dtype).requires_grad_()
    aux, probs, idx = turbo.ops.moe_router_topk(
        logits, topk, groups=groups, selected_groups=sel, score_function=fn, scaling_factor=scale
    )
    # fp32 reference: an fp64 one could order near-tied scores differently at large T*E
    ref_logits = logits.detach().float().requires_grad_()
    r_aux, r_probs, r_idx = router_ref(ref_logits, topk, groups, sel, fn, scale)
    assert probs.shape == (t, topk) and probs.dtype == torch.float32 and idx.dtype == torch.int64
    assert torch.equal(idx.cpu(), r_idx.cpu())
    torch.testing.assert_close(probs.cpu(), r_probs.cpu(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(aux.cpu(), r_aux.cpu(), rtol=1e-5, atol=1e-6)
    gp, ga = torch.randn_like(probs), torch.randn_like(aux)
    ((probs * gp).sum() + (aux * ga).sum()).backward()
    ((r_probs * gp).sum() + (r_aux * ga).sum()).backward()
    assert logits.grad.dtype == dtype
    torch.testing.assert_close(
        logits.grad.float().cpu(), ref_logits.grad.cpu(), rtol=1e-4, atol=1e-5
    )
    if t and topk > 1:
        torch.testing.assert_close(
            probs.sum(-1).cpu(), torch.full((t,), scale), rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("t,e,topk,groups,sel,fn", CASES, ids=str)
def test_router(t, e, topk, groups, sel, fn, device):
    _check(t, e, topk, groups, sel, fn, device)


@pytest.mark.gpu
@pytest.mark.parametrize("t,e,topk,groups,sel,fn", GPU_CASES, ids=str)
def test_router_gpu_shapes(t, e, topk, groups, sel, fn, device):
    _check(t, e, topk, groups, sel, fn, device)


def test_router_ties_lowest_index_wins(device):
    logits = torch.zeros(3, 8, device=device)
    logits[1, 5] = logits[1, 6] = 1.0  # tie on the top pair, then a 6-way tie
    logits[2] = torch.tensor([0.5, 0.5, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0], device=device)
    for fn in ("softmax", "sigmoid"):
        _, probs, idx = turbo.ops.moe_router_topk(logits, 3, score_function=fn)
        assert idx.tolist() == [[0, 1, 2], [5, 6, 0], [4, 5, 6]]
        assert torch.allclose(probs[0], torch.full((3,), 1 / 3, device=device))
    # group-limited: groups 0 and 1 tie on group score; the lower group is selected
    _, _, idx = turbo.ops.moe_router_topk(
        logits[2:], 2, groups=4, selected_groups=1, score_function="sigmoid"
    )
    assert idx.tolist() == [[4, 5]]
    _, _, idx = turbo.ops.moe_router_topk(
        torch.zeros(1, 8, device=device), 2, groups=4, selected_groups=1
    )
    assert idx.tolist() == [[0, 1]]


def test_router_group_limit_excludes_other_groups(device):
    # the best single expert (index 7) sits in a group whose top-2 sum is low
    logits = torch.tensor([[1.0, 1.0, 0.0, 0.0, -9.0, -9.0, -9.0, 3.0]], device=device)
    _, _, idx = turbo.ops.moe_router_topk(logits, 2, groups=4, selected_groups=1)
    assert idx.tolist() == [[0, 1]]
    _, _, idx = turbo.ops.moe_router_topk(logits, 2)
    assert idx.tolist() == [[7, 0]]


def test_router_dense_form(device):
    logits = torch.randn(6, 16, device=device)
    scores, probs, rmap = turbo.ops.fused_group_topk_routing_with_aux_score(
        logits, 4, groups=4, selected_groups=2, score_function="sigmoid", scaling_factor=1.5
    )
    aux, pk, idx = turbo.ops.moe_router_topk(logits, 4, 4, 2, "sigmoid", 1.5)
    assert rmap.dtype == torch.bool and rmap.sum().item() == 24
    assert torch.equal(probs.gather(1, idx), pk) and torch.equal(scores, aux)
    assert torch.equal(probs != 0, rmap)


def test_router_bf16_logits_and_compile(device):
    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    fn = torch.compile(
        lambda x: turbo.ops.moe_router_topk(x, 2, score_function="softmax"),
        fullgraph=True,
        backend=backend,
    )
    logits = torch.randn(5, 8, device=device).to(torch.bfloat16).requires_grad_()
    _, probs, idx = fn(logits)
    _, r_probs, r_idx = router_ref(logits.detach(), 2, score_function="softmax")
    assert torch.equal(idx, r_idx)
    torch.testing.assert_close(probs, r_probs, rtol=1e-5, atol=1e-6)
    probs.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


@pytest.mark.deterministic
def test_router_deterministic(device):
    t, e = (64, 32) if device == "cpu" else (16384, 256)
    logits = (torch.randn(t, e, device=device) * 4).round() / 4  # many exact ties
    first = turbo.ops.moe_router_topk(logits, 8, groups=8, selected_groups=4)
    for _ in range(3):
        cur = turbo.ops.moe_router_topk(logits, 8, groups=8, selected_groups=4)
        for a, b in zip(first, cur, strict=True):
            assert torch.equal(a, b)


def test_router_bad_inputs(device):
    logits = torch.randn(4, 12, device=device)
    with pytest.raises(ValueError, match="moe_router_topk.*'groups'.*power of two"):
        turbo.ops.moe_router_topk(logits, 2, groups=3)
    with pytest.raises(ValueError, match="moe_router_topk.*'topk'"):
        turbo.ops.moe_router_topk(logits, 13)
    with pytest.raises(ValueError, match="moe_router_topk.*'score_function'"):
        turbo.ops.moe_router_topk(logits, 2, score_function="relu")
    with pytest.raises(ValueError, match="moe_router_topk.*'selected_groups'"):
        turbo.ops.moe_router_topk(logits, 2, groups=4, selected_groups=5)
    with pytest.raises(ValueError, match="moe_router_topk.*'topk'.*selected_groups"):
        turbo.ops.moe_router_topk(logits, 3, groups=4, selected_groups=2)
    with pytest.raises(TypeError, match="moe_router_topk.*'logits'.*dtype"):
        turbo.ops.moe_router_topk(logits.long(), 2)


# (T, E, topk, groups, selected_groups, score_function): padded groups (160 = 8 x 20), a
# 3-expert row, top-1, every group selected
FUSED_CASES = [
    (33, 160, 6, 8, 2, "softmax"),
    (21, 96, 4, 4, 4, "sigmoid"),
    (12, 3, 2, 1, 1, "softmax"),
    (9, 64, 1, 1, 1, "sigmoid"),
    (40, 256, 8, 8, 4, "sigmoid"),
]


@pytest.mark.parametrize("grads", ["both", "probs", "aux"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("t,e,topk,groups,sel,fn", FUSED_CASES, ids=str)
def test_router_fused_matches_torch_ops(t, e, topk, groups, sel, fn, dtype, grads, device):
    """The fused kernels (taken on a GPU and under the interpreter) vs the torch-op router:
    the same experts, probs and aux scores to fp32 rounding, and the logits gradient from
    either output alone or both."""
    from primus_turbo.pytorch.kernels.moe.router_impl import fused_router_usable
    from primus_turbo.pytorch.ops.moe import _router_torch

    x = (torch.randn(t, e, device=device) * 2).to(dtype).requires_grad_()
    y = x.detach().clone().requires_grad_()
    if not fused_router_usable(x, topk, groups):
        pytest.skip("the fused router needs a GPU or TRITON_INTERPRET=1")
    got = turbo.ops.moe_router_topk(x, topk, groups, sel, fn, 1.7)
    want = _router_torch(y, topk, groups, sel, fn, 1.7)
    assert torch.equal(got[2], want[2])
    for a, b in zip(got[:2], want[:2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    gp, ga = torch.randn_like(got[1]), torch.randn_like(got[0])
    for out in (got, want):
        loss = (out[1] * gp).sum() if grads != "aux" else 0
        loss = loss + ((out[0] * ga).sum() if grads != "probs" else 0)
        loss.backward()
    assert x.grad.dtype == dtype
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 1e-3}
    torch.testing.assert_close(x.grad.float(), y.grad.float(), **tol)


def test_router_fused_ties_match_torch_ops(device):
    """Quarter-step logits (many exact ties in scores and in two-expert group sums): the fused
    kernel picks the same experts as the torch ops (lowest index, lowest group on a tie)."""
    from primus_turbo.pytorch.ops.moe import _router_torch

    logits = (torch.randn(64, 32, device=device) * 4).round() / 4
    for fn in ("softmax", "sigmoid"):
        for groups, sel, topk in ((1, 1, 8), (8, 4, 8), (4, 2, 4)):
            got = turbo.ops.moe_router_topk(logits, topk, groups, sel, fn)
            want = _router_torch(logits, topk, groups, sel, fn, 1.0)
            assert torch.equal(got[2], want[2])


def test_router_env_torch(monkeypatch, device):
    """``PRIMUS_TURBO_MOE_ROUTER=torch`` keeps the torch ops (same result); a bad value is a
    clear error."""
    from primus_turbo.pytorch.kernels.moe import router_impl

    logits = torch.randn(6, 16, device=device)
    fused = turbo.ops.moe_router_topk(logits, 4, 4, 2, "sigmoid")
    router_impl.router_mode.cache_clear()
    try:
        monkeypatch.setenv(router_impl.ROUTER_ENV, "torch")
        router_impl.router_mode.cache_clear()
        assert not router_impl.fused_router_usable(logits)
        plain = turbo.ops.moe_router_topk(logits, 4, 4, 2, "sigmoid")
        assert torch.equal(fused[2], plain[2])
        torch.testing.assert_close(fused[1], plain[1], rtol=1e-5, atol=1e-6)
        monkeypatch.setenv(router_impl.ROUTER_ENV, "fast")
        router_impl.router_mode.cache_clear()
        with pytest.raises(ValueError, match="PRIMUS_TURBO_MOE_ROUTER.*'auto' or 'torch'"):
            turbo.ops.moe_router_topk(logits, 4)
    finally:
        monkeypatch.delenv(router_impl.ROUTER_ENV, raising=False)
        router_impl.router_mode.cache_clear()


def test_router_large_topk_takes_torch_ops(device):
    """A top-k above ``MAX_TOPK`` (unrolled selection rounds) takes the torch ops: same result
    as the reference."""
    from primus_turbo.pytorch.kernels.moe.router_impl import fused_router_usable
    from primus_turbo.triton.moe.router_kernel import MAX_TOPK

    logits = torch.randn(4, 64, device=device)
    assert not fused_router_usable(logits, MAX_TOPK + 1, 1)
    _, probs, idx = turbo.ops.moe_router_topk(logits, MAX_TOPK + 1, score_function="softmax")
    _, r_probs, r_idx = router_ref(logits, MAX_TOPK + 1, score_function="softmax")
    assert torch.equal(idx, r_idx)
    torch.testing.assert_close(probs, r_probs, rtol=1e-5, atol=1e-6)
