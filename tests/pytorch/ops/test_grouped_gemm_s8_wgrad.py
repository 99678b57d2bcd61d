"""Session-8 plans of the TRITON grouped GEMM: the GROUP_M 16 TMA tile (a default forward /
dgrad candidate since call 8.1) and the wgrad's TMA-store epilogue ``tmavs`` of the
variable-K TMA kernel on ``VK_STORE_TILES`` (256x128 s4, GROUP_M 16 128x256 s4: default
candidates since call 8.2, the one plan for large experts) and its session-13 form ``tmavd``
(per-group descriptors built on the device), each forced as the only plan, vs the fp32
reference and bitwise vs the pointer-store ``tma`` plan; the candidate rules."""

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


@pytest.mark.parametrize("kind", ["tmavs", "tmavd"])
@pytest.mark.parametrize("trans_b", [False, True], ids=["NN", "NT"])
@pytest.mark.parametrize("lens,k,n", [CASES[0], CASES[3], ([0, 9, 0, 40], 32, 24)], ids=str)
def test_grouped_gemm_s8_vk_tmavs(lens, k, n, trans_b, kind, monkeypatch, device):
    """Plans ``tmavs`` / ``tmavd`` (interpreter tile; the Hopper tiles in the *_gpu tests):
    ragged groups with partial K steps, empty groups, P / Q not multiples of the tile (clipped
    by the descriptor); K = 40 / N = 24: rows of 80 / 48 bytes (TMA store usable)."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import configs_interpreter

    if device != "cpu":
        pytest.skip("interpreter tile; on a GPU the *_gpu tests run the real Hopper tiles")
    _force_vk(monkeypatch, (kind, configs_interpreter()[0]))
    _check_fwd_bwd(lens, k, n, trans_b, torch.bfloat16, device)


def _vk_pair(device, cfg, lens, p, q):
    """``(tma, tmavs, tmavd)`` wgrad outputs of one tile on random ``x [M, p]``, ``y [M, q]``."""
    from primus_turbo.pytorch.reference import group_offsets
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    torch.manual_seed(0)
    gl = torch.tensor(lens, device=device)
    x = torch.randn(int(gl.sum()), p, device=device, dtype=torch.bfloat16)
    y = torch.randn(int(gl.sum()), q, device=device, dtype=torch.bfloat16)
    outs = []
    saved = (gk.variable_k_variant, gk.variable_k_plans)
    try:
        for v in ("tma", "tmavs", "tmavd"):
            gk.variable_k_variant = lambda: "tune"
            gk.variable_k_plans = lambda *a, v=v: [(v, cfg)]
            outs.append(gk.variable_k_triton(x, y, group_offsets(gl), len(lens), x.dtype))
    finally:
        gk.variable_k_variant, gk.variable_k_plans = saved
    return outs


def test_grouped_gemm_s8_vk_tmavs_bitwise(device):
    """The TMA store only moves the epilogue, the device descriptors only the last partial
    step (zero-filled rows instead of a masked load): bitwise the pointer-store plan's output
    (same tile, same K order), with P and Q not multiples of the tile and an empty group."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import configs_interpreter

    if device != "cpu":
        pytest.skip("interpreter tile (GPU: test_grouped_gemm_s8_vk_plans_gpu)")
    a, b, c = _vk_pair(device, configs_interpreter()[0], [5, 0, 37, 16], 40, 24)
    assert torch.equal(a, b)
    assert torch.equal(a, c)


def _gpu_plan_list():
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    cfgs = {c.name: c for c in gc.tma_configs(ArchFamily.HOPPER, wgrad=True)}
    tiles = [cfgs[name] for v, name in gc.HOPPER_WINNERS["vk"] if v == "tmavs"]
    return [(v, cfg) for cfg in tiles for v in gc.S8_VK_VARIANTS]


@pytest.mark.gpu
@pytest.mark.parametrize("plan", _gpu_plan_list(), ids=lambda p: f"{p[0]}:{p[1].name}")
def test_grouped_gemm_s8_vk_plans_gpu(plan, monkeypatch, device):
    """Every session-8 wgrad plan on a ragged MoE-sized shape (empty, 1-row and 7012-row
    groups, N = 768 not a multiple of 256): it compiles, fits shared memory and matches;
    ``tmavs`` / ``tmavd`` bitwise == ``tma`` on the tile."""
    if device == "cpu":
        pytest.skip("Hopper tiles")
    _need_tma(device)
    _force_vk(monkeypatch, plan)
    lens = [0, 3000, 1, 0, 64, 255, 2500, 7012]
    _check_fwd_bwd(lens, 2048, 768, True, torch.bfloat16, device)
    a, b, c = _vk_pair(device, plan[1], [0, 700, 1, 1500, 129], 640, 520)
    assert torch.equal(a, b)
    assert torch.equal(a, c)


