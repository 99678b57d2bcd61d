"""Session-11 wgrad plans ``vkf`` / ``vkfs`` (``grouped_gemm_vk_flat``: one pipelined loop
over every (tile, full K step) of a program; a tile's last step stores it and starts the next
tile with its tail rows), opt-in via ``PRIMUS_TURBO_GROUPED_GEMM_VK_FLAT``: each forced as the
only wgrad plan vs the fp32 reference and the ``tma`` plan of the same tile (tail rows summed
first: not bitwise), ``vkf`` bitwise ``vkfs``, and the candidate rules."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core.platform import ArchFamily
from tests.pytorch.ops.test_grouped_gemm import CASES, _check_fwd_bwd
from tests.pytorch.ops.test_grouped_gemm_s8_wgrad import _force_vk, _need_tma

pytestmark = pytest.mark.grouped_gemm


def _vk(device, plans, lens, p, q):
    """The wgrad outputs of each forced plan on random ``x [M, p]``, ``y [M, q]``, and the
    fp64 reference."""
    from primus_turbo.pytorch.reference import group_offsets
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    torch.manual_seed(0)
    gl = torch.tensor(lens, device=device)
    x = torch.randn(int(gl.sum()), p, device=device, dtype=torch.bfloat16)
    y = torch.randn(int(gl.sum()), q, device=device, dtype=torch.bfloat16)
    outs = []
    saved = (gk.variable_k_variant, gk.variable_k_plans)
    try:
        for plan in plans:
            gk.variable_k_variant = lambda: "tune"
            gk.variable_k_plans = lambda *a, plan=plan: [plan]
            outs.append(gk.variable_k_triton(x, y, group_offsets(gl), len(lens), x.dtype))
    finally:
        gk.variable_k_variant, gk.variable_k_plans = saved
    ref, start = [], 0
    for n in lens:
        ref.append(x[start : start + n].double().T @ y[start : start + n].double())
        start += n
    return outs, torch.stack(ref)


def _rel_err(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("variant", ["vkf", "vkfs"])
@pytest.mark.parametrize("trans_b", [False, True], ids=["NN", "NT"])
@pytest.mark.parametrize("lens,k,n", [CASES[0], ([0, 9, 0, 40], 32, 24)], ids=str)
def test_grouped_gemm_s11_vkf_fwd_bwd(lens, k, n, trans_b, variant, monkeypatch, device):
    """The op's backward with the wgrad forced through the plan (interpreter tile): ragged
    groups with tails, a group below one K step, empty groups, P / Q not tile multiples."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import configs_interpreter

    if device != "cpu":
        pytest.skip("interpreter tile; on a GPU test_grouped_gemm_s11_vkf_gpu runs the tiles")
    _force_vk(monkeypatch, (variant, configs_interpreter()[0]))
    _check_fwd_bwd(lens, k, n, trans_b, torch.bfloat16, device)


