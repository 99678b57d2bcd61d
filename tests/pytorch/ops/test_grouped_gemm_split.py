"""bf16 grouped GEMM default dispatch per direction (``PRIMUS_TURBO_GROUPED_GEMM_SPLIT=1``) and
the L2-flushed tuner timing (``PRIMUS_TURBO_TUNE_FLUSH_L2=1``, ``core.autotune.time_fn``).

The dispatch logic runs on the CPU with mocked timings (the vendor's ``can_handle`` and the
"CUDA input" test patched); the op's backward on mixed backends runs the TORCH reference and the
Triton kernels (interpreter on the CPU); the GPU test runs the real tuner with both knobs on.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager
from primus_turbo.pytorch.core.autotune import clear_l2, time_fn
from primus_turbo.pytorch.core.backend import YES
from primus_turbo.pytorch.core.platform import ArchFamily
from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_impl import GroupedGemmDispatcher
from primus_turbo.pytorch.reference import group_offsets, grouped_gemm_ref
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import assert_close, rand

pytestmark = pytest.mark.grouped_gemm

impl = importlib.import_module("primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_impl")
T, V = BackendType.TRITON, BackendType.HIPBLASLT


def _kw(trans_b=True, requires_grad=True, device="cpu"):
    lens = torch.tensor([3, 0, 5], dtype=torch.int64, device=device)
    a = rand(8, 16, dtype=torch.bfloat16, device=device, requires_grad=requires_grad)
    shape = (3, 24, 16) if trans_b else (3, 16, 24)
    b = rand(*shape, dtype=torch.bfloat16, device=device, requires_grad=requires_grad)
    return dict(a=a, b=b, group_lens=lens, group_offs=None, trans_b=trans_b,
                out_dtype=torch.bfloat16)  # fmt: skip


@pytest.fixture
def mocked(monkeypatch):
    """The default dispatch as on a vendor-capable CUDA input, timings from a table:
    forward TRITON, dgrad vendor, wgrad TRITON faster; the whole step vendor faster."""
    table = {
        ("fwd", T): 1.0, ("fwd", V): 2.0, ("dgrad", T): 2.0, ("dgrad", V): 1.0,
        ("wgrad", T): 1.0, ("wgrad", V): 2.0, (None, T): 5.0, (None, V): 4.0,
    }  # fmt: skip
    calls = []

    def fake_time(cls, backend, device, direction=None, **kwargs):
        calls.append((direction, backend))
        return table[(direction, backend)]

    monkeypatch.setenv("PRIMUS_TURBO_AUTOTUNE_CACHE", "0")
    monkeypatch.setattr(impl, "_default_tunes", lambda **kw: impl._default_mode() == "tune")
    monkeypatch.setattr(GroupedGemmDispatcher, "time_backend", classmethod(fake_time))
    monkeypatch.setattr(
        impl.GroupedGemmHipblasltBackend, "can_handle", staticmethod(lambda **k: YES)
    )
    monkeypatch.setattr(impl.GroupedGemmTritonBackend, "can_handle", staticmethod(lambda **k: YES))
    GlobalBackendManager.reset()
    impl._BWD_MEMO.clear()
    return calls


def _split(monkeypatch, on: bool):
    monkeypatch.setattr(impl, "_split_mode", lambda: on)


def test_split_decisions_cached(mocked, monkeypatch):
    """SPLIT=1: three decisions, each timed once (direction alone) and then reused (memory
    cache + memo); keys are tagged by direction."""
    _split(monkeypatch, True)
    kw = _kw()
    fwd = GroupedGemmDispatcher.resolve(**kw)
    assert fwd == T
    assert GroupedGemmDispatcher.backward_backends(fwd, **kw) == (V, T)
    assert sorted(mocked, key=str) == sorted(
        [(d, b) for d in ("fwd", "dgrad", "wgrad") for b in (T, V)], key=str
    )
    mocked.clear()
    for _ in range(3):
        assert GroupedGemmDispatcher.resolve(**kw) == T
        assert GroupedGemmDispatcher.backward_backends(T, **kw) == (V, T)
    assert mocked == []
    impl._BWD_MEMO.clear()  # memory cache alone, no new timing
    assert GroupedGemmDispatcher.backward_backends(T, **kw) == (V, T)
    assert mocked == []
    base = GroupedGemmDispatcher.make_key(**kw)
    for d in ("fwd", "dgrad", "wgrad"):
        assert GroupedGemmDispatcher.make_key(**kw, direction=d) == (d, *base)
    # another M bucket: timed again
    kw2 = dict(kw, a=rand(40, 16, dtype=torch.bfloat16, device="cpu", requires_grad=True),
               group_lens=torch.tensor([30, 0, 10]))  # fmt: skip
    assert GroupedGemmDispatcher.resolve(**kw2) == T
    assert GroupedGemmDispatcher.backward_backends(T, **kw2) == (V, T)
    assert len(mocked) == 6


def test_split_off_is_one_step_choice(mocked, monkeypatch):
    """SPLIT=0 (default): one decision for the whole step, reused by the backward."""
    _split(monkeypatch, False)
    kw = _kw()
    fwd = GroupedGemmDispatcher.resolve(**kw)
    assert fwd == V
    assert GroupedGemmDispatcher.backward_backends(fwd, **kw) == (V, V)
    assert sorted(mocked, key=str) == sorted([(None, T), (None, V)], key=str)


@pytest.mark.parametrize("mode", ["vendor", "triton"])
def test_split_respects_default_mode(mode, mocked, monkeypatch):
    """PRIMUS_TURBO_GROUPED_GEMM_DEFAULT=vendor|triton fixes every direction (no timing)."""
    _split(monkeypatch, True)
    monkeypatch.setattr(impl, "_default_mode", lambda: mode)
    monkeypatch.setattr(impl, "_untuned_default", lambda **kw: V if mode == "vendor" else T)
    kw = _kw()
    fwd = GroupedGemmDispatcher.resolve(**kw)
    assert fwd == (V if mode == "vendor" else T)
    assert GroupedGemmDispatcher.backward_backends(fwd, **kw) == (fwd, fwd)
    assert mocked == []


def test_split_pinned_backend_wins(mocked, monkeypatch):
    """A pinned backend (code setter) or an autotune request: every direction the forward's."""
    _split(monkeypatch, True)
    kw = _kw()
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)
    assert GroupedGemmDispatcher.backward_backends(T, **kw) == (T, T)
    GlobalBackendManager.set_grouped_gemm_backend(None)
    GlobalBackendManager.set_auto_tune(True)
    assert GroupedGemmDispatcher.backward_backends(V, **kw) == (V, V)
    assert mocked == []


