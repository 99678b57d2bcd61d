"""Session-8 plans of the TRITON grouped GEMM: the GROUP_M 16 TMA tile (a default forward /
dgrad candidate since call 8.1) and the wgrad plans under test (opt-in): the TMA-store
epilogue ``tmavs`` of the variable-K TMA kernel and the tiles ``S8_VK_TILES`` (a 2-CTA
128x128 tile with 8 warps capped at 128 registers, GROUP_M 16 bands), each forced as the only
plan, vs the fp32 reference and bitwise vs the pointer-store ``tma`` plan."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core import BackendType, GlobalBackendManager
from primus_turbo.pytorch.core.platform import ArchFamily
from tests.pytorch.ops.test_grouped_gemm import CASES, _check_fwd_bwd

pytestmark = pytest.mark.grouped_gemm


def _need_tma(device):
    from primus_turbo.pytorch.core.platform import cuda_capability

    if device != "cpu" and (cuda_capability() or (0, 0)) < (9, 0):
        pytest.skip("TMA descriptors need CUDA sm_90+")


def _force_vk(monkeypatch, plan, fwd=None):
    """Every wgrad of the TRITON backend through ``plan``; the forward / dgrad through ``fwd``
    where given."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    monkeypatch.setattr(gk, "variable_k_variant", lambda: "tune")
    monkeypatch.setattr(gk, "variable_k_plans", lambda *a: [plan])
    if fwd is not None:
        monkeypatch.setattr(gk, "kernel_variant", lambda: "tune")
        monkeypatch.setattr(gk, "forward_plans", lambda *a: [fwd])
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)


@pytest.mark.parametrize("trans_b", [False, True], ids=["NN", "NT"])
@pytest.mark.parametrize("lens,k,n", [CASES[0], CASES[3], ([0, 9, 0, 40], 32, 24)], ids=str)
def test_grouped_gemm_s8_vk_tmavs(lens, k, n, trans_b, monkeypatch, device):
    """Plan ``tmavs`` (interpreter tile; the Hopper tiles in the *_gpu tests): ragged groups
    with partial K steps, empty groups, P / Q not multiples of the tile (clipped by the
    descriptor); K = 40 / N = 24: rows of 80 / 48 bytes (TMA store usable)."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import configs_interpreter

    if device != "cpu":
        pytest.skip("interpreter tile; on a GPU the *_gpu tests run the real Hopper tiles")
    _force_vk(monkeypatch, ("tmavs", configs_interpreter()[0]))
    _check_fwd_bwd(lens, k, n, trans_b, torch.bfloat16, device)


def _vk_pair(device, cfg, lens, p, q):
    """``(tma, tmavs)`` wgrad outputs of one tile on random ``x [M, p]``, ``y [M, q]``."""
    from primus_turbo.pytorch.reference import group_offsets
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    torch.manual_seed(0)
    gl = torch.tensor(lens, device=device)
    x = torch.randn(int(gl.sum()), p, device=device, dtype=torch.bfloat16)
    y = torch.randn(int(gl.sum()), q, device=device, dtype=torch.bfloat16)
    outs = []
    saved = (gk.variable_k_variant, gk.variable_k_plans)
    try:
        for v in ("tma", "tmavs"):
            gk.variable_k_variant = lambda: "tune"
            gk.variable_k_plans = lambda *a, v=v: [(v, cfg)]
            outs.append(gk.variable_k_triton(x, y, group_offsets(gl), len(lens), x.dtype))
    finally:
        gk.variable_k_variant, gk.variable_k_plans = saved
    return outs


def test_grouped_gemm_s8_vk_tmavs_bitwise(device):
    """The TMA store only moves the epilogue: bitwise the pointer-store plan's output (same
    tile, same K order), with P and Q not multiples of the tile and an empty group."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import configs_interpreter

    if device != "cpu":
        pytest.skip("interpreter tile (GPU: test_grouped_gemm_s8_vk_plans_gpu)")
    a, b = _vk_pair(device, configs_interpreter()[0], [5, 0, 37, 16], 40, 24)
    assert torch.equal(a, b)


