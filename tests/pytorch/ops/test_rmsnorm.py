"""RMSNorm: every backend x dtype x hidden size, forward and both grads vs the fp32 reference."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.build_info import native_has_gpu, native_status
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager
from primus_turbo.pytorch.core.platform import is_rocm
from primus_turbo.pytorch.kernels.normalization.rmsnorm_impl import (
    RMSNormDispatcher,
    reload_env,
    turbo_gpu_fwd,
)
from primus_turbo.pytorch.reference import rmsnorm_ref
from primus_turbo.triton.normalization.rmsnorm_kernel import (
    MAX_HIDDEN,
    fwd_knobs,
    fwd_variant,
    rmsnorm_fwd_triton,
    select_config,
    select_inductor_config,
    select_looped_config,
)
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import assert_close, rand

pytestmark = pytest.mark.rmsnorm

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
BACKENDS = [None, BackendType.TURBO, BackendType.TRITON, BackendType.TORCH]
# (leading dims..., hidden): hidden 1, odd, the model sizes with tiny row counts on the CPU.
CPU_SHAPES = [(3, 1), (5, 127), (2, 3, 64), (2, 2880), (1, 8192)]
# GPU (default "auto" C++ plans: tiles forward; backward persist up to 8 KB rows, tiles above;
# test_rmsnorm_cpp_plans covers the others): generic 127; persist backward VPT 1 (1001x1024,
# 3000x2880, 2x64x4096); tiles backward VPT 4 (3000x8192, 33x16384); fwd VPT 8 + bwd generic
# fallback (24576).
GPU_SHAPES = [(4096, 127), (1001, 1024), (3000, 2880), (3000, 8192), (33, 16384), (2, 64, 4096),
              (7, 24576)]  # fmt: skip
SHAPES = GPU_SHAPES if HAS_GPU else CPU_SHAPES


def _fwd_bwd_params():
    """CPU: every shape x dtype x backend (tiny shapes). GPU (a shared ~5 minute budget): TURBO and
    TRITON on every shape x dtype, TORCH and the default dispatch on bf16 only."""
    out = []
    for shape in SHAPES:
        for dtype in DTYPES:
            for backend in BACKENDS:
                if HAS_GPU and backend in (None, BackendType.TORCH) and dtype != torch.bfloat16:
                    continue
                name = backend.name if backend else "default"
                out.append(pytest.param(shape, dtype, backend, id=f"{shape}-{dtype}-{name}"))
    return out


def _skip_unsupported(backend, device):
    if backend == BackendType.TURBO:
        ok, why = native_status()
        if not ok:
            pytest.skip(why)
        if device == "cuda" and not native_has_gpu():
            pytest.skip("the C++ extension was built without GPU kernels")


def _check(shape, dtype, device, zero_centered=False, x=None):
    n = shape[-1]
    if x is None:
        x = rand(*shape, dtype=dtype, device=device, requires_grad=True)
    w = rand(n, dtype=dtype, device=device, requires_grad=True)
    out = turbo.ops.rmsnorm(x, w, 1e-6, zero_centered)
    assert out.shape == x.shape and out.dtype == dtype
    x_ref = x.detach().float().requires_grad_()
    w_ref = w.detach().float().requires_grad_()
    ref = rmsnorm_ref(x_ref, w_ref, 1e-6, zero_centered)
    assert_close(out, ref, dtype)
    grad = rand(*out.shape, dtype=dtype, device=device)
    out.backward(grad)
    ref.backward(grad.float())
    assert x.grad.shape == x.shape and x.grad.dtype == dtype
    assert w.grad.shape == w.shape and w.grad.dtype == dtype
    assert_close(x.grad, x_ref.grad, dtype)
    # dgamma sums over all rows: compare relative to its scale
    scale = max(1.0, w_ref.grad.abs().max().item())
    assert_close(w.grad / scale, w_ref.grad / scale, dtype)


@pytest.mark.parametrize(("shape", "dtype", "backend"), _fwd_bwd_params())
def test_rmsnorm_fwd_bwd(shape, dtype, backend, device):
    _skip_unsupported(backend, device)
    GlobalBackendManager.set_backend("rmsnorm", backend)
    _check(shape, dtype, device)


@pytest.mark.parametrize("backend", [BackendType.TRITON, BackendType.TORCH], ids=lambda b: b.name)
def test_rmsnorm_zero_centered(backend, device):
    GlobalBackendManager.set_backend("rmsnorm", backend)
    _check((9, 96), torch.bfloat16, device, zero_centered=True)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name if b else "default")
@pytest.mark.parametrize("shape", [(0, 64), (2, 0, 32)], ids=str)
def test_rmsnorm_zero_rows(shape, backend, device):
    _skip_unsupported(backend, device)
    GlobalBackendManager.set_backend("rmsnorm", backend)
    x = torch.empty(shape, dtype=torch.bfloat16, device=device, requires_grad=True)
    w = rand(shape[-1], dtype=torch.bfloat16, device=device, requires_grad=True)
    out = turbo.ops.rmsnorm(x, w)
    assert out.shape == shape
    out.sum().backward()
    assert x.grad.shape == shape
    assert torch.count_nonzero(w.grad) == 0


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name if b else "default")
def test_rmsnorm_non_contiguous(backend, device):
    _skip_unsupported(backend, device)
    GlobalBackendManager.set_backend("rmsnorm", backend)
    base = rand(6, 2, 40, dtype=torch.float32, device=device)
    x = base[:, 1, :].detach().requires_grad_()  # row stride 80, not contiguous
    xt = rand(40, 6, dtype=torch.float32, device=device).t().detach().requires_grad_()
    _check(x.shape, torch.float32, device, x=x)
    _check(xt.shape, torch.float32, device, x=xt)


def test_rmsnorm_mixed_gamma_dtype(device):
    """fp32 gamma with bf16 x (fp32 master weights): TURBO declines, the default falls back."""
    x = rand(8, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    w = rand(64, dtype=torch.float32, device=device, requires_grad=True)
    GlobalBackendManager.set_backend("rmsnorm", BackendType.TORCH)
    out = turbo.ops.rmsnorm(x, w)
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and w.grad.dtype == torch.float32
    assert_close(out, rmsnorm_ref(x.float(), w), torch.bfloat16)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name if b else "default")
def test_rmsnorm_torch_compile(backend, device):
    _skip_unsupported(backend, device)
    GlobalBackendManager.set_backend("rmsnorm", backend)
    torch._dynamo.reset()
    fn = torch.compile(lambda x, w: turbo.ops.rmsnorm(x, w) * 2.0, fullgraph=True)
    x = rand(3, 5, 48, dtype=torch.bfloat16, device=device, requires_grad=True)
    w = rand(48, dtype=torch.bfloat16, device=device, requires_grad=True)
    out = fn(x, w)
    grad = rand(*out.shape, dtype=torch.bfloat16, device=device)
    out.backward(grad)
    x_ref = x.detach().float().requires_grad_()
    w_ref = w.detach().float().requires_grad_()
    ref = rmsnorm_ref(x_ref, w_ref) * 2.0
    ref.backward(grad.float())
    assert_close(out, ref, torch.bfloat16)
    assert_close(x.grad, x_ref.grad, torch.bfloat16)
    assert_close(w.grad, w_ref.grad, torch.bfloat16)


@pytest.mark.deterministic
@pytest.mark.parametrize("backend", BACKENDS[1:3], ids=lambda b: b.name)
def test_rmsnorm_deterministic(backend, device):
    _skip_unsupported(backend, device)
    GlobalBackendManager.set_backend("rmsnorm", backend)
    shape = (96, 72) if device == "cpu" else (16384, 2880)
    x = rand(*shape, dtype=torch.bfloat16, device=device, requires_grad=True)
    w = rand(shape[-1], dtype=torch.bfloat16, device=device, requires_grad=True)
    grad = rand(*shape, dtype=torch.bfloat16, device=device)
    first = None
    for _ in range(3 if device == "cpu" else 10):
        x.grad = w.grad = None
        out = turbo.ops.rmsnorm(x, w)
        out.backward(grad)
        now = (out.detach().clone(), x.grad.clone(), w.grad.clone())
        if first is None:
            first = now
        for a, b in zip(first, now, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


CPP_PLAN_VARS = ("PRIMUS_TURBO_RMSNORM_CPP_PLAN", "PRIMUS_TURBO_RMSNORM_CPP_FWD_PLAN",
                 "PRIMUS_TURBO_RMSNORM_CPP_BWD_PLAN")  # fmt: skip
# Each shape exercises a different path of the plans: rows VPT 4/12/16 (1001x1024, 3000x2880,
# 300x4096), fp16 / fp32 narrow rows, tiles and persist at 8192, a partial last block (257 rows),
# bwd_vec_kernel at 16384 (persist, VPT 4), tiny rows (50x96).
CPP_PLAN_CASES = [((1001, 1024), torch.bfloat16), ((3000, 2880), torch.bfloat16),
                  ((257, 2880), torch.float16), ((300, 4096), torch.bfloat16),
                  ((129, 8192), torch.bfloat16), ((64, 2880), torch.float32),
                  ((33, 16384), torch.bfloat16), ((50, 96), torch.bfloat16)]  # fmt: skip


@pytest.mark.skipif(not HAS_GPU, reason="the C++ launch plans are GPU-only")
@pytest.mark.parametrize(
    "plan",
    ["auto", "tiles", "persist", "prev", "rows", "rows/tiles",
     "persist+PERSIST_OCC=1+BALANCE=0", "persist+PERSIST_OCC=4", "persist+PERSIST_PER_SM=2",
     "tiles+BALANCE=0", "persist+PDL=1", "tiles+PDL=1", "rows+PDL=1",
     "tiles+TILES_FWD_MODE=1", "tiles+TILES_FWD_MODE=2", "tiles+TILES_FWD_MODE=3",
     "tiles+TILES_FWD_MODE=4", "tiles+TILES_FWD_MODE=6", "tiles+TILES_FWD_MODE=7",
     "tiles+TILES_FWD_MODE=6+TILES_FWD_VPT=8"],
)  # fmt: skip
def test_rmsnorm_cpp_plans(plan, device, monkeypatch):
    """Every C++ GPU launch plan (PRIMUS_TURBO_RMSNORM_CPP_PLAN, or FWD/BWD pairs, optionally with
    "+KNOB=VALUE" knobs), re-read in this process through _C._rmsnorm_reload_plans, vs the fp32
    reference."""
    _skip_unsupported(BackendType.TURBO, device)
    import primus_turbo.pytorch._C as ext

    plan, *knobs = plan.split("+")
    with monkeypatch.context() as mp:
        mp.setenv("PRIMUS_TURBO_RMSNORM_TURBO_FWD", "cpp")  # the C++ forward at every width
        for var in CPP_PLAN_VARS:
            mp.delenv(var, raising=False)
        for knob in knobs:
            key, _, value = knob.partition("=")
            mp.setenv(f"PRIMUS_TURBO_RMSNORM_CPP_{key}", value)
        if "/" in plan:
            mp.setenv(CPP_PLAN_VARS[1], plan.split("/")[0])
            mp.setenv(CPP_PLAN_VARS[2], plan.split("/")[1])
        else:
            mp.setenv(CPP_PLAN_VARS[0], plan)
        ext._rmsnorm_reload_plans()
        reload_env()
        try:
            GlobalBackendManager.set_backend("rmsnorm", BackendType.TURBO)
            for shape, dtype in CPP_PLAN_CASES:
                _check(shape, dtype, device)
        finally:
            mp.undo()
            ext._rmsnorm_reload_plans()
            reload_env()


FWD_ENV = "PRIMUS_TURBO_RMSNORM_TRITON_FWD"
# Triton forward plans ("MODE+KNOB=VALUE", knobs PRIMUS_TURBO_RMSNORM_TRITON_FWD_<KNOB>); the CPU
# uses small RBLOCKs so the interpreter loops over several chunks with a masked tail.
TRITON_FWD_PLANS = ["tile+PER_THREAD=16", "looped", "looped+RBLOCK=64", "looped+RBLOCK=32+ROWS=2",
                    "looped+RBLOCK=64+HINTS=0+WARPS=2", "looped+RBLOCK=32+HINTS=3+REVERSE=1",
                    "auto+LOOPED_MIN_N=100", "inductor", "inductor+RBLOCK=64+HINTS=3",
                    "inductor+RBLOCK=64+WARPS=2+HINTS=0"]  # fmt: skip
TRITON_FWD_SHAPES = ([(5, 127), (2, 3, 200), (4, 1), (3, 256)] if not HAS_GPU else
                     [(4096, 127), (3000, 2880), (3000, 8192), (33, 16384), (7, 24576),
                      (5, 70001)])  # fmt: skip


@contextlib.contextmanager
def _fwd_plan_env(monkeypatch, plan: str, **extra: str):
    mode, *knobs = plan.split("+")
    with monkeypatch.context() as mp:
        mp.setenv(FWD_ENV, mode)
        for knob in knobs:
            key, _, value = knob.partition("=")
            mp.setenv(f"{FWD_ENV}_{key}", value)
        for key, value in extra.items():
            mp.setenv(key, value)
        reload_env()
        try:
            yield
        finally:
            mp.undo()
            reload_env()


@pytest.mark.parametrize("plan", TRITON_FWD_PLANS)
def test_rmsnorm_triton_fwd_plans(plan, device, monkeypatch):
    """The Triton forward variants (tile, Inductor-style looped two-pass) with the Triton
    backward: forward and both grads vs the fp32 reference, odd and 1-wide rows; bf16 on every
    shape, fp32 and zero-centered on the first."""
    GlobalBackendManager.set_backend("rmsnorm", BackendType.TRITON)
    with _fwd_plan_env(monkeypatch, plan):
        for i, shape in enumerate(TRITON_FWD_SHAPES):
            if shape[-1] > MAX_HIDDEN:  # beyond the Triton backward: the looped forward only
                x = rand(*shape, dtype=torch.bfloat16, device=device)
                w = rand(shape[-1], dtype=torch.bfloat16, device=device)
                y, rstd = rmsnorm_fwd_triton(x, w, 1e-6, False)
                assert_close(y, rmsnorm_ref(x.float(), w.float()), torch.bfloat16)
                continue
            _check(shape, torch.bfloat16, device)
            if i == 0:
                _check(shape, torch.float32, device)
                _check(shape, torch.bfloat16, device, zero_centered=True)


@pytest.mark.skipif(not HAS_GPU, reason="the TURBO backend's Triton forward is GPU-only")
@pytest.mark.parametrize(
    "fwd", ["cpp", "triton", "triton+RBLOCK=4096+ROWS=2", "triton:inductor", "triton:auto"]
)
def test_rmsnorm_turbo_fwd_switch(fwd, device, monkeypatch):
    """TURBO with its GPU forward on the C++ kernels or a Triton forward (looped unless named:
    ``triton:MODE``), the C++ backward on the forward's rstd."""
    _skip_unsupported(BackendType.TURBO, device)
    kernel, *knobs = fwd.split("+")
    kernel, _, mode = kernel.partition(":")
    plan = "+".join([mode or "looped", *knobs])
    GlobalBackendManager.set_backend("rmsnorm", BackendType.TURBO)
    with _fwd_plan_env(monkeypatch, plan, PRIMUS_TURBO_RMSNORM_TURBO_FWD=kernel,
                       PRIMUS_TURBO_RMSNORM_TURBO_FWD_MIN_N="4096"):  # fmt: skip
        assert turbo_gpu_fwd() == (kernel, 4096)
        for shape in [(3000, 8192), (33, 16384), (257, 4096), (300, 2880), (7, 24576)]:
            _check(shape, torch.bfloat16, device)


