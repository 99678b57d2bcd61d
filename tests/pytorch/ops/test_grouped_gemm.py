"""Grouped GEMM (MoE experts): every backend, forward + dgrad + wgrad vs the fp32 reference."""

from __future__ import annotations

import importlib

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager
from primus_turbo.pytorch.core.platform import ArchFamily
from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_impl import GroupedGemmDispatcher
from primus_turbo.pytorch.reference import group_offsets, grouped_gemm_ref
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import assert_close, rand

pytestmark = pytest.mark.grouped_gemm

BACKENDS = [BackendType.TORCH, BackendType.TRITON, BackendType.HIPBLASLT]
# (group sizes, K, N): non-uniform with a zero group, one group, all groups empty, sizes and
# K/N that are not multiples of any tile (K=40 also exercises the masked-K path).
CASES = [
    ([3, 0, 20, 7], 32, 16),
    ([13], 16, 24),
    ([0, 0, 0], 16, 16),
    ([1, 17, 0, 33], 40, 24),
]
GPU_CASES = [
    ([512, 0, 1000, 3, 777, 2048, 129, 1], 512, 384),
    ([4096] * 4, 1024, 2048),
    ([0, 3000, 1, 0, 64, 255, 2500, 7000], 2048, 768),
    ([1], 128, 128),
]


def _skip_unsupported(backend, device, k=16, n=16, dtype=torch.bfloat16):
    if backend == BackendType.HIPBLASLT:
        if device == "cpu":
            pytest.skip(
                "HIPBLASLT (torch._grouped_mm) needs a CUDA GPU; see test_bad_* for refusals"
            )
        a = torch.empty(1, k, dtype=dtype, device=device)
        b = torch.empty(1, k, n, dtype=dtype, device=device)
        verdict = GroupedGemmDispatcher.backend_class(backend).can_handle(
            a=a, b=b, trans_b=False, out_dtype=dtype
        )
        if not verdict:
            pytest.skip(f"HIPBLASLT cannot handle this input here: {verdict.reason}")


def _operands(lens, k, n, trans_b, dtype, device):
    group_lens = torch.tensor(lens, dtype=torch.int64, device=device)
    m, g = sum(lens), len(lens)
    a = rand(m, k, dtype=dtype, device=device, requires_grad=True)
    b = rand(*((g, n, k) if trans_b else (g, k, n)), dtype=dtype, device=device, requires_grad=True)
    return a, b, group_lens


def _check_fwd_bwd(lens, k, n, trans_b, dtype, device, out_dtype=None, fn=None):
    a, b, group_lens = _operands(lens, k, n, trans_b, dtype, device)
    fn = fn or (
        lambda a, b, gl: turbo.ops.grouped_gemm(a, b, gl, trans_b=trans_b, out_dtype=out_dtype)
    )
    out = fn(a, b, group_lens)
    expect_dtype = out_dtype or dtype
    assert out.shape == (sum(lens), n) and out.dtype == expect_dtype

    a_ref = a.detach().float().requires_grad_()
    b_ref = b.detach().float().requires_grad_()
    ref = grouped_gemm_ref(a_ref, b_ref, group_lens.cpu(), trans_b, torch.float32)
    assert_close(out, ref, dtype)

    grad = rand(sum(lens), n, dtype=expect_dtype, device=device)
    out.backward(grad)
    ref.backward(grad.to(dtype).float())
    assert a.grad.shape == a.shape and a.grad.dtype == a.dtype
    assert b.grad.shape == b.shape and b.grad.dtype == b.dtype
    assert_close(a.grad, a_ref.grad, dtype)
    assert_close(b.grad, b_ref.grad, dtype)  # empty groups: exact zeros in both


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
@pytest.mark.parametrize("trans_b", [False, True], ids=["NN", "NT"])
@pytest.mark.parametrize("lens,k,n", CASES, ids=str)
def test_grouped_gemm_fwd_bwd(lens, k, n, trans_b, backend, device):
    _skip_unsupported(backend, device, k, n)
    GlobalBackendManager.set_grouped_gemm_backend(backend)
    _check_fwd_bwd(lens, k, n, trans_b, torch.bfloat16, device)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", [None, *BACKENDS], ids=lambda b: b.name if b else "default")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("trans_b", [False, True], ids=["NN", "NT"])