def _gpu_plan_list():
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    cfgs = {c.name: c for c in gc.tma_configs(ArchFamily.HOPPER, wgrad=True)}
    return [(v, cfgs[name]) for v, name in gc.HOPPER_S8_PLANS["vk"]]


@pytest.mark.gpu
@pytest.mark.parametrize("plan", _gpu_plan_list(), ids=lambda p: f"{p[0]}:{p[1].name}")
def test_grouped_gemm_s8_vk_plans_gpu(plan, monkeypatch, device):
    """Every session-8 wgrad plan on a ragged MoE-sized shape (empty, 1-row and 7012-row
    groups, N = 768 not a multiple of 256): it compiles, fits shared memory (2 CTAs per SM
    for the 128x128 maxnreg tile) and matches; ``tmavs`` bitwise == ``tma`` on the tile."""
    if device == "cpu":
        pytest.skip("Hopper tiles")
    _need_tma(device)
    _force_vk(monkeypatch, plan)
    lens = [0, 3000, 1, 0, 64, 255, 2500, 7012]
    _check_fwd_bwd(lens, 2048, 768, True, torch.bfloat16, device)
    if plan[0] == "tmavs":
        a, b = _vk_pair(device, plan[1], [0, 700, 1, 1500, 129], 640, 520)
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("trans_b", [False, True], ids=["NN", "NT"])
def test_grouped_gemm_s8_g16_gpu(trans_b, monkeypatch, device):
    """The GROUP_M 16 TMA tile forced for the forward / dgrad, on a ragged shape."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import S8_G16

    if device == "cpu":
        pytest.skip("Hopper tiles")
    _need_tma(device)
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    monkeypatch.setattr(gk, "kernel_variant", lambda: "tune")
    monkeypatch.setattr(gk, "forward_plans", lambda *a: [("tma", S8_G16)])
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)
    _check_fwd_bwd([0, 3000, 1, 0, 64, 255, 2500, 7012], 2048, 768, trans_b, torch.bfloat16,
                   device)  # fmt: skip


def test_grouped_gemm_s8_candidates(monkeypatch):
    """GROUP_M 16 is a default forward / dgrad candidate; the session-8 wgrad plans are not
    (not even for small groups or in the ``s5`` set); ``..._CANDIDATES=s8`` adds
    ``HOPPER_S8_PLANS``; a config filter names them (``tmavs:`` explicitly; a bare tile name
    keeps the ``tma`` plan only)."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    def names(plans):
        return {(v, c.name) for v, c in plans}

    def new(plans):
        return {p for p in plans if p[0] in gc.S8_VK_VARIANTS or p[1] in gc.S8_VK_TILES}

    hop = ArchFamily.HOPPER
    try:
        for cands in ("", "s5"):
            monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", cands)
            gc.candidate_set.cache_clear()
            fwd = names(gc.forward_plans(hop, "tune", True, 4096, True))
            assert ("tma", gc.S8_G16.name) in fwd
            assert not new(gc.variable_k_plans(hop, "tune", True))
            assert not new(gc.variable_k_plans(hop, "tune", True, 8))  # small groups
            small = gc.forward_plans(hop, "tune", True, 4096, True, 8)
            assert not {p for p in small if p[1] in gc.S8_VK_TILES}  # wgrad tiles only
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", "s8")
        gc.candidate_set.cache_clear()
        vk = names(gc.variable_k_plans(hop, "tune", True))
        assert vk == set(gc.HOPPER_WINNERS["vk"] + gc.HOPPER_S8_PLANS["vk"])
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES")
        gc.candidate_set.cache_clear()
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_VK_CONFIG",
                           "tmavs:m256n128k64g8w8s4,m128n128k64g8w8s3_maxnreg128")  # fmt: skip
        gc.config_filter.cache_clear()
        assert names(gc.variable_k_plans(hop, "tune", True)) == {
            ("tmavs", "m256n128k64g8w8s4"),
            ("tma", "m128n128k64g8w8s3_maxnreg128"),
        }
    finally:
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", raising=False)
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_VK_CONFIG", raising=False)
        gc.candidate_set.cache_clear()
        gc.config_filter.cache_clear()
