"""moe_permute / moe_unpermute: forward and every gradient vs the loop reference; padding, dropped
copies, zero-token experts, single expert, routing maps, compile, determinism, bad inputs."""

from __future__ import annotations

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.reference.moe import permute_ref, unpermute_ref
from tests.pytorch.test_utils import assert_close, rand

pytestmark = pytest.mark.moe

# (T, H, E, K)
SHAPES = [(9, 20, 4, 2), (1, 7, 1, 1), (13, 33, 5, 3), (0, 8, 3, 2)]
GPU_SHAPES = [(4096, 7168, 32, 8), (2000, 2880, 32, 4)]


def skewed_topk(t: int, e: int, k: int, device, zero_experts: int = 1) -> torch.Tensor:
    """Distinct experts per token, non-uniform load; the last ``zero_experts`` get nothing."""
    live = max(e - zero_experts, k)
    w = torch.linspace(1.0, 0.1, live, device=device).expand(t, live)
    return torch.multinomial(w, k, replacement=False).to(torch.int64)


def _ref_weights(probs, tok, cp):
    valid = tok >= 0
    w = probs[tok.clamp(min=0), cp.clamp(min=0)]
    return torch.where(valid, w, torch.zeros_like(w))


def _check(t, h, e, k, dtype, pad, device, with_probs=True):
    x = rand(t, h, dtype=dtype, device=device, requires_grad=True)
    idx = skewed_topk(t, e, k, device) if t else torch.zeros(0, k, dtype=torch.int64, device=device)
    probs = torch.rand(t, k, device=device).requires_grad_(with_probs)
    out = turbo.ops.moe_permute(
        x, idx, num_local_experts=e, pad_multiple=pad, probs=probs if with_probs else None
    )
    perm, row_map, tpe, overflow, ndisp, _, pprobs = out
    x_ref = x.detach().float().requires_grad_()
    p_ref = probs.detach().clone().requires_grad_()
    r_perm, tok, cp, r_tpe = permute_ref(x_ref, idx, e, pad)
    assert perm.dtype == dtype and perm.shape == r_perm.shape
    assert torch.equal(tpe.cpu(), r_tpe.cpu()) and tpe.dtype == torch.int64
    assert not bool(overflow) and int(ndisp) == perm.shape[0]
    assert_close(perm, r_perm, dtype)
    assert row_map.shape == (t, k) and row_map.dtype == torch.int64

    # unpermute a transformed copy so the gradient reaching permute is not trivial
    y = perm * 1.5
    u, uprobs = turbo.ops.moe_unpermute(
        y, row_map, restore_shape=(t, h), permuted_probs=pprobs if with_probs else None
    )
    w = _ref_weights(p_ref, tok, cp) if with_probs else None
    r_u = unpermute_ref(r_perm * 1.5, tok, t, w)  # fp32 chain (x_ref is fp32)
    assert u.dtype == dtype and u.shape == (t, h)
    assert_close(u, r_u, dtype)
    if with_probs:
        assert torch.equal(uprobs.cpu(), probs.detach().cpu())
    g = rand(t, h, dtype=dtype, device=device)
    u.backward(g)
    r_u.backward(g.float())
    assert x.grad.dtype == dtype
    assert_close(x.grad, x_ref.grad, dtype)
    if with_probs:
        tol = 1e-4 if dtype == torch.float32 else 1e-2 * max(1.0, h**0.5)
        torch.testing.assert_close(probs.grad.cpu(), p_ref.grad.cpu(), rtol=1e-2, atol=tol)


# (dtype, pad_multiple, with_probs): a covering subset (interpreter time budget)
VARIANTS = [
    (torch.bfloat16, 0, True),
    (torch.bfloat16, 4, True),
    (torch.bfloat16, 0, False),
    (torch.float32, 4, False),
    (torch.float32, 0, True),
]


@pytest.mark.parametrize("dtype,pad,with_probs", VARIANTS, ids=str)
@pytest.mark.parametrize("t,h,e,k", SHAPES, ids=str)
def test_permute_unpermute(t, h, e, k, dtype, pad, with_probs, device):
    _check(t, h, e, k, dtype, pad, device, with_probs)