def test_rmsnorm_fwd_knobs(monkeypatch):
    """Defaults: the Inductor-shaped forward at hidden 2048-8192 (the row up to 8192 as one
    chunk, 16 elements per lane, Inductor's hints; fastest at 2880/4096/7168/8192 in H200 run
    5.3); looped above 8192 (and above MAX_HIDDEN whatever the mode), tile below 2048; RBLOCK from
    8192 (2048 below) with one 16-byte bf16 vector per lane (16 warps of 32, 8 wavefronts of
    64), y stored evict-first (HINTS 3); bad values fall back to the defaults."""
    with _fwd_plan_env(monkeypatch, "auto"):
        for n in (2048, 2880, 4096, 7168, 8192):
            assert fwd_variant(n) == "inductor", n
        assert fwd_variant(1024) == "tile" and fwd_variant(10000) == "looped"
        lc = select_looped_config(8192)
        assert (lc.rblock, lc.num_warps, lc.hints, lc.rows) == (4096, 16, 3, 1)
        assert select_looped_config(8192, 64).num_warps == 8
        lc = select_looped_config(4096)
        assert (lc.rblock, lc.num_warps) == (2048, 8)
        assert select_looped_config(100).rblock == 128
        ic = select_inductor_config(8192)
        assert (ic.rblock, ic.num_warps, ic.rows, ic.hints) == (8192, 16, 1, 1)
        assert select_inductor_config(2880).rblock == 4096
        assert turbo_gpu_fwd() == ("cpp" if is_rocm() else "triton", 2048)
    with _fwd_plan_env(monkeypatch, "tile+RBLOCK=3000+WARPS=x+PER_THREAD=16"):
        k = fwd_knobs()
        assert k.mode == "tile" and k.rblock == 0 and k.warps == 0 and k.per_thread == 16
        assert k.hints == -1
        assert fwd_variant(8192) == "tile" and fwd_variant(70000) == "looped"
    with _fwd_plan_env(monkeypatch, "inductor+HINTS=3"):
        assert fwd_variant(2880) == "inductor" and fwd_variant(70000) == "inductor"
        assert select_inductor_config(8192).hints == 3