def test_split_capture_and_compile(mocked, monkeypatch):
    """While capturing a graph: the cached answers, else the vendor (not memoised); while
    tracing: the vendor without any cache lookup."""
    _split(monkeypatch, True)
    kw = _kw()
    monkeypatch.setattr(impl, "is_graph_capturing", lambda: True)
    assert GroupedGemmDispatcher.default_backend(**kw) == V
    assert GroupedGemmDispatcher.backward_backends(T, **kw) == (V, V)
    assert not impl._BWD_MEMO and mocked == []
    monkeypatch.setattr(impl, "is_graph_capturing", lambda: False)
    assert GroupedGemmDispatcher.backward_backends(T, **kw) == (V, T)  # timed now
    impl._BWD_MEMO.clear()
    monkeypatch.setattr(impl, "is_graph_capturing", lambda: True)
    n = len(mocked)
    assert GroupedGemmDispatcher.backward_backends(T, **kw) == (V, T)  # cached answers
    assert len(mocked) == n
    monkeypatch.setattr(impl, "is_graph_capturing", lambda: False)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    impl._BWD_MEMO.clear()
    assert GroupedGemmDispatcher.backward_backends(T, **kw) == (V, V)
    assert not impl._BWD_MEMO and len(mocked) == n


class _CudaLike:
    """Just what ``make_key`` reads of a tensor, claiming a CUDA device."""

    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.dtype, self.device, self._t = t.shape, t.dtype, torch.device("cuda"), t

    def stride(self, dim: int) -> int:
        return self._t.stride(dim)