@pytest.mark.gpu
@pytest.mark.parametrize("pad", [0, 128])
@pytest.mark.parametrize("t,h,e,k", GPU_SHAPES, ids=str)
def test_permute_unpermute_gpu_shapes(t, h, e, k, pad, device):
    _check(t, h, e, k, torch.bfloat16, pad, device)


def test_permute_expert_major_stable_order(device):
    idx = torch.tensor([[2, 0], [0, 1], [2, 1]], device=device)
    x = torch.arange(3, dtype=torch.float32, device=device).unsqueeze(1).repeat(1, 4) + 1
    perm, row_map, tpe, *_ = turbo.ops.moe_permute(x, idx, num_local_experts=4)
    assert tpe.tolist() == [2, 2, 2, 0]
    assert perm[:, 0].tolist() == [1, 2, 2, 3, 1, 3]  # expert 0: t0,t1; 1: t1,t2; 2: t0,t2
    assert row_map.tolist() == [[4, 0], [1, 2], [5, 3]]


def test_permute_routing_map_and_dense_probs(device):
    t, e, k, h = 6, 5, 2, 16
    idx = skewed_topk(t, e, k, device).sort(dim=-1).values
    rmap = torch.zeros(t, e, dtype=torch.bool, device=device).scatter(1, idx, True)
    dense = torch.rand(t, e, device=device)
    x = rand(t, h, dtype=torch.bfloat16, device=device)
    a = turbo.ops.moe_permute(
        x, rmap, num_local_experts=e, num_topk=k, probs=dense, probs_layout="routing_map"
    )
    b = turbo.ops.moe_permute(x, idx, num_local_experts=e, probs=dense.gather(1, idx))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[6], b[6])


def test_permute_drops_nonlocal_and_fixed_allocation(device):
    t, h, e = 5, 8, 3
    idx = torch.tensor([[0, 3], [1, -1], [2, 0], [4, 1], [0, 2]], device=device)
    x = rand(t, h, dtype=torch.float32, device=device)
    perm, row_map, tpe, overflow, ndisp, _, _ = turbo.ops.moe_permute(x, idx, num_local_experts=e)
    assert perm.shape[0] == t * 2 and tpe.tolist() == [3, 2, 2] and int(ndisp) == 7
    assert (row_map < 0).sum().item() == 3
    assert torch.count_nonzero(perm[7:]) == 0  # rows of dropped copies stay zero
    u, _ = turbo.ops.moe_unpermute(perm, row_map)
    keep = ((idx >= 0) & (idx < e)).sum(1, keepdim=True).float()
    assert_close(u, x * keep, torch.float32)
    # fixed allocation smaller than needed: overflow flagged, extra copies dropped
    perm2, row_map2, _, overflow2, ndisp2, _, _ = turbo.ops.moe_permute(
        x, idx, num_local_experts=e, num_permuted_tokens=4
    )
    assert perm2.shape[0] == 4 and bool(overflow2) and int(ndisp2) == 4
    assert (row_map2 >= 0).sum().item() == 4


def test_permute_torch_compile(device):
    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"

    def step(x, idx, probs):
        perm, row_map, _, _, _, _, pprobs = turbo.ops.moe_permute(
            x, idx, num_local_experts=4, probs=probs
        )
        return turbo.ops.moe_unpermute(perm * 2.0, row_map, permuted_probs=pprobs)[0]

    fn = torch.compile(step, fullgraph=True, backend=backend)
    x = rand(7, 24, dtype=torch.bfloat16, device=device, requires_grad=True)
    idx = skewed_topk(7, 4, 2, device, zero_experts=0)
    probs = torch.rand(7, 2, device=device, requires_grad=True)
    out = fn(x, idx, probs)
    out.backward(torch.ones_like(out))
    expect = x.detach().float() * 2.0 * probs.detach().sum(1, keepdim=True)
    assert_close(out, expect, torch.bfloat16)
    assert_close(x.grad, (2.0 * probs.detach().sum(1, keepdim=True)).expand(7, 24), torch.bfloat16)


