"""Session-5 forward/dgrad plans of the TRITON grouped GEMM: the flat TMA kernel's TMA-store /
N-major variants (``tmas``, ``tman``, ``tmasn``), each forced as the only plan, vs the fp32
reference. (The warp-specialised plans ``ws`` / ``f8ws`` and their kernel ``grouped_gemm_ws``
were removed in session 6: they deadlocked on the H200.)"""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core import BackendType, GlobalBackendManager
from primus_turbo.pytorch.core.platform import ArchFamily
from tests.pytorch.ops.test_grouped_gemm import CASES, _check_fwd_bwd

pytestmark = pytest.mark.grouped_gemm

VARIANTS = ("tmas", "tman", "tmasn")

# The interpreter's 16x16 one-warp tile is no plan of any candidate list (warp specialisation
# and wgmma need 4-warp groups; on sm_90 it compiles to mma.sync without specialisation), so
# on a GPU only the ``*_gpu`` tests run, with the real Hopper tiles.
_GPU_SMALL = "interpreter tile; on a GPU the *_gpu tests run the real Hopper tiles"


def _force_plan(monkeypatch, device, variant, cfg=None):
    """Every forward/dgrad of the TRITON backend through ``(variant, cfg)`` (default: the
    interpreter's first tile on the CPU); the wgrad keeps its default."""
    from primus_turbo.pytorch.core.platform import cuda_capability
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import configs_interpreter

    if device != "cpu" and (cuda_capability() is None or cuda_capability() < (9, 0)):
        pytest.skip("TMA descriptors / warp specialisation need CUDA sm_90+")
    if cfg is None and device != "cpu":
        pytest.skip(_GPU_SMALL)
    cfg = cfg or configs_interpreter()[0]
    monkeypatch.setattr(gk, "kernel_variant", lambda: "tune")
    monkeypatch.setattr(gk, "forward_plans", lambda *a: [(variant, cfg)])
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)


@pytest.mark.parametrize("trans_b", [False, True], ids=["NN", "NT"])
@pytest.mark.parametrize("lens,k,n", [CASES[0], ([0, 9, 0, 40], 32, 24)], ids=str)
@pytest.mark.parametrize("variant", VARIANTS)
def test_grouped_gemm_s5_plans(variant, lens, k, n, trans_b, monkeypatch, device):
    """Ragged groups (full and partial tiles: the TMA store takes only the full ones), empty
    groups, N not a multiple of the tile (the store is clipped at N)."""
    _force_plan(monkeypatch, device, variant)
    _check_fwd_bwd(lens, k, n, trans_b, torch.bfloat16, device)


def _gpu_plans():
    """Every Hopper plan of the new variants (not only the default candidates)."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    extra = [cfg for cfg in gc.tma_configs(ArchFamily.HOPPER) if gc._tma_extra_ok(cfg)]
    return [(v, cfg) for v in gc.TMA_EXTRA_VARIANTS for cfg in extra]


@pytest.mark.gpu
@pytest.mark.parametrize("plan", _gpu_plans(), ids=lambda p: f"{p[0]}:{p[1].name}")
def test_grouped_gemm_s5_plans_gpu(plan, monkeypatch, device):
    """Every new Hopper plan on a ragged MoE-sized shape (empty, 1-row and 7000-row groups):
    it compiles, fits shared memory and matches. NT only: its forward (NT) and dgrad (NN)
    are the plan's two kernels (an NN case would compile the same two again)."""
    trans_b = True
    _force_plan(monkeypatch, device, plan[0], plan[1])
    # 12832 rows (a multiple of 16, as the benchmark's 65536: same Triton specialisation, so
    # this run fills the compile cache for the A/B benchmark line)
    lens = [0, 3000, 1, 0, 64, 255, 2500, 7012]
    _check_fwd_bwd(lens, 2048, 768, trans_b, torch.bfloat16, device)