def test_flush_key_is_separate(monkeypatch):
    """A flushed timing's answer is cached under its own key (CUDA inputs only)."""
    kw = _kw()
    plain = GroupedGemmDispatcher.make_key(**dict(kw, a=_CudaLike(kw["a"])))
    monkeypatch.setattr(impl, "_tune_flush", lambda: True)
    assert "l2flush" not in GroupedGemmDispatcher.make_key(**kw)  # a CPU input
    flushed = GroupedGemmDispatcher.make_key(**dict(kw, a=_CudaLike(kw["a"])))
    assert flushed == (*plain, "l2flush")


@pytest.mark.parametrize("direction", [None, "fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("trans_b", [True, False])
def test_time_backend_directions(direction, trans_b):
    """The real ``time_backend`` times each direction alone (TORCH backend on the CPU)."""
    kw = _kw(trans_b)
    t = GroupedGemmDispatcher.time_backend(BackendType.TORCH, torch.device("cpu"), direction, **kw)
    assert math.isfinite(t) and t > 0


def test_time_fn_flush_option():
    """``time_fn(..., flush_l2=True)`` is accepted everywhere; ``clear_l2`` is a no-op off CUDA."""
    clear_l2(torch.device("cpu"))
    n = []
    t = time_fn(lambda: n.append(1), torch.device("cpu"), warmup=1, rep=3, flush_l2=True)
    assert math.isfinite(t) and len(n) == 4
    assert time_fn(lambda: 1 / 0, torch.device("cpu"), flush_l2=True) == math.inf


@pytest.mark.parametrize("fwd,dgrad,wgrad", [(BackendType.TORCH, T, BackendType.TORCH),
                                             (T, BackendType.TORCH, T)])  # fmt: skip
@pytest.mark.parametrize("offs", [False, True])
def test_op_mixed_backends(fwd, dgrad, wgrad, offs, monkeypatch):
    """The op runs dgrad and wgrad on their own backends (each with its own offsets, made from
    ``group_offs`` or ``group_lens``) and matches the reference."""
    if HAS_GPU:
        pytest.skip("CPU interpreter test (the GPU path is test_split_gpu)")
    monkeypatch.setattr(GroupedGemmDispatcher, "resolve", classmethod(lambda cls, **kw: fwd))
    monkeypatch.setattr(GroupedGemmDispatcher, "backward_backends",
                        classmethod(lambda cls, f, **kw: (dgrad, wgrad)))  # fmt: skip
    kw = _kw(trans_b=True)
    a, b, lens = kw["a"], kw["b"], kw["group_lens"]
    go = group_offsets(lens) if offs else None
    out = turbo.ops.grouped_gemm(a, b, lens, go, trans_b=True)
    grad = rand(*out.shape, dtype=out.dtype, device="cpu")
    out.backward(grad)
    a32 = a.detach().double().requires_grad_()
    b32 = b.detach().double().requires_grad_()
    ref = grouped_gemm_ref(a32, b32, lens, True, torch.float64)
    ref.backward(grad.double())
    assert_close(out, ref, torch.bfloat16)
    assert_close(a.grad, a32.grad, torch.bfloat16)
    assert_close(b.grad, b32.grad, torch.bfloat16)


@pytest.mark.parametrize(
    "var,module,reader,bad",
    [
        ("PRIMUS_TURBO_GROUPED_GEMM_SPLIT", "pytorch.kernels.grouped_gemm.grouped_gemm_impl",
         "_split_mode", "yes"),
        ("PRIMUS_TURBO_TUNE_FLUSH_L2", "triton.grouped_gemm.grouped_gemm_tune",
         "tune_flush_l2", "on"),
        ("PRIMUS_TURBO_GROUPED_GEMM_VK_LARGE_RULE", "triton.grouped_gemm.grouped_gemm_configs",
         "vk_large_rule", "off"),
    ],
)  # fmt: skip
def test_split_knobs_validated(var, module, reader, bad, monkeypatch):
    """Each new knob raises on a bad value, naming the variable and the value; 0 and 1 work."""
    fn = getattr(importlib.import_module(f"primus_turbo.{module}"), reader)
    try:
        monkeypatch.setenv(var, bad)
        fn.cache_clear()
        with pytest.raises(ValueError, match=rf"{var} expected .*got '{bad}'"):
            fn()
        for value, want in (("0", False), ("1", True)):
            monkeypatch.setenv(var, value)
            fn.cache_clear()
            assert fn() is want
    finally:
        monkeypatch.delenv(var, raising=False)
        fn.cache_clear()


def test_vk_large_rule_knob(monkeypatch):
    """``VK_LARGE_RULE=0``: large experts' wgrad candidates are timed (more than one plan)."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    big = gc.VK_STORE_MIN_AVG_ROWS
    try:
        for value, one in (("1", True), ("0", False)):
            monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_VK_LARGE_RULE", value)
            gc.vk_large_rule.cache_clear()
            plans = gc.variable_k_plans(ArchFamily.HOPPER, "tune", True, big, 7168, 2048)
            assert (len(plans) == 1) is one
    finally:
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_VK_LARGE_RULE", raising=False)
        gc.vk_large_rule.cache_clear()


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU (the real tuner on CUDA inputs)")
@pytest.mark.parametrize("trans_b", [True, False])
def test_split_gpu(trans_b, monkeypatch):
    """SPLIT=1 + FLUSH_L2=1 on the GPU: the real per-direction timing (flushed), the three
    decisions cached, the op's forward and both gradients vs the fp64 reference."""
    monkeypatch.setattr(impl, "_split_mode", lambda: True)
    monkeypatch.setattr(impl, "_tune_flush", lambda: True)
    monkeypatch.setenv("PRIMUS_TURBO_AUTOTUNE_CACHE", "0")
    GlobalBackendManager.reset()
    impl._BWD_MEMO.clear()
    lens = torch.tensor([512, 0, 1000, 3, 777, 129], dtype=torch.int64, device="cuda")
    m, g, k, n = int(lens.sum()), lens.numel(), 512, 384
    a = rand(m, k, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    b = rand(*((g, n, k) if trans_b else (g, k, n)), dtype=torch.bfloat16, device="cuda",
             requires_grad=True)  # fmt: skip
    kw = dict(a=a, b=b, group_lens=lens, group_offs=None, trans_b=trans_b,
              out_dtype=torch.bfloat16)  # fmt: skip
    fwd = GroupedGemmDispatcher.resolve(**kw)
    pair = GroupedGemmDispatcher.backward_backends(fwd, **kw)
    assert {fwd, *pair} <= {T, V}
    for d, got in zip(("fwd", "dgrad", "wgrad"), (fwd, *pair), strict=True):
        key = GroupedGemmDispatcher.make_key(**kw, direction=d)
        assert key[0] == d and key[-1] == "l2flush"
        assert GroupedGemmDispatcher._cache.get(key, impl.device_name(a.device)) == got.name
    out = turbo.ops.grouped_gemm(a, b, lens, trans_b=trans_b)
    grad = rand(*out.shape, dtype=out.dtype, device="cuda")
    out.backward(grad)
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    ref = grouped_gemm_ref(a64, b64, lens, trans_b, torch.float64)
    ref.backward(grad.double())
    assert_close(out, ref, torch.bfloat16)
    assert_close(a.grad, a64.grad, torch.bfloat16)
    assert_close(b.grad, b64.grad, torch.bfloat16)
