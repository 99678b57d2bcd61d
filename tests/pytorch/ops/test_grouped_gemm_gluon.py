"""Session-6 Gluon kernels of the TRITON grouped GEMM: the wgrad (``grouped_gemm_gluon``, plans
``gl`` / ``gls``) and the forward/dgrad (``grouped_gemm_gluon_fwd``, plans ``glf`` / ``glfs``),
each forced as the only plan of its GEMM vs the fp32 reference on the GPU (Gluon has no
interpreter); on the CPU the plan lists and an sm_90 compile of the kernels.

A kernel with hand-written barriers can hang the GPU (the session-5 warp-specialised kernel
did, and pytest's timeout could not stop it), so the GPU cases run in a child pytest that
``test_grouped_gemm_gluon_gpu_guarded`` kills after ``_GUARD_S`` seconds; in the parent
process they skip unless ``PRIMUS_TURBO_TEST_GLUON_INPROC=1`` (set for the child)."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core import BackendType, GlobalBackendManager
from primus_turbo.pytorch.core.platform import ArchFamily
from primus_turbo.pytorch.reference import group_offsets
from tests.pytorch.ops.test_grouped_gemm import _check_fwd_bwd
from tests.pytorch.test_utils import assert_close, rand

pytestmark = pytest.mark.grouped_gemm


def _plans():
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import gluon_vk_plans

    return list(gluon_vk_plans(ArchFamily.HOPPER))


_INPROC = "PRIMUS_TURBO_TEST_GLUON_INPROC"
_GUARD_S = 240


def _hopper(device) -> bool:
    from primus_turbo.pytorch.core.platform import cuda_capability

    return device != "cpu" and cuda_capability() is not None and cuda_capability() >= (9, 0)


def _need_hopper(device):
    import os

    if not _hopper(device):
        pytest.skip("Gluon wgmma / TMA kernels need CUDA sm_90+ (no interpreter)")
    if os.environ.get(_INPROC) != "1":
        pytest.skip(f"runs in test_grouped_gemm_gluon_gpu_guarded's child ({_INPROC}=1)")


def _force_vk(monkeypatch, plan):
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    monkeypatch.setattr(gk, "variable_k_variant", lambda: "tune")
    monkeypatch.setattr(gk, "variable_k_plans", lambda *a: [plan])
    monkeypatch.setattr(gk, "_tune_min_work", lambda: 1 << 62)  # forward: no tuning compiles
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)


# group sizes: empty first / middle groups, a 1-row group, whole and partial 64-row steps
LENS = [0, 3000, 1, 0, 64, 255, 2500, 7012]


@pytest.mark.gpu
@pytest.mark.parametrize("plan", _plans(), ids=lambda p: f"{p[0]}:{p[1].name}")
def test_grouped_gemm_gluon_vk_gpu(plan, monkeypatch, device):
    """Each Gluon wgrad plan in a full forward + backward (NT: the wgrad is ``grad^T @ a``,
    P = N = 768 a multiple of every BLOCK_M, so ``gls`` takes it too)."""
    _need_hopper(device)
    _force_vk(monkeypatch, plan)
    _check_fwd_bwd(LENS, 2048, 768, True, torch.bfloat16, device)


def _fwd_plans():
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import gluon_fwd_plans

    return list(gluon_fwd_plans(ArchFamily.HOPPER))


def _force_fwd(monkeypatch, plan):
    """Forward and dgrad through ``plan`` where it can take the operands (else one TMA plan);
    the wgrad on its untimed default."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    def plans(family, mode, tma_ok, k, trans_b, avg_rows=1 << 30, n=None, gluon_ok=None):
        if gluon_ok is not None and gluon_ok(*plan):
            return [plan]
        return gc.forward_plans(family, "tma" if tma_ok else "flat", tma_ok, k, trans_b)[:1]

    monkeypatch.setattr(gk, "kernel_variant", lambda: "tune")
    monkeypatch.setattr(gk, "forward_plans", plans)
    monkeypatch.setattr(gk, "_tune_min_work", lambda: 1 << 62)
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)


@pytest.mark.gpu
@pytest.mark.parametrize("trans_b", [False, True], ids=["NN", "NT"])
@pytest.mark.parametrize("lens,k,n", [(LENS, 2048, 768), ([1, 130, 0, 700], 1000, 744)],
                         ids=lambda x: str(x)[:24])  # fmt: skip
@pytest.mark.parametrize("plan", _fwd_plans(), ids=lambda p: f"{p[0]}:{p[1].name}")
def test_grouped_gemm_gluon_fwd_gpu(plan, lens, k, n, trans_b, monkeypatch, device):
    """Each Gluon forward plan, forward + dgrad (+ the default wgrad): ragged and empty groups,
    full tiles (TMA store in ``glfs``) and a group's last rows (masked store), K = 1000 (NT:
    the descriptor zero-fills past K; NN and its dgrad fall back where K % 64 != 0), N = 744
    (partial column tiles)."""
    _need_hopper(device)
    _force_fwd(monkeypatch, plan)
    _check_fwd_bwd(lens, k, n, trans_b, torch.bfloat16, device)