@pytest.mark.parametrize(
    "lens",
    [[5, 0, 37, 16], [16, 32, 0, 0], [3], [0, 0], [40, 1, 15, 17, 0, 33]],
    ids=str,
)
def test_grouped_gemm_s11_vkf_vs_tma(lens, device):
    """Against the ``tma`` plan of the same tile (the tail rows summed first here) and the
    fp64 reference; ``vkf`` bitwise ``vkfs`` (only the store differs); groups with no full
    step add a zero-filled box (exact zeros for empty groups); several tiles per program (3
    interpreter programs, 3 x 2 tiles per group), the virtual first tile stores nothing."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import configs_interpreter

    if device != "cpu":
        pytest.skip("interpreter tile (GPU: test_grouped_gemm_s11_vkf_gpu)")
    cfg = configs_interpreter()[0]
    (tma, vkf, vkfs), ref = _vk(device, [("tma", cfg), ("vkf", cfg), ("vkfs", cfg)], lens, 40, 24)
    assert torch.equal(vkf, vkfs)
    assert _rel_err(vkf, ref) < 1e-2
    assert _rel_err(vkf, tma.double()) < 1e-2
    for i, n in enumerate(lens):
        if n == 0:
            assert torch.count_nonzero(vkf[i]) == 0


def _gpu_plans():
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import (
        VK_FLAT_TILES,
        VK_FLAT_VARIANTS,
    )

    return [(v, cfg) for v in VK_FLAT_VARIANTS for cfg in VK_FLAT_TILES]


@pytest.mark.gpu
@pytest.mark.parametrize("plan", _gpu_plans(), ids=lambda p: f"{p[0]}:{p[1].name}")
def test_grouped_gemm_s11_vkf_gpu(plan, monkeypatch, device):
    """Every session-11 wgrad plan on a ragged MoE-sized shape (empty, 1-row and 7012-row
    groups, N = 768 not a multiple of 256) through the op's backward, and on ``[G, P, Q]``
    blocks with P / Q not tile multiples vs the fp64 reference and the ``tma`` plan of the
    same tile."""
    if device == "cpu":
        pytest.skip("Hopper tiles")
    _need_tma(device)
    _force_vk(monkeypatch, plan)
    _check_fwd_bwd([0, 3000, 1, 0, 64, 255, 2500, 7012], 2048, 768, True, torch.bfloat16,
                   device)  # fmt: skip
    lens = [0, 700, 1, 1500, 129, 63, 2048]
    (tma, ours), ref = _vk(device, [("tma", plan[1]), plan], lens, 640, 520)
    assert _rel_err(ours, ref) < 1e-2
    assert _rel_err(ours, tma.double()) < 1e-2
    assert torch.count_nonzero(ours[0]) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("p,q", [(640, 520), (520, 640)], ids=["P>=Q", "P<Q"])
def test_grouped_gemm_s11_vkf_large_expert_gpu(p, q, monkeypatch, device):
    """The default wgrad path (not forced) for large experts under ``VK_FLAT=1``: the plan
    ``vk_flat_large_expert_plan`` runs untimed and matches the fp64 reference."""
    from primus_turbo.pytorch.reference import group_offsets
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    if device == "cpu":
        pytest.skip("Hopper tiles")
    _need_tma(device)
    monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_VK_FLAT", "1")
    gc.vk_flat_enabled.cache_clear()
    try:
        lens = [3001, 0, 2500, 2691]
        plans = gc.variable_k_plans(ArchFamily.HOPPER, "tune", True, sum(lens) // 4, p, q)
        assert plans == [gc.vk_flat_large_expert_plan(p, q)]
        torch.manual_seed(0)
        gl = torch.tensor(lens, device=device)
        x = torch.randn(sum(lens), p, device=device, dtype=torch.bfloat16)
        y = torch.randn(sum(lens), q, device=device, dtype=torch.bfloat16)
        out = gk.variable_k_triton(x, y, group_offsets(gl), len(lens), torch.bfloat16)
        ref, start = [], 0
        for n in lens:
            ref.append(x[start : start + n].double().T @ y[start : start + n].double())
            start += n
        assert _rel_err(out, torch.stack(ref)) < 1e-2
        assert torch.count_nonzero(out[1]) == 0
    finally:
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_VK_FLAT")
        gc.vk_flat_enabled.cache_clear()


def test_grouped_gemm_s11_vkf_candidates(monkeypatch):
    """Off (default): no ``vkf`` / ``vkfs`` plan anywhere, the large-expert rule unchanged. On:
    the tuner also times them (also for small groups, where the winners list applies), large
    experts take ``vkfs`` on 3 stages by ``P >= Q``; a filter names them as ``variant:tile``
    (a bare tile name keeps the old plans only); the knob is validated."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    def kinds(plans):
        return {v for v, _ in plans}

    hop = ArchFamily.HOPPER
    big = gc.VK_STORE_MIN_AVG_ROWS
    try:
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_VK_FLAT", raising=False)
        gc.vk_flat_enabled.cache_clear()
        assert not kinds(gc.variable_k_plans(hop, "tune", True)) & {"vkf", "vkfs"}
        assert gc.variable_k_plans(hop, "tune", True, big, 7168, 2048) == [
            gc.vk_large_expert_plan(7168, 2048)
        ]
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_VK_FLAT", "1")
        gc.vk_flat_enabled.cache_clear()
        assert {"vkf", "vkfs"} <= kinds(gc.variable_k_plans(hop, "tune", True))
        assert {"vkf", "vkfs"} <= kinds(gc.variable_k_plans(hop, "tune", True, 8))
        assert not kinds(gc.variable_k_plans(hop, "tune", False)) & {"vkf", "vkfs"}
        assert not kinds(gc.variable_k_plans(hop, "tma", True)) & {"vkf", "vkfs"}
        assert not kinds(gc.variable_k_plans(ArchFamily.CPU, "tune", True)) & {"vkf", "vkfs"}
        down = gc.variable_k_plans(hop, "tune", True, big, 7168, 2048)
        gate_up = gc.variable_k_plans(hop, "tune", True, big, 4096, 7168)
        assert down == [("vkfs", gc.VK_FLAT_TILES[1])]
        assert gate_up == [("vkfs", gc.VK_FLAT_TILES[0])]
        assert down[0][1].group_m == 16 and down[0][1].num_stages == 3
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_VK_CONFIG", "vkf:m256n128k64g8w8s3")
        gc.config_filter.cache_clear()
        only = gc.variable_k_plans(hop, "tune", True, big, 4096, 7168)
        assert only == [("vkf", gc.VK_FLAT_TILES[0])]
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_VK_CONFIG", "m256n128k64g8w8s3")
        gc.config_filter.cache_clear()
        assert not kinds(gc.variable_k_plans(hop, "tune", True)) & {"vkf", "vkfs", "tmavs"}
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_VK_FLAT", "maybe")
        gc.vk_flat_enabled.cache_clear()
        with pytest.raises(ValueError, match="PRIMUS_TURBO_GROUPED_GEMM_VK_FLAT"):
            gc.vk_flat_enabled()
    finally:
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_VK_FLAT", raising=False)
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_VK_CONFIG", raising=False)
        gc.vk_flat_enabled.cache_clear()
        gc.config_filter.cache_clear()
