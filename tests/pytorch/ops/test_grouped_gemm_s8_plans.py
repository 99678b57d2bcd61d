"""Session-8 forward/dgrad/wgrad plans of the TRITON grouped GEMM (opt-in until measured): the
epilogue sub-tiled into two ``[BM, BN / 2]`` stores on the flat pointer kernel (``flate``) and
the flat TMA kernel (``tmae``), and the BLOCK_K 128 TMA tiles (``S8_TILES``), each forced as
the only plan, vs the fp32 reference."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core import BackendType, GlobalBackendManager
from primus_turbo.pytorch.core.platform import ArchFamily
from tests.pytorch.ops.test_grouped_gemm import CASES, _check_fwd_bwd

pytestmark = pytest.mark.grouped_gemm

_GPU_SMALL = "interpreter tile; on a GPU the *_gpu tests run the real Hopper tiles"


def _force(monkeypatch, device, variant, cfg=None, vk=None):
    """Every forward/dgrad of the TRITON backend through ``(variant, cfg)`` (default: the
    interpreter's first tile on the CPU); the wgrad through the plan ``vk`` where given."""
    from primus_turbo.pytorch.core.platform import cuda_capability
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import configs_interpreter

    needs_tma = variant.startswith("tma") or vk is not None
    if device != "cpu" and needs_tma and (cuda_capability() or (0, 0)) < (9, 0):
        pytest.skip("TMA descriptors need CUDA sm_90+")
    if cfg is None and device != "cpu":
        pytest.skip(_GPU_SMALL)
    cfg = cfg or configs_interpreter()[0]
    monkeypatch.setattr(gk, "kernel_variant", lambda: "tune")
    monkeypatch.setattr(gk, "forward_plans", lambda *a: [(variant, cfg)])
    if vk is not None:
        monkeypatch.setattr(gk, "variable_k_variant", lambda: "tune")
        monkeypatch.setattr(gk, "variable_k_plans", lambda *a: [vk])
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)


@pytest.mark.parametrize("trans_b", [False, True], ids=["NN", "NT"])
@pytest.mark.parametrize("lens,k,n", [CASES[0], ([0, 9, 0, 40], 32, 24)], ids=str)
@pytest.mark.parametrize("variant", ["flate", "tmae"])
def test_grouped_gemm_s8_subtile(variant, lens, k, n, trans_b, monkeypatch, device):
    """Ragged groups (full and partial tiles), empty groups, N not a multiple of the tile
    (N = 24 with a 16-wide tile: the second half of the last column tile is fully masked)."""
    _force(monkeypatch, device, variant)
    _check_fwd_bwd(lens, k, n, trans_b, torch.bfloat16, device)


def _gpu_plans():
    """Every Hopper plan of the session-8 variants (the sub-tiled epilogue on every 8-warp
    tile of at least 128x256 with TMA, on 128x256 with pointers; the S8_TILES TMA tiles)."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    hop = ArchFamily.HOPPER
    flat = [("flate", c) for c in gc.grouped_gemm_configs(hop) if gc.flate_ok(c)]
    tma = [("tmae", c) for c in gc.tma_configs(hop) if gc._s8_ok(c) and c not in gc.S8_TILES]
    return flat + tma + [("tma", c) for c in gc.S8_TILES]


@pytest.mark.gpu
@pytest.mark.parametrize("plan", _gpu_plans(), ids=lambda p: f"{p[0]}:{p[1].name}")
def test_grouped_gemm_s8_plans_gpu(plan, monkeypatch, device):
    """Every new Hopper plan on a ragged MoE-sized shape (empty, 1-row and 7000-row groups,
    N = 768 not a multiple of 256): it compiles, fits shared memory and matches. NT: its
    forward (NT) and dgrad (NN) are the plan's two kernels; the wgrad runs the plan's tile
    where it is one of ``S8_TILES`` (TMA wgrad), else its default."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    vk = ("tma", plan[1]) if plan[1] in gc.S8_TILES else None
    _force(monkeypatch, device, plan[0], plan[1], vk=vk)
    lens = [0, 3000, 1, 0, 64, 255, 2500, 7012]  # 12832 rows, a multiple of 16
    _check_fwd_bwd(lens, 2048, 768, True, torch.bfloat16, device)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["flate", "tmae"])