@pytest.mark.gpu
@pytest.mark.parametrize("plan", _fwd_plans(), ids=lambda p: f"{p[0]}:{p[1].name}")
def test_grouped_gemm_gluon_fwd_tail_rows(plan, device):
    """Rows past ``offs[G]`` (an over-allocated ``a``) come out as zeros."""
    _need_hopper(device)
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    lens = [300, 0, 129]
    a = rand(sum(lens) + 200, 512, dtype=torch.bfloat16, device=device)
    b = rand(3, 384, 512, dtype=torch.bfloat16, device=device)
    offs = group_offsets(torch.tensor(lens, device=device))
    saved = gk.forward_plans
    gk.forward_plans = lambda *a, **k: [plan]
    try:
        out = gk.grouped_gemm_triton(a, b, offs, True)
    finally:
        gk.forward_plans = saved
    ref = torch.zeros(a.shape[0], 384, device=device)
    for g, (lo, hi) in enumerate(zip(offs[:-1].tolist(), offs[1:].tolist(), strict=True)):
        ref[lo:hi] = a[lo:hi].float() @ b[g].float().T
    assert_close(out, ref, torch.bfloat16)
    assert bool((out[sum(lens) :] == 0).all())


@pytest.mark.gpu
@pytest.mark.parametrize("plan", [p for p in _plans() if p[0] == "gl"],
                         ids=lambda p: f"{p[0]}:{p[1].name}")  # fmt: skip
@pytest.mark.parametrize("lens,p,q", [(LENS, 744, 1000), ([37] * 128, 520, 136),
                                      ([0, 0, 5], 64, 64)], ids=lambda x: str(x)[:24])  # fmt: skip
def test_grouped_gemm_gluon_vk_direct(plan, lens, p, q, device):
    """``variable_k_triton`` through one ``gl`` plan: P and Q not multiples of the tile, 128
    small groups (the step count over a 256-entry offsets vector), mostly empty groups (exact
    zeros), rows past ``offs[G]`` ignored."""
    _need_hopper(device)
    from primus_turbo.triton.grouped_gemm.grouped_gemm_gluon import gluon_vk_usable
    from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import variable_k_triton

    m = sum(lens)
    x = rand(m + 40, p, dtype=torch.bfloat16, device=device)  # 40 rows past offs[G]
    y = rand(m + 40, q, dtype=torch.bfloat16, device=device)
    offs = group_offsets(torch.tensor(lens, device=device))
    c = torch.empty(len(lens), p, q, dtype=torch.bfloat16, device=device)
    assert gluon_vk_usable(x, y, c, *plan)
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    saved = gk.variable_k_plans
    gk.variable_k_plans = lambda *a: [plan]
    try:
        out = variable_k_triton(x, y, offs, len(lens), torch.bfloat16)
    finally:
        gk.variable_k_plans = saved
    ref = torch.zeros(len(lens), p, q, dtype=torch.float32, device=device)
    for g, (lo, hi) in enumerate(zip(offs[:-1].tolist(), offs[1:].tolist(), strict=True)):
        ref[g] = x[lo:hi].float().T @ y[lo:hi].float()
    assert_close(out, ref, torch.bfloat16)
    empty = [g for g, n in enumerate(lens) if n == 0]
    assert bool((out[empty] == 0).all())