@pytest.mark.deterministic
def test_permute_unpermute_deterministic(device):
    t, h, e, k = (16, 64, 4, 2) if device == "cpu" else (8192, 4096, 32, 8)
    x = rand(t, h, dtype=torch.bfloat16, device=device, requires_grad=True)
    idx = skewed_topk(t, e, k, device)
    probs = torch.rand(t, k, device=device, requires_grad=True)
    g = rand(t, h, dtype=torch.bfloat16, device=device)
    first = None
    for _ in range(3):
        x.grad = probs.grad = None
        perm, row_map, *_, pprobs = turbo.ops.moe_permute(
            x, idx, num_local_experts=e, pad_multiple=16, probs=probs
        )
        u, _ = turbo.ops.moe_unpermute(perm * 1.5, row_map, permuted_probs=pprobs)
        u.backward(g)
        cur = (perm.detach().clone(), u.detach().clone(), x.grad.clone(), probs.grad.clone())
        if first is None:
            first = cur
        for a, b in zip(first, cur, strict=True):
            assert torch.equal(a, b)


def test_permute_bad_inputs(device):
    x = rand(4, 8, dtype=torch.bfloat16, device=device)
    idx = torch.zeros(4, 2, dtype=torch.int64, device=device)
    with pytest.raises(TypeError, match="moe_permute.*'expert_map'.*dtype"):
        turbo.ops.moe_permute(x, idx.float(), num_local_experts=2)
    with pytest.raises(ValueError, match="moe_permute.*'expert_map'.*4 rows"):
        turbo.ops.moe_permute(x, idx[:3], num_local_experts=2)
    with pytest.raises(ValueError, match="moe_permute.*'num_local_experts'"):
        turbo.ops.moe_permute(x, idx, num_local_experts=0)
    with pytest.raises(ValueError, match="moe_permute.*'probs'.*shape"):
        turbo.ops.moe_permute(x, idx, num_local_experts=2, probs=torch.rand(4, 3, device=device))
    with pytest.raises(TypeError, match="moe_permute.*'tokens'.*fp8"):  # see test_moe_fp8.py
        turbo.ops.moe_permute(x, idx, num_local_experts=2, use_fp8=True)
    with pytest.raises(ValueError, match="moe_unpermute.*'restore_shape'"):
        turbo.ops.moe_unpermute(x, idx, restore_shape=(5, 8))
    with pytest.raises(ValueError, match="moe_unpermute.*'permuted_probs'"):
        turbo.ops.moe_unpermute(x, idx, permuted_probs=torch.rand(3, device=device))


def test_permute_torch_fallback_matches_triton(device, monkeypatch):
    """The non-Triton row ops (CPU without the interpreter) match the kernels, padding included."""
    from primus_turbo.pytorch.kernels.moe import permute_impl

    t, h, e, k = 7, 12, 4, 2
    x = rand(t, h, dtype=torch.float32, device=device, requires_grad=True)
    idx = skewed_topk(t, e, k, device)
    probs = torch.rand(t, k, device=device, requires_grad=True)

    def run(pad):
        x.grad = probs.grad = None
        perm, row_map, *_, pprobs = turbo.ops.moe_permute(
            x, idx, num_local_experts=e, pad_multiple=pad, probs=probs
        )
        u, _ = turbo.ops.moe_unpermute(perm * 1.5, row_map, permuted_probs=pprobs)
        u.backward(torch.ones_like(u))
        return perm.detach(), u.detach(), x.grad.clone(), probs.grad.clone()

    firsts = [run(0), run(4)]  # unpadded: the Triton map kernels; padded: torch maps (sync)
    monkeypatch.setattr(permute_impl, "_use_triton", lambda t: False)
    for first, pad in zip(firsts, (0, 4), strict=True):
        for a, b in zip(first, run(pad), strict=True):
            assert_close(b, a, torch.float32)