def test_grouped_gemm_s5_candidates(monkeypatch):
    """The default Hopper candidates are the session-4 winners, no session-5 plan (not even
    for small groups); ``..._CANDIDATES=s5`` adds the new forward/dgrad plans (no wgrad
    plan: the warp-specialised wgrad was removed); the TMA-store plans drop out
    when N is not a multiple of 8."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    def names(plans):
        return {(v, c.name) for v, c in plans}

    def kinds(plans):
        return {v for v, _ in plans}

    gc.candidate_set.cache_clear()
    try:
        for cands in ("", "s4"):
            monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", cands)
            gc.candidate_set.cache_clear()
            vk = names(gc.variable_k_plans(ArchFamily.HOPPER, "tune", True))
            assert vk == set(gc.HOPPER_WINNERS["vk"])
            fwd = names(gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True))
            # the session-4 winners + GROUP_M 16 (session 8)
            assert fwd == set(gc.HOPPER_WINNERS["fwd"]) > set(gc.HOPPER_WINNERS_S4_FWD)
            few = gc.WINNERS_MIN_AVG_ROWS - 1
            small = gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True, few)
            assert not kinds(small) & set(gc.S5_VARIANTS)
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", "s5")
        gc.candidate_set.cache_clear()
        vk = names(gc.variable_k_plans(ArchFamily.HOPPER, "tune", True))
        # no session-5 wgrad plan (the warp-specialised wgrad was removed after run 5.3)
        assert vk == set(gc.HOPPER_WINNERS["vk"])
        fwd = names(gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True))
        assert fwd == set(gc.HOPPER_WINNERS["fwd"] + gc.HOPPER_S5_PLANS["fwd"])
        odd = names(gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True, n=4100))
        assert not {v for v, _ in odd} & {"tmas", "tmasn"}
        assert ("tman", "m128n256k64g8w8s3") in odd
    finally:
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", raising=False)
        gc.candidate_set.cache_clear()


def test_ensure_context_off_cuda_is_a_noop():
    from primus_turbo.triton.host_tma import ensure_context

    ensure_context(torch.device("cpu"))  # nothing to bind, nothing raised


@pytest.mark.gpu
def test_tma_launch_from_a_fresh_thread(monkeypatch, device):
    """A TMA-descriptor launch from a thread that has made no CUDA call yet works (PyTorch runs
    backward passes on such threads): ``host_tma.ensure_context`` binds the context before the
    descriptors are encoded (H200 call 10.6: "Failed to create tensor map descriptor: invalid
    device context" on the first backward of a process)."""
    import threading

    import primus_turbo.pytorch as turbo
    from primus_turbo.pytorch.reference import group_offsets
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc
    from tests.pytorch.ops.test_grouped_gemm import _operands

    if device == "cpu":
        pytest.skip("needs a CUDA device (host TMA descriptors)")
    variant, name = gc.HOPPER_WINNERS_S4_FWD[0]
    cfg = next(c for c in gc.tma_configs(ArchFamily.HOPPER) if c.name == name)
    _force_plan(monkeypatch, device, variant, cfg)
    a, b, gl = _operands([0, 300, 1, 700], 256, 256, True, torch.bfloat16, device)
    offs = group_offsets(gl)
    ref = turbo.ops.grouped_gemm(a.detach(), b.detach(), gl, offs, trans_b=True)  # main thread
    torch.cuda.synchronize()
    result, errors = {}, []

    def work():
        try:
            result["out"] = turbo.ops.grouped_gemm(a.detach(), b.detach(), gl, offs, trans_b=True)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not errors, errors
    torch.testing.assert_close(result["out"], ref, rtol=0, atol=0)
    out = turbo.ops.grouped_gemm(a, b, gl, offs, trans_b=True)
    ga, gb = torch.autograd.grad(out, (a, b), torch.ones_like(out))  # autograd's device thread
    assert ga.shape == a.shape and gb.shape == b.shape


def test_plan_lists_memoised(monkeypatch):
    """``forward_plans`` / ``variable_k_plans`` are memoised per arguments and environment: the
    same lists as building them, a fresh list per call, and a changed config filter (its cache
    cleared, as every environment knob is read once) takes effect."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    hop = ArchFamily.HOPPER
    for family in (hop, ArchFamily.CPU, ArchFamily.CDNA3):
        for args in [("tune", True, 4096, True, 512, 1536), ("tune", True, 1536, False, 64, 2048),
                     ("tune", False, 768, True, 2048, 2048), ("flat", True, 4096, True, None, None),
                     ("tma", True, 100, False, 4096, 8)]:  # fmt: skip
            got = gc.forward_plans(family, *args)
            assert got == gc._forward_plans(family, *args)
            got.clear()  # the caller's copy: the memo is untouched
            assert gc.forward_plans(family, *args) == gc._forward_plans(family, *args)
        for args in [("tune", True, 512, 2048, 768), ("tune", True, 4096, 7168, 4096),
                     ("table", False, 1 << 30, None, None)]:  # fmt: skip
            assert gc.variable_k_plans(family, *args) == gc._variable_k_plans(family, *args)
    name = gc.forward_plans(hop, "tune", True, 4096, True)[0][1].name
    gc.config_filter.cache_clear()
    try:
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CONFIG", name)
        gc.config_filter.cache_clear()
        assert {c.name for _, c in gc.forward_plans(hop, "tune", True, 4096, True)} == {name}
    finally:
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_CONFIG", raising=False)
        gc.config_filter.cache_clear()
    assert len(gc.forward_plans(hop, "tune", True, 4096, True)) > 1