@pytest.mark.gpu
@pytest.mark.parametrize("vk_desc", ["0", "1"], ids=["tmavs", "tmavd"])
@pytest.mark.parametrize("p,q", [(640, 520), (520, 640)], ids=["P>=Q", "P<Q"])
def test_grouped_gemm_s8_vk_large_expert_gpu(p, q, vk_desc, monkeypatch, device):
    """The default wgrad path (not forced) for large experts (``M // G`` >= 2048): the plan
    ``vk_large_expert_plan`` runs untimed and matches the fp32 reference, ragged groups with
    an empty one and row counts not multiples of 64."""
    from primus_turbo.pytorch.reference import group_offsets
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    if device == "cpu":
        pytest.skip("Hopper tiles")
    _need_tma(device)
    lens = [3001, 0, 2500, 2691]
    assert sum(lens) // len(lens) >= gc.VK_STORE_MIN_AVG_ROWS
    monkeypatch.setattr(gc, "vk_device_descriptors", lambda: vk_desc == "1")
    plans = gc.variable_k_plans(ArchFamily.HOPPER, "tune", True, sum(lens) // len(lens), p, q)
    assert plans == [gc.vk_large_expert_plan(p, q)]
    torch.manual_seed(0)
    gl = torch.tensor(lens, device=device)
    x = torch.randn(sum(lens), p, device=device, dtype=torch.bfloat16)
    y = torch.randn(sum(lens), q, device=device, dtype=torch.bfloat16)
    out = gk.variable_k_triton(x, y, group_offsets(gl), len(lens), torch.bfloat16)
    ref, start = [], 0
    for n in lens:
        ref.append(x[start : start + n].double().T @ y[start : start + n].double())
        start += n
    ref = torch.stack(ref)
    err = (out.double() - ref).abs().max() / ref.abs().max()
    assert err < 1e-2, f"rel max err {err:.2e}"
    assert torch.count_nonzero(out[1]) == 0


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
    """GROUP_M 16 is a default forward / dgrad candidate; the ``tmavs`` wgrad plans are default
    candidates (also in ``s5``), on ``VK_STORE_TILES`` only; large experts (``p`` / ``q``
    given, ``M // G >= VK_STORE_MIN_AVG_ROWS``) take one ``tmavs`` plan by ``P >= Q`` (session 8
    rule, ``PRIMUS_TURBO_GROUPED_GEMM_VK_DESC=0``) unless a filter is set or the set is ``all``;
    ``s8`` is no longer a candidate set; a config filter names ``tmavs`` explicitly (a bare tile
    name keeps the ``tma`` plan only)."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    monkeypatch.setattr(gc, "vk_device_descriptors", lambda: False)

    def names(plans):
        return {(v, c.name) for v, c in plans}

    hop = ArchFamily.HOPPER
    big = gc.VK_STORE_MIN_AVG_ROWS
    g16, wide = ("tmavs", "m128n256k64g16w8s4"), ("tmavs", "m256n128k64g8w8s4")
    try:
        for cands in ("", "s5"):
            monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", cands)
            gc.candidate_set.cache_clear()
            fwd = names(gc.forward_plans(hop, "tune", True, 4096, True))
            assert ("tma", gc.S8_G16.name) in fwd
            vk = names(gc.variable_k_plans(hop, "tune", True))
            assert {g16, wide} <= vk == set(gc.HOPPER_WINNERS["vk"])
            every = gc.variable_k_plans(hop, "tune", True, 8)  # small groups: every plan
            assert {c for v, c in every if v == "tmavs"} == set(gc.VK_STORE_TILES)
            # large experts: DeepSeek-V3 down (P x Q = 7168 x 2048) / gate_up (4096 x 7168)
            assert names(gc.variable_k_plans(hop, "tune", True, big, 7168, 2048)) == {g16}
            assert names(gc.variable_k_plans(hop, "tune", True, big, 4096, 7168)) == {wide}
            assert len(gc.variable_k_plans(hop, "tune", True, big - 1, 7168, 2048)) > 1
            assert not names(gc.variable_k_plans(hop, "tune", False, big, 7168, 2048)) & {g16}
            assert len(gc.variable_k_plans(hop, "tma", True, big, 7168, 2048)) > 1
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", "all")
        gc.candidate_set.cache_clear()
        assert len(gc.variable_k_plans(hop, "tune", True, big, 7168, 2048)) > 2
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", "s8")
        gc.candidate_set.cache_clear()
        with pytest.raises(ValueError, match="PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES"):
            gc.candidate_set()
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES")
        gc.candidate_set.cache_clear()
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_VK_CONFIG",
                           "tmavs:m256n128k64g8w8s4,m128n256k64g16w8s4")  # fmt: skip
        gc.config_filter.cache_clear()
        want = {wide, ("tma", "m128n256k64g16w8s4")}
        assert names(gc.variable_k_plans(hop, "tune", True)) == want
        assert names(gc.variable_k_plans(hop, "tune", True, big, 7168, 2048)) == want
    finally:
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", raising=False)
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_VK_CONFIG", raising=False)
        gc.candidate_set.cache_clear()
        gc.config_filter.cache_clear()


def test_grouped_gemm_vk_desc_knob(monkeypatch):
    """``PRIMUS_TURBO_GROUPED_GEMM_VK_DESC`` (default 1): groups of ``VK_DESC_MIN_AVG_ROWS``
    rows or more take ``tmavd`` GROUP_M 16 128x256 for either output orientation; ``0``: the
    session-8 ``tmavs`` rule from ``VK_STORE_MIN_AVG_ROWS``. The tuner's candidates for smaller
    groups are ``tmavs`` either way."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    hop, mid, big = ArchFamily.HOPPER, gc.VK_DESC_MIN_AVG_ROWS, gc.VK_STORE_MIN_AVG_ROWS
    assert mid < big
    try:
        gc.vk_device_descriptors.cache_clear()
        assert gc.vk_device_descriptors()  # the default
        for p, q in ((7168, 2048), (4096, 7168)):
            assert gc.variable_k_plans(hop, "tune", True, mid, p, q) == [("tmavd", gc.S8_VK_G16)]
        assert len(gc.variable_k_plans(hop, "tune", True, mid - 1, 7168, 2048)) > 1
        kinds = {v for v, _ in gc.variable_k_plans(hop, "tune", True, mid - 1, 7168, 2048)}
        assert "tmavs" in kinds and "tmavd" not in kinds
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_VK_DESC", "0")
        gc.vk_device_descriptors.cache_clear()
        assert len(gc.variable_k_plans(hop, "tune", True, mid, 7168, 2048)) > 1
        assert gc.variable_k_plans(hop, "tune", True, big, 7168, 2048) == [("tmavs", gc.S8_VK_G16)]
        assert gc.vk_large_expert_plan(4096, 7168) == ("tmavs", gc.VK_STORE_TILES[0])
    finally:
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_VK_DESC", raising=False)
        gc.vk_device_descriptors.cache_clear()


@pytest.mark.gpu
def test_grouped_gemm_vk_desc_graph_gpu(device):
    """``tmavd`` under CUDA-graph capture (its descriptor scratch comes from the graph's pool)
    and launched from a fresh thread (the allocator is per thread): replays match eager."""
    import threading

    from primus_turbo.pytorch.reference import group_offsets
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import VK_STORE_TILES

    if device == "cpu":
        pytest.skip("Hopper tiles")
    _need_tma(device)
    lens = [700, 0, 1, 1500, 129]
    torch.manual_seed(0)
    offs = group_offsets(torch.tensor(lens, device=device))
    x = torch.randn(sum(lens), 640, device=device, dtype=torch.bfloat16)
    y = torch.randn(sum(lens), 520, device=device, dtype=torch.bfloat16)
    saved = (gk.variable_k_variant, gk.variable_k_plans)
    try:
        gk.variable_k_variant = lambda: "tune"
        gk.variable_k_plans = lambda *a: [("tmavd", VK_STORE_TILES[0])]
        eager = gk.variable_k_triton(x, y, offs, len(lens), x.dtype)
        box = {}
        thread = threading.Thread(
            target=lambda: box.update(out=gk.variable_k_triton(x, y, offs, len(lens), x.dtype))
        )
        thread.start()
        thread.join()
        assert torch.equal(box["out"], eager)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = gk.variable_k_triton(x, y, offs, len(lens), x.dtype)
        x.mul_(2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, gk.variable_k_triton(x, y, offs, len(lens), x.dtype))
    finally:
        gk.variable_k_variant, gk.variable_k_plans = saved


@pytest.mark.gpu
@pytest.mark.parametrize("trans_b", [True, False], ids=["fwd", "dgrad"])
def test_grouped_gemm_large_expert_fwd_gpu(trans_b, device):
    """The default forward / dgrad path (not forced) for large experts (``M // G`` >= 2048,
    session 11): the one plan ``LARGE_EXPERT_FWD_PLAN`` runs untimed and matches the fp32
    reference, ragged groups with an empty one and row counts not multiples of the tile, N not
    a multiple of 256; the op's forward and both gradients too."""
    from primus_turbo.pytorch.reference import group_offsets
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    if device == "cpu":
        pytest.skip("Hopper tiles")
    _need_tma(device)
    lens, n, k = [3001, 0, 2500, 2691], 520, 640
    avg = sum(lens) // len(lens)
    assert gc.forward_plans(ArchFamily.HOPPER, "tune", True, k, trans_b, avg, n) == [
        gc.LARGE_EXPERT_FWD_PLAN
    ]
    torch.manual_seed(1)
    a = torch.randn(sum(lens), k, device=device, dtype=torch.bfloat16)
    shape = (len(lens), n, k) if trans_b else (len(lens), k, n)
    b = (torch.randn(shape, device=device) / k**0.5).to(torch.bfloat16)
    out = gk.grouped_gemm_triton(a, b, group_offsets(torch.tensor(lens, device=device)), trans_b)
    ref, start = [], 0
    for i, rows in enumerate(lens):
        w = b[i].double().T if trans_b else b[i].double()
        ref.append(a[start : start + rows].double() @ w)
        start += rows
    ref = torch.cat(ref)
    err = (out.double() - ref).abs().max() / ref.abs().max()
    assert err < 1e-2, f"rel max err {err:.2e}"
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)
    try:
        _check_fwd_bwd(lens, k, n, trans_b, torch.bfloat16, device)
    finally:
        GlobalBackendManager.reset()