# (T, K, E, pad_multiple, num_out): drops (ids -1 and E), padding, fixed allocations that cut
# rows off or leave rows unused, one expert, no tokens, more experts than chunk rows
MAP_CASES = [(7, 2, 4, 0, 14), (33, 3, 5, 0, 99), (50, 4, 8, 4, 172), (20, 2, 3, 0, 25),
             (20, 2, 3, 0, 45), (17, 2, 6, 8, 200), (0, 2, 4, 0, 0), (40, 1, 1, 0, 40),
             (9, 3, 40, 2, 30)]  # fmt: skip


@pytest.mark.parametrize("case", MAP_CASES, ids=str)
def test_route_map_kernel_matches_torch_maps(case, device):
    """The two-launch counting-sort maps equal the torch (stable sort) maps exactly."""
    from primus_turbo.pytorch.ops.moe import _build_maps
    from primus_turbo.triton.moe.route_map_kernel import build_route_maps

    t, k, e, pad, n = case
    for dtype in (torch.int64, torch.int32):
        idx = torch.randint(-1, e + 1, (t, k), device=device, dtype=dtype)
        probs = torch.rand(t, k, device=device)
        row_map, src_map, tpe, total, _ = _build_maps(idx, e, pad, n)
        got = build_route_maps(idx, e, pad, n, probs)
        assert torch.equal(got[0], row_map) and torch.equal(got[1], src_map)
        assert torch.equal(got[2], tpe)
        assert int(got[3]) == min(int(total), n) and bool(got[4]) == (int(total) > n)
        want_pp = probs.reshape(-1).index_select(0, src_map.clamp(min=0)) * (src_map >= 0)
        assert torch.equal(got[5], want_pp)