def test_rmsnorm_module(device):
    m = turbo.modules.RMSNorm(64, device=device, dtype=torch.bfloat16)
    assert m.eps == 1e-6 and torch.equal(m.weight, torch.ones_like(m.weight))
    x = rand(4, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    out = m(x)
    out.float().sum().backward()
    assert m.weight.grad is not None and x.grad is not None
    assert_close(out, rmsnorm_ref(x.float(), m.weight.float()), torch.bfloat16)
    zc = turbo.modules.RMSNorm((64,), eps=1e-5, zero_centered_gamma=True, device=device)
    assert torch.count_nonzero(zc.weight) == 0 and "zero_centered_gamma=True" in repr(zc)
    plain = turbo.modules.RMSNorm(64, elementwise_affine=False, device=device)
    assert plain.weight is None
    ones = torch.ones(64, device=device)
    assert_close(plain(x.detach().float()), rmsnorm_ref(x.detach().float(), ones))
    with pytest.raises(ValueError, match="normalized_shape"):
        turbo.modules.RMSNorm((4, 64))


def test_rmsnorm_bad_input(device):
    x = rand(4, 64, dtype=torch.bfloat16, device=device)
    w = rand(64, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match=r"rmsnorm: argument 'gamma' expected shape \(64,\)"):
        turbo.ops.rmsnorm(x, w[:32])
    with pytest.raises(ValueError, match="argument 'gamma' expected a 1-D tensor"):
        turbo.ops.rmsnorm(x, w.view(8, 8))
    with pytest.raises(TypeError, match="argument 'x' expected dtype"):
        turbo.ops.rmsnorm(x.to(torch.int32), w)
    with pytest.raises(TypeError, match="argument 'x' expected a torch.Tensor"):
        turbo.ops.rmsnorm([1.0, 2.0], w)
    with pytest.raises(ValueError, match="argument 'eps' expected a float >= 0"):
        turbo.ops.rmsnorm(x, w, eps=-1.0)
    if device == "cuda":
        with pytest.raises(RuntimeError, match="all tensors on one device"):
            turbo.ops.rmsnorm(x, w.cpu())


def test_rmsnorm_pinned_backend_refuses_with_reasons(device):
    x = rand(4, 64, dtype=torch.bfloat16, device=device)
    w = rand(64, dtype=torch.bfloat16, device=device)
    GlobalBackendManager.set_backend("rmsnorm", BackendType.TURBO)
    with pytest.raises(ValueError, match="pinned backend TURBO cannot handle.*TORCH: can handle"):
        turbo.ops.rmsnorm(x, w, zero_centered=True)


def test_rmsnorm_default_backend_choice():
    """GPU: C++ for 16-byte rows up to 16K, else Triton; CPU: the C++ kernel (TORCH fallback)."""

    def pick(n, dtype=torch.bfloat16, zc=False, dev="cuda"):
        x = torch.empty(2, n, dtype=dtype, device="meta")  # shape/dtype only, no device query
        proxy = SimpleNamespace(
            shape=x.shape, element_size=x.element_size, device=SimpleNamespace(type=dev)
        )
        return RMSNormDispatcher.default_backend(proxy, None, 1e-6, zc)

    assert pick(8192) == BackendType.TURBO
    assert pick(2880) == BackendType.TURBO
    assert pick(127) == BackendType.TRITON
    assert pick(32768) == BackendType.TRITON
    assert pick(8192, zc=True) == BackendType.TRITON
    assert pick(127, dev="cpu") == BackendType.TURBO


def test_triton_config_is_pure():
    cfg = select_config(8192)
    assert cfg.block_n == 8192 and cfg.rows == 1 and 1 <= cfg.num_warps <= 16
    small = select_config(127)
    assert small.block_n == 128 and small.rows == 16
    assert select_config(1).block_n == 1