@pytest.mark.parametrize("lens,k,n", GPU_CASES, ids=lambda x: str(x)[:40])
def test_grouped_gemm_fwd_bwd_gpu_shapes(lens, k, n, trans_b, dtype, backend, monkeypatch, device):
    _skip_unsupported(backend, device, k, n, dtype)
    if not (dtype == torch.bfloat16 and trans_b and lens == GPU_CASES[1][0]):
        # Triton config tuning (every kernel variant x tile, compiled once per layout and
        # dtype: ~24 compiles) only for the bf16 GroupedLinear layout on one shape
        from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel

        monkeypatch.setattr(grouped_gemm_kernel, "_tune_min_work", lambda: 1 << 62)
    if backend is not None:
        GlobalBackendManager.set_grouped_gemm_backend(backend)
    _check_fwd_bwd(lens, k, n, trans_b, dtype, device)


@pytest.mark.parametrize("backend", [BackendType.TORCH, BackendType.TRITON], ids=lambda b: b.name)
def test_grouped_gemm_fp16_fp32_out(backend, device):
    GlobalBackendManager.set_grouped_gemm_backend(backend)
    _check_fwd_bwd([5, 11], 24, 20, True, torch.float16, device, out_dtype=torch.float32)


@pytest.mark.parametrize("backend", [BackendType.TORCH, BackendType.TRITON], ids=lambda b: b.name)
def test_grouped_gemm_explicit_offsets(backend, device):
    GlobalBackendManager.set_grouped_gemm_backend(backend)

    def fn(a, b, gl):
        return turbo.ops.grouped_gemm(a, b, gl, group_offs=group_offsets(gl), trans_b=True)

    _check_fwd_bwd([6, 0, 9], 16, 16, True, torch.bfloat16, device, fn=fn)


@pytest.mark.parametrize("backend", [BackendType.TORCH, BackendType.TRITON], ids=lambda b: b.name)
def test_grouped_gemm_tail_rows_are_zero(backend, device):
    """Rows past ``sum(group_lens)`` (an over-allocated ``a``) come out as zeros. The public op
    refuses such input when it can check it, so the backends are called directly."""
    a = rand(30, 16, dtype=torch.bfloat16, device=device)
    b = rand(2, 16, 16, dtype=torch.bfloat16, device=device)
    lens = torch.tensor([7, 12], device=device)
    out = GroupedGemmDispatcher.execute(
        backend, a=a, b=b, group_lens=lens, group_offs=group_offsets(lens), trans_b=False,
        out_dtype=torch.bfloat16,
    )  # fmt: skip
    assert torch.equal(out[19:].float().cpu(), torch.zeros(11, 16))
    assert_close(out[:19], grouped_gemm_ref(a[:19], b, lens.cpu(), False, torch.float32))


@pytest.mark.parametrize(
    "backend",
    [BackendType.TORCH, BackendType.TRITON, BackendType.HIPBLASLT, None],
    ids=lambda b: b.name if b is not None else "default",
)
def test_grouped_gemm_torch_compile(backend, device):
    """``None``: the default dispatch while dynamo traces (it must not touch the tune cache)."""
    if backend is not None:
        _skip_unsupported(backend, device, 16, 24)
        GlobalBackendManager.set_grouped_gemm_backend(backend)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda a, b, gl: turbo.ops.grouped_gemm(a, b, gl, trans_b=True) * 2.0, fullgraph=True
    )
    lens = [9, 0, 14]
    a, b, gl = _operands(lens, 16, 24, True, torch.bfloat16, device)
    out = compiled(a, b, gl)
    grad = rand(sum(lens), 24, dtype=torch.bfloat16, device=device)
    out.backward(grad)
    a_ref = a.detach().float().requires_grad_()
    b_ref = b.detach().float().requires_grad_()
    ref = grouped_gemm_ref(a_ref, b_ref, gl.cpu(), True, torch.float32) * 2.0
    ref.backward(grad.float())
    assert out.dtype == torch.bfloat16
    assert_close(out, ref, torch.bfloat16)
    assert_close(a.grad, a_ref.grad, torch.bfloat16)
    assert_close(b.grad, b_ref.grad, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "backend", [BackendType.TRITON, BackendType.HIPBLASLT], ids=lambda b: b.name
)
def test_grouped_gemm_no_host_sync(backend, device):
    """Forward, dgrad and wgrad never synchronise with the host (sizes stay on the device)."""
    _skip_unsupported(backend, device, 256, 384)
    GlobalBackendManager.set_grouped_gemm_backend(backend)
    a, b, gl = _operands([300, 0, 1000, 17], 256, 384, True, torch.bfloat16, device)
    grad = rand(a.shape[0], 384, dtype=torch.bfloat16, device=device)
    turbo.ops.grouped_gemm(a, b, gl, trans_b=True).backward(grad)  # warm-up: compile, caches
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = turbo.ops.grouped_gemm(a, b, gl, trans_b=True)
        out.backward(grad)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.shape == (a.shape[0], 384)