def test_grouped_gemm_s8_subtile_matches_default_gpu(variant, monkeypatch, device):
    """The sub-tiled epilogue only moves the stores: bitwise the same output as the plan it
    splits (same tile, same K order), incl. a group's ragged last tile and N % 256 != 0."""
    from primus_turbo.pytorch.core.platform import cuda_capability
    from primus_turbo.pytorch.reference import group_offsets
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import GemmConfig

    if device == "cpu" or (cuda_capability() or (0, 0)) < (9, 0):
        pytest.skip("Hopper tiles")
    cfg = GemmConfig(128, 256, 64, 8, 8, 3)
    base = "flat" if variant == "flate" else "tma"
    torch.manual_seed(0)
    lens = torch.tensor([0, 700, 1, 1500, 129], device=device)
    a = torch.randn(int(lens.sum()), 512, device=device, dtype=torch.bfloat16)
    b = torch.randn(5, 640, 512, device=device, dtype=torch.bfloat16)
    offs = group_offsets(lens)
    outs = []
    for v in (base, variant):
        monkeypatch.setattr(gk, "kernel_variant", lambda: "tune")
        monkeypatch.setattr(gk, "forward_plans", lambda *args, v=v: [(v, cfg)])
        outs.append(gk.grouped_gemm_triton(a, b, offs, True))
    assert torch.equal(outs[0], outs[1])


def test_grouped_gemm_s8_candidates(monkeypatch):
    """The default Hopper candidates hold no session-8 plan (not even for small groups or in
    the ``s5`` set); ``..._CANDIDATES=s8`` adds ``HOPPER_S8_PLANS``; a config filter names
    them (``tmae:``, ``flate:``, the ``S8_TILES``)."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    def names(plans):
        return {(v, c.name) for v, c in plans}

    def new(plans):
        return {p for p in plans if p[0] in gc.S8_VARIANTS or p[1] in gc.S8_TILES}

    hop = ArchFamily.HOPPER
    try:
        for cands in ("", "s5"):
            monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", cands)
            gc.candidate_set.cache_clear()
            assert not new(gc.forward_plans(hop, "tune", True, 4096, True))
            assert not new(gc.forward_plans(hop, "tune", True, 4096, True, 8))  # small groups
            assert not new(gc.variable_k_plans(hop, "tune", True))
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", "s8")
        gc.candidate_set.cache_clear()
        fwd = names(gc.forward_plans(hop, "tune", True, 4096, True))
        assert fwd == set(gc.HOPPER_WINNERS["fwd"] + gc.HOPPER_S8_PLANS["fwd"])
        vk = names(gc.variable_k_plans(hop, "tune", True))
        assert vk == set(gc.HOPPER_WINNERS["vk"] + gc.HOPPER_S8_PLANS["vk"])
        # NN with K not a multiple of 128: no k128 plan
        assert not {c.block_k for _, c in gc.forward_plans(hop, "tune", True, 4160, False)} - {64}
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES")
        gc.candidate_set.cache_clear()
        monkeypatch.setenv(
            "PRIMUS_TURBO_GROUPED_GEMM_CONFIG",
            "tmae:m128n256k64g8w8s4,flate:m128n256k64g8w8s3,tma:m128n256k128g8w8s2",
        )
        gc.config_filter.cache_clear()
        assert names(gc.forward_plans(hop, "tune", True, 4096, True)) == {
            ("tmae", "m128n256k64g8w8s4"),
            ("flate", "m128n256k64g8w8s3"),
            ("tma", "m128n256k128g8w8s2"),
        }
    finally:
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", raising=False)
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_CONFIG", raising=False)
        gc.candidate_set.cache_clear()
        gc.config_filter.cache_clear()