@pytest.mark.gpu
def test_permute_swiglu_unpermute_no_host_sync(device):
    """Router -> permute -> swiglu_with_probs -> unpermute, forward and backward, with CUDA's
    sync debug mode set to error: no step may synchronise with the host."""
    t, h, e, k = 512, 256, 16, 4
    logits = torch.randn(t, e, device=device, requires_grad=True)
    x = rand(t, 2 * h, dtype=torch.bfloat16, device=device, requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _, probs, idx = turbo.ops.moe_router_topk(logits, k, groups=4, selected_groups=2)
        perm, row_map, tpe, *_, pprobs = turbo.ops.moe_permute(
            x, idx, num_local_experts=e, probs=probs
        )
        a = turbo.ops.swiglu_with_probs(perm, pprobs)
        out, _ = turbo.ops.moe_unpermute(a, row_map)
        out.backward(torch.ones_like(out))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert logits.grad is not None and x.grad is not None
    assert int(tpe.sum()) == t * k


def test_permute_routing_map_with_fewer_than_topk(device):
    rmap = torch.tensor([[True, False, True], [False, True, False]], device=device)
    x = rand(2, 8, dtype=torch.float32, device=device)
    perm, row_map, tpe, *_ = turbo.ops.moe_permute(x, rmap, num_local_experts=3, num_topk=2)
    assert tpe.tolist() == [1, 1, 1]
    assert row_map.tolist() == [[0, 2], [1, -1]]
    u, _ = turbo.ops.moe_unpermute(perm, row_map)
    assert_close(u, x * torch.tensor([[2.0], [1.0]], device=device), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "t,k,e,pad,n",
    [(4096, 8, 128, 0, 32768), (4096, 8, 32, 128, 36864), (65536, 8, 256, 0, 524288),
     (4096, 2, 8, 0, 6000), (3000, 4, 32, 16, 20000)],
    ids=str,
)  # fmt: skip
def test_route_map_kernel_gpu_shapes(t, k, e, pad, n, device):
    """The GPU compile of the map kernels (E_PAD up to 256, many chunks) at model sizes."""
    from primus_turbo.pytorch.ops.moe import _build_maps
    from primus_turbo.triton.moe.route_map_kernel import build_route_maps

    idx = skewed_topk(t, e, k, device)
    idx[::97, 0] = -1  # some dropped copies
    probs = torch.rand(t, k, device=device)
    row_map, src_map, tpe, total, _ = _build_maps(idx, e, pad, n)
    got = build_route_maps(idx.to(torch.int32), e, pad, n, probs)
    assert torch.equal(got[0], row_map) and torch.equal(got[1], src_map)
    assert torch.equal(got[2], tpe)
    assert int(got[3]) == min(int(total), n) and bool(got[4]) == (int(total) > n)
    want_pp = probs.reshape(-1).index_select(0, src_map.clamp(min=0)) * (src_map >= 0)
    assert torch.equal(got[5], want_pp)


@pytest.mark.parametrize("pad,n_out,with_map", [(0, -1, False), (4, 40, True), (0, 10, False)])
def test_permute_impls_v1_v2_agree(pad, n_out, with_map, device, monkeypatch):
    """PRIMUS_TURBO_MOE_PERMUTE_IMPL=v1 and v2 give the same maps, rows and every gradient
    (strided top-k ids as the router returns them, padding, dropped copies, probs gradient
    through both permuted and unpermuted probs)."""
    t, h, e, k = 11, 20, 4, 2
    x0 = rand(t, h, dtype=torch.bfloat16, device=device)
    ids = torch.stack([torch.randperm(e + 1, device=device)[:k] for _ in range(t)])
    wide = torch.zeros(t, 2 * k, dtype=torch.int64, device=device)
    wide[:, ::2] = ids
    ids = wide[:, ::2]  # a strided view, as the router returns; id e is dropped (non-local)
    p0 = torch.rand(t, k, device=device)
    outs = {}
    for impl in ("v1", "v2"):
        monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_IMPL", impl)
        x = x0.clone().requires_grad_()
        p = p0.clone().requires_grad_()
        perm, rmap, tpe, ovf, nd, _, pp = turbo.ops.moe_permute(
            x, ids, num_local_experts=e, pad_multiple=pad, num_permuted_tokens=n_out, probs=p
        )
        u, up = turbo.ops.moe_unpermute(perm * 1.5, rmap, permuted_probs=pp)
        (u.float().sum() + (pp * 0.5).sum() + (up * 0.25).sum()).backward()
        outs[impl] = [perm, rmap, tpe, ovf, nd, pp, u, up, x.grad, p.grad]
        if with_map:  # the unweighted unpermute (no probs) and its backward
            y = perm.detach().clone().requires_grad_()
            u2, _ = turbo.ops.moe_unpermute(y, rmap)
            u2.float().square().sum().backward()
            outs[impl] += [u2, y.grad]
    for a, b in zip(outs["v1"], outs["v2"], strict=True):
        assert torch.equal(a, b) if a.dtype != torch.float32 else torch.allclose(a, b)


def test_permute_impl_env_validated(monkeypatch):
    """PRIMUS_TURBO_MOE_PERMUTE_IMPL: v1/v2 (any case) are accepted, anything else raises naming
    the variable, the allowed values and the value given."""
    from primus_turbo.pytorch.kernels.moe.permute_v2_impl import permute_impl_choice

    monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_IMPL", " V1 ")
    assert permute_impl_choice() == "v1"
    monkeypatch.delenv("PRIMUS_TURBO_MOE_PERMUTE_IMPL")
    assert permute_impl_choice() == "v2"
    monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_IMPL", "v3")
    with pytest.raises(ValueError, match=r"PRIMUS_TURBO_MOE_PERMUTE_IMPL.*'v1', 'v2'.*'v3'"):
        permute_impl_choice()


def test_permute_probs_on_another_device(device):
    """probs / permuted_probs on a device other than the tokens' (here the meta device): the
    standard device error, not a copy failure inside the gather or the kernel."""
    x = rand(4, 8, dtype=torch.bfloat16, device=device)
    idx = torch.zeros(4, 2, dtype=torch.int64, device=device)
    other = torch.rand(4, 2, device="meta")
    with pytest.raises(RuntimeError, match="moe_permute.*'expert_map/probs'.*one device"):
        turbo.ops.moe_permute(x, idx, num_local_experts=2, probs=other)
    with pytest.raises(RuntimeError, match="moe_permute.*'expert_map/probs'.*one device"):
        turbo.ops.moe_permute(x, idx, num_local_experts=2, probs=torch.rand(4, 2).to("meta"),
                              probs_layout="routing_map")  # fmt: skip
    y, row_map, *_ = turbo.ops.moe_permute(x, idx, num_local_experts=2)
    with pytest.raises(RuntimeError, match="moe_unpermute.*'permuted_tokens/permuted_probs'"):
        turbo.ops.moe_unpermute(y, row_map, permuted_probs=torch.rand(y.shape[0], device="meta"))


@pytest.mark.gpu
def test_permute_round_trip_past_2_31_elements(device):
    """T=65536, K=8, H=7168: the permuted [524288, 7168] tensor has 3.8e9 elements (7 GiB);
    unpermute(permute(x)) sums the K copies of every row: exactly 8 * x in fp32, so bitwise."""
    t, k, h, e = 65536, 8, 7168, 128
    x = rand(t, h, dtype=torch.bfloat16, device=device)
    idx = torch.randint(0, e, (t, k), device=device)
    y, row_map, *_ = turbo.ops.moe_permute(x, idx, num_local_experts=e)
    assert y.shape == (t * k, h)
    out, _ = turbo.ops.moe_unpermute(y, row_map)
    del y
    assert torch.equal(out, x * 8)


def _run_v2_chain(x0, ids, p0, e, pad, n_out):
    """permute -> weighted unpermute (probs gradient) and an unweighted unpermute whose backward
    takes the column-split path; every output and gradient."""
    x = x0.clone().requires_grad_()
    p = p0.clone().requires_grad_()
    perm, rmap, tpe, ovf, nd, _, pp = turbo.ops.moe_permute(
        x, ids, num_local_experts=e, pad_multiple=pad, num_permuted_tokens=n_out, probs=p
    )
    u, up = turbo.ops.moe_unpermute(perm * 1.5, rmap, permuted_probs=pp)
    (u.float().sum() + (pp * 0.5).sum() + (up * 0.25).sum()).backward()
    y = perm.detach().clone().requires_grad_()
    w = pp.detach().clone().requires_grad_()
    u2, _ = turbo.ops.moe_unpermute(y, rmap)
    u3, _ = turbo.ops.moe_unpermute(y * 0.5, rmap, permuted_probs=w.detach())  # dw not needed
    (u2.float().square().sum() + u3.float().sum()).backward()
    return [perm, rmap, tpe, ovf, nd, pp, u, up, x.grad, p.grad, u2, u3, y.grad]


# (geometry, permute copy mode): the v2 geometry always copies in the map kernel
GEOM_COPIES = [("v2", "fused"), ("2d", "gather"), ("2d", "fused")]


@pytest.mark.parametrize(
    "dtype,pad,n_out,splits,chunks",
    [
        (torch.bfloat16, 0, -1, "0", "0"),
        (torch.bfloat16, 4, 48, "2", "2"),
        (torch.float32, 0, 12, "3", "1"),
    ],
    ids=str,
)
def test_permute_geometry_2d_matches_v2(dtype, pad, n_out, splits, chunks, device, monkeypatch):
    """PRIMUS_TURBO_MOE_PERMUTE_GEOM=2d (column splits of the fused permute and of the unpermute
    backward, wide count-table steps) gives bitwise the results of the v2 geometry: row blocks
    made small (MAX_BLOCK_BYTES) so H=40 spans several blocks and splits, padding, dropped and
    non-local copies, a fixed allocation that overflows, probs gradients."""
    from primus_turbo.triton.moe import permute_v2_plan as kern

    monkeypatch.setattr(kern, "MAX_BLOCK_BYTES", 32)
    t, h, e, k = 13, 40, 5, 3
    x0 = rand(t, h, dtype=dtype, device=device)
    ids = torch.stack([torch.randperm(e + 1, device=device)[:k] for _ in range(t)])
    ids[2, 0] = -1  # dropped
    p0 = torch.rand(t, k, device=device)
    outs = {}
    monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_IMPL", "v2")
    for geom, copy in GEOM_COPIES:
        monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_GEOM", geom)
        monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_COPY", copy)
        monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_SPLITS", splits)
        monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_CHUNKS", chunks)
        outs[geom, copy] = _run_v2_chain(x0, ids, p0, e, pad, n_out)
    for key in GEOM_COPIES[1:]:
        for a, b in zip(outs[GEOM_COPIES[0]], outs[key], strict=True):
            assert torch.equal(a, b), key


def test_permute_geometry_splits_plan(monkeypatch):
    """Column splits: never more than the blocks, none empty, 1 with the v2 geometry."""
    from primus_turbo.triton.moe import permute_v2_plan as kern

    dev = torch.device("cpu")
    monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_SPLITS", "3")
    for blocks in range(1, 12):
        s, per = kern._splits(dev, 4, blocks, "2d", "permute")
        assert 1 <= s <= min(3, blocks) and (s - 1) * per < blocks <= s * per
        assert kern._splits(dev, 4, blocks, "v2", "permute") == (1, blocks)
    monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_SPLITS", "x")
    with pytest.raises(ValueError, match="PRIMUS_TURBO_MOE_PERMUTE_SPLITS"):
        kern.splits_override()
    monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_CHUNKS", "-4")
    with pytest.raises(ValueError, match="PRIMUS_TURBO_MOE_PERMUTE_CHUNKS"):
        kern._plan_v2(100, 4)
    monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_CHUNKS", "4")
    assert kern._plan_v2(1000, 4)[3] <= 4 and kern._plan_v2(1000, 4, "v2")[3] > 4
    monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_COPY", "scatter")
    with pytest.raises(ValueError, match=r"PRIMUS_TURBO_MOE_PERMUTE_COPY.*'gather', 'fused'"):
        kern.copy_choice(8)
    monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_GEOM", "3d")
    with pytest.raises(ValueError, match=r"PRIMUS_TURBO_MOE_PERMUTE_GEOM.*'2d', 'v2'.*'3d'"):
        kern.geom_choice()


GEOM_GPU_SHAPES = [
    (4096, 2048, 128, 8, 128),
    (2000, 2880, 32, 4, 0),
]


@pytest.mark.gpu
@pytest.mark.parametrize("t,h,e,k,pad", GEOM_GPU_SHAPES, ids=str)
def test_permute_geometry_2d_matches_v2_gpu(t, h, e, k, pad, device, monkeypatch):
    """The bench shapes (and a padded / odd-T pair): 2d and v2 geometries bitwise equal, every
    output and gradient (several column splits and chunks at these sizes)."""
    x0 = rand(t, h, dtype=torch.bfloat16, device=device)
    ids = skewed_topk(t, e, k, device)
    p0 = torch.rand(t, k, device=device)
    outs = {}
    monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_IMPL", "v2")
    for geom, copy in GEOM_COPIES:
        monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_GEOM", geom)
        monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_COPY", copy)
        # padded: a fixed allocation (no host sync, the v2 kernels); unpadded: T*K rows
        outs[geom, copy] = _run_v2_chain(x0, ids, p0, e, pad, t * k + e * pad if pad else -1)
    for key in GEOM_COPIES[1:]:
        for a, b in zip(outs[GEOM_COPIES[0]], outs[key], strict=True):
            assert torch.equal(a, b), key


REDUCE_TILES = ["rows", "1,16,1", "2:32:2:c", "4,64,4,c"]


@pytest.mark.parametrize("t,h", [(13, 40), (1, 24), (37, 70)], ids=str)
def test_unpermute_tile_knob_bitwise(t, h, device, monkeypatch):
    """PRIMUS_TURBO_MOE_UNPERMUTE_TILE (the unpermute forward's tile and grid order): every
    setting gives bitwise the default's output, unpermuted probs and gradients (several column
    blocks, a ragged last one, dropped copies)."""
    e, k = 5, 3
    x0 = rand(t, h, dtype=torch.bfloat16, device=device)
    ids = torch.stack([torch.randperm(e + 1, device=device)[:k] for _ in range(t)])
    ids[0, 0] = -1  # dropped
    p0 = torch.rand(t, k, device=device)
    monkeypatch.setenv("PRIMUS_TURBO_MOE_PERMUTE_IMPL", "v2")
    monkeypatch.delenv("PRIMUS_TURBO_MOE_UNPERMUTE_TILE", raising=False)
    want = _run_v2_chain(x0, ids, p0, e, 0, -1)
    for tile in REDUCE_TILES:
        monkeypatch.setenv("PRIMUS_TURBO_MOE_UNPERMUTE_TILE", tile)
        got = _run_v2_chain(x0, ids, p0, e, 0, -1)
        for a, b in zip(want, got, strict=True):
            assert torch.equal(a, b), tile


@pytest.mark.parametrize("bad", ["8,1024", "3,64,4", "8,64,4,x", "0,64,4", "a,b,c"])
def test_unpermute_tile_knob_rejects(bad, monkeypatch):
    from primus_turbo.triton.moe.permute_v2_plan import reduce_tile

    monkeypatch.setenv("PRIMUS_TURBO_MOE_UNPERMUTE_TILE", bad)
    with pytest.raises(ValueError, match="PRIMUS_TURBO_MOE_UNPERMUTE_TILE"):
        reduce_tile(100, 10)
    monkeypatch.setenv("PRIMUS_TURBO_MOE_UNPERMUTE_TILE", "8,64,4,c")
    assert reduce_tile(100, 10) == (8, 64, 4, True)
    assert reduce_tile(100, 8 * 70000) == (8, 64, 4, False)  # token blocks past grid axis 1
    monkeypatch.setenv("PRIMUS_TURBO_MOE_UNPERMUTE_TILE", "auto")
    assert reduce_tile(2880, 4096, 4, True) == (2, 1024, 4, True)
    assert reduce_tile(2048, 4096, 8, True) == (4, 512, 4, True)
    assert reduce_tile(700, 4096, 4, True) == (4, 512, 4, True)
    assert reduce_tile(100, 4096, 4, True) == (16, 128, 4, True)  # narrow H: the _tile default
    assert reduce_tile(2048, 4096, 8, False) == (8, 512, 8, False)  # the permute backward
    monkeypatch.setenv("PRIMUS_TURBO_MOE_UNPERMUTE_TILE", "rows")
    assert reduce_tile(2880, 4096, 4, True) == (8, 512, 8, False)


@pytest.mark.parametrize("with_w", [True, False])
def test_unpermute_bwd_unfilled_src_verified(with_w, device):
    """The backward with the forward's unfilled inverse map: rows no copy reaches hold garbage
    (valid copy ids of other rows, huge, negative); ``row_map[src[r]] == r`` rejects it, so dead
    rows are zero and the result equals the filled-map path bitwise."""
    from primus_turbo.triton.moe.permute_v2_kernel import reduce_v2_triton, unpermute_bwd_triton

    t, h, e, k, n = 9, 24, 4, 2, 26  # 26 rows, 18 copies (2 dropped): >= 10 dead rows
    ids = torch.stack([torch.randperm(e + 1, device=device)[:k] for _ in range(t)])
    x = rand(t, h, dtype=torch.bfloat16, device=device)
    y, row_map, *_ = turbo.ops.moe_permute(x, ids, num_local_experts=e, num_permuted_tokens=n)
    w = torch.rand(n, device=device) if with_w else None
    _, _, src = reduce_v2_triton(y, row_map, w, y.dtype, with_w, False, True)
    live = torch.zeros(n, dtype=torch.bool, device=device)
    live[row_map[row_map >= 0]] = True
    junk = torch.tensor([0, 1, 2**40, -5, t * k, 3], device=device)
    src[~live] = junk.repeat(n)[: int((~live).sum())]
    g = rand(t, h, dtype=torch.bfloat16, device=device)
    got, _ = unpermute_bwd_triton(g, y, row_map, w, False, src)
    want, _ = unpermute_bwd_triton(g, y, row_map, w, False, None)
    assert torch.equal(got, want) and torch.count_nonzero(got[~live]) == 0