@pytest.mark.gpu
def test_grouped_gemm_cuda_graph():
    """The Triton path replays inside a CUDA graph with new group sizes (no host reads)."""
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)
    a, b, gl = _operands([100, 200, 0, 211], 128, 256, True, torch.bfloat16, "cuda")
    a = a.detach()
    b = b.detach()
    turbo.ops.grouped_gemm(a, b, gl, trans_b=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = turbo.ops.grouped_gemm(a, b, gl, trans_b=True)
    gl.copy_(torch.tensor([0, 311, 200, 0], device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, grouped_gemm_ref(a, b, gl.cpu(), True, torch.float32))


@pytest.mark.gpu
def test_grouped_gemm_int64_offsets():
    """Outputs of more than 2**31 elements: row offsets in the kernel are 64-bit."""
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)
    lens = [30000, 0, 35600]
    m, n, k = sum(lens), 32800, 16
    a = rand(m, k, dtype=torch.bfloat16, device="cuda")
    b = rand(3, n, k, dtype=torch.bfloat16, device="cuda")
    gl = torch.tensor(lens, device="cuda")
    out = turbo.ops.grouped_gemm(a, b, gl, trans_b=True)
    for row, g in ((0, 0), (29999, 0), (30000, 2), (m - 1, 2)):
        ref = a[row : row + 1].float() @ b[g].float().t()
        assert_close(out[row : row + 1], ref, torch.bfloat16)


@pytest.mark.deterministic
@pytest.mark.parametrize("backend", [BackendType.TORCH, BackendType.TRITON], ids=lambda b: b.name)
def test_grouped_gemm_deterministic(backend, device):
    GlobalBackendManager.set_grouped_gemm_backend(backend)
    lens = [20, 0, 37, 5] if device == "cpu" else [1000, 0, 3001, 77]
    k, n = (32, 24) if device == "cpu" else (1024, 768)
    a, b, gl = _operands(lens, k, n, True, torch.bfloat16, device)
    grad = rand(sum(lens), n, dtype=torch.bfloat16, device=device)
    first = None
    for _ in range(3 if device == "cpu" else 10):
        a.grad = b.grad = None
        out = turbo.ops.grouped_gemm(a, b, gl, trans_b=True)
        out.backward(grad)
        now = (out.detach().clone(), a.grad.clone(), b.grad.clone())
        first = first or now
        for x, y in zip(first, now, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["tune", "vendor", "triton"])
def test_default_dispatch_choice(mode, monkeypatch, device):
    """CPU: TORCH. CUDA: where HIPBLASLT (torch._grouped_mm) can handle the input, the faster of
    it and TRITON (timed once per shape key; PRIMUS_TURBO_GROUPED_GEMM_DEFAULT=vendor|triton
    fixes it), TRITON where it cannot (fp16 here; ROCm: always TRITON)."""
    impl = importlib.import_module("primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_impl")
    monkeypatch.setattr(impl, "_default_mode", lambda: mode)
    GlobalBackendManager.reset()
    a, b, gl = _operands([2, 3], 16, 16, False, torch.bfloat16, device)
    kw = dict(a=a, b=b, group_lens=gl, group_offs=group_offsets(gl), trans_b=False)
    got = GroupedGemmDispatcher.resolve(**kw, out_dtype=torch.bfloat16)
    if not HAS_GPU:
        assert got == BackendType.TORCH
        return
    vendor = GroupedGemmDispatcher.backend_class(BackendType.HIPBLASLT)
    ok = vendor.can_handle(**kw, out_dtype=torch.bfloat16)
    want = {"tune": got, "vendor": BackendType.HIPBLASLT, "triton": BackendType.TRITON}[mode]
    assert got in (BackendType.HIPBLASLT, BackendType.TRITON)
    assert got == (want if ok else BackendType.TRITON)
    a16, b16 = a.half(), b.half()
    kw16 = dict(kw, a=a16, b=b16)
    assert GroupedGemmDispatcher.resolve(**kw16, out_dtype=torch.float16) == BackendType.TRITON
    # the memoised answer depends on the layout: a non-unit-stride a is not handed to the vendor
    a_t = a.t().contiguous().t()
    got_t = GroupedGemmDispatcher.resolve(**dict(kw, a=a_t), out_dtype=torch.bfloat16)
    assert got_t == BackendType.TRITON


@pytest.mark.parametrize("mode", ["rounds", "flushed", "once"])
@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "step"])
def test_backend_tune_timings(mode, grad, monkeypatch):
    """The default dispatch's backend timings (PRIMUS_TURBO_GROUPED_GEMM_BACKEND_TUNE: rounds =
    interleaved rounds, flushed = single launches after an L2 flush, once = each backend
    alone): a finite time for every candidate, the forward alone or forward + dgrad + wgrad
    when a gradient will be needed."""
    if not HAS_GPU or torch.version.hip is not None:
        pytest.skip("needs an NVIDIA GPU (torch._grouped_mm is a candidate there)")
    impl = importlib.import_module("primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_impl")
    monkeypatch.setattr(impl, "_backend_tune_mode", lambda: mode)
    a, b, gl = _operands([64, 0, 96], 64, 32, True, torch.bfloat16, "cuda")
    a.requires_grad_(grad)
    b.requires_grad_(grad)
    kw = dict(a=a, b=b, group_lens=gl, group_offs=None, trans_b=True, out_dtype=torch.bfloat16)
    cands = [BackendType.TRITON, BackendType.HIPBLASLT]
    assert all(GroupedGemmDispatcher.backend_class(c).can_handle(**kw) for c in cands)
    with torch.enable_grad():
        timings = GroupedGemmDispatcher.time_candidates(cands, a.device, **kw)
    assert set(timings) == set(cands)
    assert all(0 < t < float("inf") for t in timings.values()), timings
    assert a.grad is None  # timed without autograd