def test_grouped_gemm_gluon_candidates(monkeypatch):
    """Gluon plans (wgrad and forward) and the 4-stage flat plan: none by default (unverified),
    all usable ones with ``..._CANDIDATES=s6``, only the Gluon ones in ``..._VK=gluon`` /
    ``..._KERNEL=gluon`` mode, by name in ``..._VK_CONFIG``; none where the call cannot take
    them (``gluon_ok``) or off Hopper."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    def kinds(plans):
        return {v for v, _ in plans}

    def ok(variant, cfg):
        return True

    def only_gl(variant, cfg):
        return variant == "gl"

    gc.candidate_set.cache_clear()
    gc.config_filter.cache_clear()
    try:
        assert not kinds(gc.variable_k_plans(ArchFamily.HOPPER, "tune", True, gluon_ok=ok)) & {
            "gl", "gls"}  # fmt: skip
        fwd = gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True, gluon_ok=ok)
        assert not kinds(fwd) & set(gc.S6_VARIANTS)
        assert gc.forward_plans(ArchFamily.HOPPER, "gluon", True, 4096, True, gluon_ok=ok) == list(
            gc.gluon_fwd_plans(ArchFamily.HOPPER))  # fmt: skip
        # not usable (gluon_ok None): gluon mode is the TMA kernel
        assert kinds(gc.forward_plans(ArchFamily.HOPPER, "gluon", True, 4096, True)) == {"tma"}
        gluon = gc.variable_k_plans(ArchFamily.HOPPER, "gluon", True, gluon_ok=ok)
        assert gluon == list(gc.gluon_vk_plans(ArchFamily.HOPPER))
        assert kinds(gc.variable_k_plans(ArchFamily.HOPPER, "gluon", True, gluon_ok=only_gl)) == {
            "gl"}  # fmt: skip
        # nothing usable: gluon mode falls back to the TMA wgrad
        assert kinds(gc.variable_k_plans(ArchFamily.HOPPER, "gluon", True)) == {"tma"}
        assert gc.gluon_vk_plans(ArchFamily.CDNA3) == ()
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", "s6")
        gc.candidate_set.cache_clear()
        s6 = gc.variable_k_plans(ArchFamily.HOPPER, "tune", True, gluon_ok=ok)
        assert {(v, c.name) for v, c in s6} == set(gc.HOPPER_WINNERS["vk"]) | {
            (v, c.name) for v, c in gc.gluon_vk_plans(ArchFamily.HOPPER)}  # fmt: skip
        # forward: + the 4-stage flat plan, + the Gluon plans the call can take
        fwd = gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True)
        flat4 = ("flat4", gc.FLAT4_CONFIG.name)
        assert {(v, c.name) for v, c in fwd} == set(gc.HOPPER_WINNERS["fwd"]) | {flat4}
        fwd = gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True, gluon_ok=ok)
        gluon = {(v, c.name) for v, c in gc.gluon_fwd_plans(ArchFamily.HOPPER)}
        assert {(v, c.name) for v, c in fwd} == set(gc.HOPPER_WINNERS["fwd"]) | {flat4} | gluon
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", "")
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_VK_CONFIG", "gls:m256n128k64g8w8s3")
        gc.candidate_set.cache_clear()
        gc.config_filter.cache_clear()
        named = gc.variable_k_plans(ArchFamily.HOPPER, "tune", True, gluon_ok=ok)
        assert [(v, c.name) for v, c in named] == [("gls", "m256n128k64g8w8s3")]
    finally:
        gc.candidate_set.cache_clear()
        gc.config_filter.cache_clear()


@pytest.mark.gpu
def test_grouped_gemm_gluon_gpu_guarded(device):
    """The GPU cases above in a child pytest (4 xdist workers where available) in its own
    process group, killed after ``PRIMUS_TURBO_TEST_GLUON_GUARD_S`` s (default ``_GUARD_S``):
    a hang fails this test instead of stopping the run; the child's report shows on failure."""
    import importlib.util
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    if not _hopper(device):
        pytest.skip("Gluon wgmma / TMA kernels need CUDA sm_90+ (no interpreter)")
    if os.environ.get(_INPROC) == "1":
        pytest.skip("the child itself")
    limit = float(os.environ.get("PRIMUS_TURBO_TEST_GLUON_GUARD_S", _GUARD_S))
    repo = Path(__file__).resolve().parents[3]
    cmd = [sys.executable, "-m", "pytest", str(Path(__file__).resolve()), "-v", "-x",
           "--tb=short", "-p", "no:cacheprovider", "-k", "gluon_vk or gluon_fwd"]  # fmt: skip
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", "4"]
    env = {**os.environ, _INPROC: "1"}
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, text=True,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and its xdist workers
        out, _ = proc.communicate()
        pytest.fail(f"Gluon GPU tests did not finish in {limit:.0f} s (hang?):\n{out[-8000:]}")
    assert proc.returncode == 0, out[-8000:]
    last = out.strip().splitlines()[-1]
    assert " passed" in last and "skipped" not in last and "failed" not in last, out[-8000:]


_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from primus_turbo.triton.grouped_gemm.grouped_gemm_gluon import aot_specs

spec = next(s for s in aot_specs("sm_90") if s.name.endswith("gl_bf16_m256n128k64g8w8s4"))
sig = {k: v if v.startswith("tensordesc") else v.split(":")[0] for k, v in spec.signature.items()}
sig.update({k: "constexpr" for k in spec.constexprs})
src = GluonASTSource(spec.fn, sig, dict(spec.constexprs))
out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(spec.options))
ptx = out.asm["ptx"]
wgmma = sum("wgmma.mma_async" in ln for ln in ptx.splitlines())
print("WGMMA", wgmma, "SHARED", out.metadata.shared)
"""


def test_grouped_gemm_gluon_compiles_sm90():
    """The default Gluon wgrad plan compiles for sm_90 on any machine (the AOT path, in a
    subprocess without TRITON_INTERPRET: it catches a Gluon API change without a GPU); 8
    wgmma per K step, shared memory within sm_90's 227 KiB."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _COMPILE], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    words = proc.stdout.split()
    assert words[words.index("WGMMA") + 1] == "8"
    assert int(words[words.index("SHARED") + 1]) <= 227 * 1024