def test_time_flushed_ranks_by_device_time():
    """``time_flushed``: a launch of 8x the work reads slower; every sample is device time
    after an L2 flush (a failing candidate is dropped)."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_tune import time_flushed

    if not HAS_GPU:
        pytest.skip("needs a GPU")
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)

    def launch(n):
        if n == 0:
            raise RuntimeError("does not run")
        for _ in range(n):
            x @ x

    t = time_flushed([1, 8, 0], launch)
    assert set(t) == {1, 8}
    assert 0 < t[1] < t[8] < float("inf"), t


def test_config_heuristic_is_pure():
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import (
        select_grouped_config,
        select_variable_k_config,
    )

    big = select_grouped_config(65536, 4096, 7168, 32, ArchFamily.HOPPER, 132)
    assert (big.block_m, big.block_n, big.num_warps) == (128, 256, 8)
    small = select_grouped_config(32 * 40, 4096, 7168, 32, ArchFamily.HOPPER, 132)
    assert small.block_m <= 64  # 40-row groups: a 128-row tile would be mostly padding
    for fam in (ArchFamily.CDNA3, ArchFamily.CDNA4, ArchFamily.HOPPER):
        cfg = select_variable_k_config(7168, 4096, 65536, 32, fam, 304)
        assert cfg.block_m * cfg.block_n >= 128 * 128
    assert select_grouped_config(10, 10, 10, 2, ArchFamily.CPU, 2).block_m == 16


# ---- bad input -----------------------------------------------------------------------------


def _good(device):
    a = rand(10, 16, dtype=torch.bfloat16, device=device)
    b = rand(2, 16, 8, dtype=torch.bfloat16, device=device)
    return a, b, torch.tensor([4, 6], device=device)


def test_bad_group_sum():
    a, b, _ = _good("cpu")
    with pytest.raises(
        ValueError, match=r"'group_lens' expected sizes summing to a.shape\[0\] = 10, got sum 9"
    ):
        turbo.ops.grouped_gemm(a, b, torch.tensor([4, 5]))


def test_negative_group_lens():
    a, b, _ = _good("cpu")
    with pytest.raises(
        ValueError, match=r"'group_lens' expected non-negative sizes, got \[12, -2\]"
    ):
        turbo.ops.grouped_gemm(a, b, torch.tensor([12, -2]))


@pytest.mark.gpu
def test_validate_env_checks_device_sizes(monkeypatch):
    """On the GPU the value checks need a sync: they run only when validation is requested."""
    # ops/__init__ re-exports the function under the module's name: fetch the module itself
    mod = importlib.import_module("primus_turbo.pytorch.ops.grouped_gemm")
    a, b, _ = _good("cuda")
    bad = torch.tensor([4, 5], device="cuda")
    monkeypatch.setattr(mod, "_validate_env", lambda: True)
    with pytest.raises(ValueError, match=r"sum 9"):
        turbo.ops.grouped_gemm(a, b, bad)


def test_group_count_mismatch(device):
    a, b, _ = _good(device)
    with pytest.raises(
        ValueError, match=r"'group_lens' expected one size per group of b \(G=2\), got 3 sizes"
    ):
        turbo.ops.grouped_gemm(a, b, torch.tensor([4, 3, 3], device=device))


def test_bad_group_lens_dtype(device):
    a, b, _ = _good(device)
    with pytest.raises(
        TypeError, match=r"'group_lens' expected dtype in \{int64\}, got torch.int32"
    ):
        turbo.ops.grouped_gemm(a, b, torch.tensor([4, 6], dtype=torch.int32, device=device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=str)
def test_bad_operand_dtype(dtype, device):
    a, b, gl = _good(device)
    with pytest.raises(TypeError, match=r"'a' expected dtype in \{float16, bfloat16\}"):
        turbo.ops.grouped_gemm(a.to(dtype), b, gl)
    with pytest.raises(TypeError, match=r"'b' expected dtype torch.bfloat16"):
        turbo.ops.grouped_gemm(a, b.half(), gl)


def test_bad_shapes(device):
    a, b, gl = _good(device)
    with pytest.raises(ValueError, match=r"'b' expected a 3-D tensor"):
        turbo.ops.grouped_gemm(a, b[0], gl)
    with pytest.raises(ValueError, match=r"'b' expected a reduction size K=16.*K=8"):
        turbo.ops.grouped_gemm(a, b, gl, trans_b=True)
    with pytest.raises(ValueError, match=r"'group_offs' expected an int64 \[G\+1\] = \[3\]"):
        turbo.ops.grouped_gemm(a, b, gl, group_offs=torch.tensor([0, 10], device=device))


def test_pinned_backend_refuses_with_reasons():
    a, b, gl = _good("cpu")
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.HIPBLASLT)
    with pytest.raises(ValueError, match=r"pinned backend HIPBLASLT cannot handle") as info:
        turbo.ops.grouped_gemm(a, b, gl)
    assert "TORCH: can handle" in str(info.value)


@pytest.mark.gpu
@pytest.mark.parametrize("trans_b", [False, True], ids=["NN", "NT"])
@pytest.mark.parametrize("lens,k,n", GPU_CASES[:3], ids=lambda x: str(x)[:40])
def test_grouped_gemm_tma_opt_in(lens, k, n, trans_b, monkeypatch, device):
    """The opt-in TMA forward (PRIMUS_TURBO_GROUPED_GEMM_TMA=1, Hopper) gives the same result."""
    from primus_turbo.pytorch.core.platform import cuda_capability
    from primus_turbo.triton.grouped_gemm import grouped_gemm_tma

    if cuda_capability() is None or cuda_capability() < (9, 0):
        pytest.skip("TMA descriptors need CUDA sm_90+")
    monkeypatch.setattr(grouped_gemm_tma, "tma_enabled", lambda: True)
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)
    _check_fwd_bwd(lens, k, n, trans_b, torch.bfloat16, device)


@pytest.mark.parametrize(
    "var,module,reader,bad",
    [
        ("PRIMUS_TURBO_GROUPED_GEMM_TUNE_MIN_MNK", "triton.grouped_gemm.grouped_gemm_kernel",
         "_tune_min_work", "1e9"),
        ("PRIMUS_TURBO_GROUPED_GEMM_KERNEL", "triton.grouped_gemm.grouped_gemm_kernel",
         "kernel_variant", "fast"),
        ("PRIMUS_TURBO_GROUPED_GEMM_VK", "triton.grouped_gemm.grouped_gemm_configs",
         "variable_k_variant", "flat"),
        ("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", "triton.grouped_gemm.grouped_gemm_configs",
         "candidate_set", "best"),
        ("PRIMUS_TURBO_GROUPED_GEMM_TUNE_TIMING", "triton.grouped_gemm.grouped_gemm_tune",
         "tune_timing", "cuda_graph"),
        ("PRIMUS_TURBO_GROUPED_GEMM_DEFAULT", "pytorch.kernels.grouped_gemm.grouped_gemm_impl",
         "_default_mode", "hipblaslt"),
        ("PRIMUS_TURBO_GROUPED_GEMM_BACKEND_TUNE",
         "pytorch.kernels.grouped_gemm.grouped_gemm_impl", "_backend_tune_mode", "twice"),
        ("PRIMUS_TURBO_GROUPED_GEMM_VENDOR_FIXUP",
         "pytorch.kernels.grouped_gemm.grouped_gemm_impl", "_fixup_mode", "zero"),
        ("PRIMUS_TURBO_GROUPED_GEMM_FP8_DEFAULT",
         "pytorch.kernels.grouped_gemm.grouped_gemm_fp8_impl", "_fp8_default", "aiter"),
    ],
)  # fmt: skip
def test_grouped_gemm_env_validated(var, module, reader, bad, monkeypatch):
    """Each grouped GEMM env knob raises on a bad value, naming the variable and the value."""
    fn = getattr(importlib.import_module(f"primus_turbo.{module}"), reader)
    monkeypatch.setenv(var, bad)
    fn.cache_clear()
    try:
        with pytest.raises(ValueError, match=rf"{var} expected .*got '{bad}'"):
            fn()
    finally:
        monkeypatch.delenv(var)
        fn.cache_clear()
    fn()  # the default is accepted
    fn.cache_clear()


def _force_tma(monkeypatch, device, plans=None):
    """Route the TRITON backend's forward, dgrad and wgrad through the TMA kernels (CUDA sm_90+
    or the CPU interpreter); ``plans``: one ``("tma", cfg)`` for every GEMM (else the mode)."""
    from primus_turbo.pytorch.core.platform import cuda_capability
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    if device != "cpu" and (cuda_capability() is None or cuda_capability() < (9, 0)):
        pytest.skip("TMA descriptors need CUDA sm_90+")
    monkeypatch.setattr(gk, "kernel_variant", lambda: "tma")
    monkeypatch.setattr(gk, "variable_k_variant", lambda: "tma")
    monkeypatch.setattr(gk, "_tune_min_work", lambda: 1 << 62)
    if plans is not None:
        monkeypatch.setattr(gk, "forward_plans", lambda *a: list(plans))
        monkeypatch.setattr(gk, "variable_k_plans", lambda *a: list(plans))
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)


@pytest.mark.parametrize("trans_b", [False, True], ids=["NN", "NT"])
@pytest.mark.parametrize("lens,k,n", [CASES[0], CASES[3], ([0, 9, 0], 32, 16)], ids=str)
def test_grouped_gemm_tma_kernels(lens, k, n, trans_b, monkeypatch, device):
    """PRIMUS_TURBO_GROUPED_GEMM_KERNEL=tma / _VK=tma: the flat-walk TMA forward and dgrad and
    the TMA wgrad (whole K steps by descriptor, the group's last rows masked) vs the fp32
    reference; empty and odd groups, K=40 (NN forward falls back to the pointer kernel)."""
    _force_tma(monkeypatch, device)
    _check_fwd_bwd(lens, k, n, trans_b, torch.bfloat16, device)


def _tma_plan_ids():
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import tma_configs

    return list(tma_configs(ArchFamily.HOPPER))


@pytest.mark.gpu
@pytest.mark.parametrize("trans_b", [False, True], ids=["NN", "NT"])
@pytest.mark.parametrize("cfg", _tma_plan_ids(), ids=lambda c: c.name)
def test_grouped_gemm_tma_every_config(cfg, trans_b, monkeypatch, device):
    """Every TMA tile config (incl. the 4-stage 128x256) on a ragged shape, fwd + dgrad + wgrad:
    shared memory fits and results match on the H200."""
    _force_tma(monkeypatch, device, plans=[("tma", cfg)])
    _check_fwd_bwd([0, 3000, 1, 0, 64, 255, 2500, 7000], 2048, 768, trans_b, torch.bfloat16, device)


@pytest.mark.parametrize("var", ["PRIMUS_TURBO_GROUPED_GEMM_CONFIG",
                                 "PRIMUS_TURBO_GROUPED_GEMM_VK_CONFIG"])  # fmt: skip
def test_grouped_gemm_config_filter(var, monkeypatch):
    """The config-name filters keep only the named tiles (the tuner then times those, or none
    for a single one) and raise naming the variable and the known names for an unknown one."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    plans = {
        "PRIMUS_TURBO_GROUPED_GEMM_CONFIG": lambda: gc.forward_plans(
            ArchFamily.HOPPER, "tune", True, 4096, False
        ),
        "PRIMUS_TURBO_GROUPED_GEMM_VK_CONFIG": lambda: gc.variable_k_plans(
            ArchFamily.HOPPER, "tune", True
        ),
    }[var]
    gc.config_filter.cache_clear()
    try:
        every = plans()
        # the default candidates are the measured winners (HOPPER_WINNERS): no fused wgrad,
        # no unverified session-5 plan (ws / tmas / tman: PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES=s5)
        want = {"table", "tma", "tmavs"} if "VK" in var else {"flat", "tma"}
        assert {v for v, _ in every} == want
        s4 = gc.GemmConfig(128, 256, 64, 8, 8, 4)
        monkeypatch.setenv(var, "m128n256k64g8w8s4")
        gc.config_filter.cache_clear()
        assert plans() == [("tma", s4)]
        monkeypatch.setenv(var, "tma:m128n256k64g8w8s4")  # variant:name picks one plan
        gc.config_filter.cache_clear()
        assert plans() == [("tma", s4)]
        monkeypatch.setenv(var, "m1n1k1")
        gc.config_filter.cache_clear()
        with pytest.raises(ValueError, match=rf"{var} expected config names in .*m1n1k1"):
            plans()
    finally:
        monkeypatch.delenv(var, raising=False)
        gc.config_filter.cache_clear()


def test_grouped_gemm_dgrad_config_filter(monkeypatch):
    """``..._DGRAD_CONFIG`` restricts the NN calls (the dgrad of a ``[G, N, K]`` weight) only,
    over ``..._CONFIG`` there; a named ``table:`` plan is a candidate next to the TMA ones."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    def plans(trans_b):
        return gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, trans_b)

    gc.config_filter.cache_clear()
    try:
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CONFIG", "flat:m128n256k64g8w8s3")
        monkeypatch.setenv(gc.DGRAD_CONFIG_VAR, "table:m128n256k64g8w8s3,tma:m128n256k64g8w8s4")
        gc.config_filter.cache_clear()
        cfg3, cfg4 = gc.GemmConfig(128, 256, 64, 8, 8, 3), gc.GemmConfig(128, 256, 64, 8, 8, 4)
        assert plans(True) == [("flat", cfg3)]
        assert plans(False) == [("table", cfg3), ("tma", cfg4)]
        monkeypatch.setenv(gc.DGRAD_CONFIG_VAR, "m1n1k1")
        gc.config_filter.cache_clear()
        with pytest.raises(ValueError, match=gc.DGRAD_CONFIG_VAR):
            plans(False)
        monkeypatch.delenv(gc.DGRAD_CONFIG_VAR)
        gc.config_filter.cache_clear()
        assert plans(False) == [("flat", cfg3)]  # unset: ..._CONFIG for both layouts
    finally:
        monkeypatch.delenv(gc.DGRAD_CONFIG_VAR, raising=False)
        gc.config_filter.cache_clear()


@pytest.mark.parametrize("plan", ["table:m32n32k32g4w4s1", "flat:m16n16k16g2w1s1"])
def test_grouped_gemm_dgrad_config_forced(plan, monkeypatch, device):
    """A plan forced by ``..._DGRAD_CONFIG`` runs the NN GEMMs (the dgrad of NT, the forward
    of NN) and matches the reference; the other layout keeps its default."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    if device != "cpu":
        pytest.skip("interpreter tiles; on a GPU the benchmark's A/B forces the real ones")
    monkeypatch.setenv(gc.DGRAD_CONFIG_VAR, plan)
    monkeypatch.setattr(gk, "kernel_variant", lambda: "tune")
    gc.config_filter.cache_clear()
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)
    try:
        for trans_b in (True, False):
            _check_fwd_bwd([3, 0, 20, 7], 32, 16, trans_b, torch.bfloat16, device)
    finally:
        GlobalBackendManager.reset()
        monkeypatch.delenv(gc.DGRAD_CONFIG_VAR, raising=False)
        gc.config_filter.cache_clear()


def test_grouped_gemm_candidates_winners(monkeypatch):
    """Hopper tune mode times only the measured winners (HOPPER_WINNERS) unless
    PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES=all or the groups are small (M // G below
    WINNERS_MIN_AVG_ROWS); a fixed kernel keeps every tile."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    def names(plans):
        return {(v, c.name) for v, c in plans}

    gc.candidate_set.cache_clear()
    try:
        fwd = gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True)
        assert names(fwd) == set(gc.HOPPER_WINNERS["fwd"])
        assert names(gc.variable_k_plans(ArchFamily.HOPPER, "tune", True)) == set(
            gc.HOPPER_WINNERS["vk"]
        )
        assert len(gc.variable_k_plans(ArchFamily.HOPPER, "tma", True)) == len(
            gc.tma_configs(ArchFamily.HOPPER, wgrad=True)
        )
        few = gc.WINNERS_MIN_AVG_ROWS - 1  # small groups: every plan
        assert len(gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True, few)) > len(fwd)
        # large experts (M // G >= 2048): the forward and the NN dgrad take one plan, untimed
        big = gc.VK_STORE_MIN_AVG_ROWS
        for trans_b in (True, False):
            plans = gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, trans_b, big)
            assert plans == [gc.LARGE_EXPERT_FWD_PLAN]
        # mid-size experts (1024 <= M // G < 2048): the NT forward takes one plan, the NN dgrad
        # stays tuned; PRIMUS_TURBO_GROUPED_GEMM_MID_FWD=0 turns the rule off
        mid = gc.MID_EXPERT_MIN_AVG_ROWS
        for rows in (mid, big - 1):
            plans = gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True, rows)
            assert plans == [gc.MID_EXPERT_FWD_PLAN]
            assert len(gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, False, rows)) > 1
        assert len(gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True, mid - 1)) > 1
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_MID_FWD", "0")
        gc.mid_expert_forward.cache_clear()
        assert len(gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True, mid)) > 1
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_MID_FWD")
        gc.mid_expert_forward.cache_clear()
        assert len(gc.forward_plans(ArchFamily.HOPPER, "tma", True, 4096, True, big)) > 1
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CONFIG", "m128n256k64g8w8s3")
        gc.config_filter.cache_clear()
        assert gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True, big) != [
            gc.LARGE_EXPERT_FWD_PLAN
        ]  # a config filter turns the rule off
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_CONFIG")
        gc.config_filter.cache_clear()
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", "all")
        gc.candidate_set.cache_clear()
        assert len(gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True)) > len(fwd)
        assert len(gc.forward_plans(ArchFamily.HOPPER, "tune", True, 4096, True, big)) > 1
    finally:
        monkeypatch.delenv("PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", raising=False)
        gc.candidate_set.cache_clear()
