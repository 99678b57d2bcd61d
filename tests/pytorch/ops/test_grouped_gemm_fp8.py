"""FP8 grouped GEMM: forward, dgrad and wgrad SNR vs the fp32 reference (TENSORWISE, ROWWISE)."""

from __future__ import annotations

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager, PrecisionType
from primus_turbo.pytorch.core.low_precision import (
    Float8QuantConfig,
    Format,
    ScalingGranularity,
)
from primus_turbo.pytorch.reference import grouped_gemm_ref
from tests.pytorch.test_utils import rand, snr_db

pytestmark = pytest.mark.grouped_gemm

GRANS = [ScalingGranularity.TENSORWISE, ScalingGranularity.ROWWISE]
SNR_MIN = {Format.E4M3: 25.0, Format.HYBRID: 20.0}


def _check(lens, k, n, trans_b, gran, fmt, device):
    gl = torch.tensor(lens, dtype=torch.int64, device=device)
    m, g = sum(lens), len(lens)
    a = rand(m, k, dtype=torch.bfloat16, device=device, requires_grad=True)
    shape = (g, n, k) if trans_b else (g, k, n)
    b = rand(*shape, dtype=torch.bfloat16, device=device, requires_grad=True)
    config = Float8QuantConfig(format=fmt, granularity=gran)
    out = turbo.ops.grouped_gemm_fp8(a, b, gl, trans_b=trans_b, config=config)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    grad = rand(m, n, dtype=torch.bfloat16, device=device)
    out.backward(grad)
    a_ref = a.detach().float().requires_grad_()
    b_ref = b.detach().float().requires_grad_()
    ref = grouped_gemm_ref(a_ref, b_ref, gl.cpu(), trans_b, torch.float32)
    ref.backward(grad.float())
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    for name, got, want in (("out", out, ref), ("da", a.grad, a_ref.grad)):
        assert snr_db(want.detach().cpu(), got.detach().float().cpu()) > SNR_MIN[fmt], name
    # empty experts: exact zero weight gradient, others by SNR
    nonzero = [i for i, x in enumerate(lens) if x > 0]
    assert snr_db(b_ref.grad[nonzero].cpu(), b.grad[nonzero].float().cpu()) > SNR_MIN[fmt]
    for i, x in enumerate(lens):
        if x == 0:
            assert not b.grad[i].any()


@pytest.mark.parametrize("backend", [BackendType.TORCH, BackendType.TRITON], ids=lambda b: b.name)
@pytest.mark.parametrize("gran", GRANS, ids=lambda g: g.name)
@pytest.mark.parametrize("trans_b", [True, False], ids=["NT", "NN"])
def test_grouped_gemm_fp8(trans_b, gran, backend, device):
    GlobalBackendManager.set_grouped_gemm_backend(backend, precision=PrecisionType.FP8)
    _check([5, 0, 20, 9], 32, 24, trans_b, gran, Format.E4M3, device)


def test_grouped_gemm_fp8_hybrid(device):
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON, precision=PrecisionType.FP8)
    _check([7, 13], 48, 16, True, ScalingGranularity.ROWWISE, Format.HYBRID, device)


def _set_modes(monkeypatch, wgrad, dgrad):
    import importlib

    mod = importlib.import_module("primus_turbo.pytorch.ops.grouped_gemm_fp8")
    monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_FP8_WGRAD", wgrad)
    monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_FP8_DGRAD", dgrad)
    mod._mode.cache_clear()
    return mod


@pytest.mark.parametrize("backend", [BackendType.TORCH, BackendType.TRITON], ids=lambda b: b.name)
@pytest.mark.parametrize("wgrad,dgrad", [("fp8", "fp8"), ("hp", "hp")], ids=["fp8bw", "hpbw"])
def test_grouped_gemm_fp8_backward_modes(wgrad, dgrad, backend, monkeypatch, device):
    """Both backward precisions (env ``PRIMUS_TURBO_GROUPED_GEMM_FP8_{WGRAD,DGRAD}``)."""
    mod = _set_modes(monkeypatch, wgrad, dgrad)
    try:
        GlobalBackendManager.set_grouped_gemm_backend(backend, precision=PrecisionType.FP8)
        _check([5, 0, 11], 32, 16, True, ScalingGranularity.ROWWISE, Format.E4M3, device)
    finally:
        mod._mode.cache_clear()


def test_grouped_gemm_fp8_bad_mode(monkeypatch, device):
    mod = _set_modes(monkeypatch, "int4", "fp8")
    try:
        with pytest.raises(ValueError, match="PRIMUS_TURBO_GROUPED_GEMM_FP8_WGRAD"):
            mod._mode("WGRAD", "hp")
    finally:
        mod._mode.cache_clear()


def _skip_no_vendor(device):
    from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_fp8_impl import (
        GroupedGemmFp8Dispatcher,
    )

    a = torch.empty(1, 16, dtype=torch.bfloat16, device=device)
    impl = GroupedGemmFp8Dispatcher.backend_class(BackendType.HIPBLASLT)
    verdict = impl.can_handle(a=a, b=a[None], out_dtype=torch.bfloat16)
    if not verdict:
        pytest.skip(f"HIPBLASLT (torch._scaled_grouped_mm) cannot run here: {verdict.reason}")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", [None, BackendType.HIPBLASLT], ids=["default", "HIPBLASLT"])
@pytest.mark.parametrize("gran", GRANS, ids=lambda g: g.name)
@pytest.mark.parametrize("lens,k,n", [([512, 0, 1000, 3, 2048, 129], 1024, 768)], ids=str)
@pytest.mark.parametrize("bw", ["hp-wgrad", "fp8-wgrad", "hp-dgrad"])
def test_grouped_gemm_fp8_gpu_shapes(lens, k, n, gran, backend, bw, monkeypatch, device):
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel

    # the heuristic's tiles only: timing every candidate compiles ~24 fp8 kernels (minutes)
    monkeypatch.setattr(grouped_gemm_kernel, "_tune_min_work", lambda: 1 << 62)
    modes = {"hp-wgrad": ("hp", "fp8"), "fp8-wgrad": ("fp8", "fp8"), "hp-dgrad": ("hp", "hp")}
    mod = _set_modes(monkeypatch, *modes[bw])
    request_clear = mod._mode.cache_clear
    if backend is not None:
        _skip_no_vendor(device)
        GlobalBackendManager.set_grouped_gemm_backend(backend, precision=PrecisionType.FP8)
    try:
        _check(lens, k, n, True, gran, Format.E4M3, device)
        _check(lens, k, n, False, gran, Format.E4M3, device)
    finally:
        request_clear()


def test_grouped_gemm_fp8_blockwise_not_implemented(device):
    a = rand(8, 16, dtype=torch.bfloat16, device=device)
    b = rand(2, 8, 16, dtype=torch.bfloat16, device=device)
    gl = torch.tensor([3, 5], device=device)
    cfg = Float8QuantConfig(granularity=ScalingGranularity.BLOCKWISE, block_size=128)
    with pytest.raises(
        NotImplementedError, match=r"grouped_gemm_fp8: argument 'config.granularity'"
    ):
        turbo.ops.grouped_gemm_fp8(a, b, gl, config=cfg)


def test_grouped_gemm_fp8_bad_sizes():
    a = rand(8, 16, dtype=torch.bfloat16, device="cpu")
    b = rand(2, 8, 16, dtype=torch.bfloat16, device="cpu")
    match = r"grouped_gemm_fp8: argument 'group_lens' expected sizes summing to a.shape\[0\] = 8"
    with pytest.raises(ValueError, match=match):
        turbo.ops.grouped_gemm_fp8(a, b, torch.tensor([3, 4]))


def test_grouped_gemm_fp8_group_offs_on_another_device():
    a = rand(8, 16, dtype=torch.bfloat16, device="cpu")
    b = rand(2, 8, 16, dtype=torch.bfloat16, device="cpu")
    offs = torch.zeros(3, dtype=torch.int64, device="meta")
    match = "grouped_gemm_fp8: argument 'group_offs' expected a tensor on cpu, got meta"
    with pytest.raises(ValueError, match=match):
        turbo.ops.grouped_gemm_fp8(a, b, torch.tensor([3, 5]), group_offs=offs)


# ---- the TMA fp8 forward kernel (grouped_gemm_fp8_tma, PRIMUS_TURBO_GROUPED_GEMM_FP8_TMA) ----


def _tma_case(lens, n, k, device, tail=0, tensorwise=False):
    """fp8 operands, scales and the dequantized fp32 reference (rows past the groups: 0)."""
    torch.manual_seed(len(lens) + n + k)
    g, m = len(lens), sum(lens) + tail
    f8 = torch.float8_e4m3fn
    a = (torch.randn(m, k, device=device) * 4).to(f8)
    b = (torch.randn(g, n, k, device=device) * 4).to(f8)
    sa = torch.rand((1 if tensorwise else m), device=device) + 0.25
    sa = sa.expand(m) if tensorwise else sa
    sb = torch.rand(g, n, device=device) + 0.25
    offs = torch.zeros(g + 1, dtype=torch.int64, device=device)
    offs[1:] = torch.tensor(lens, device=device).cumsum(0)
    ref = torch.zeros(m, n, device=device)
    for i in range(g):
        s, e = int(offs[i]), int(offs[i + 1])
        if e > s:
            ref[s:e] = (a[s:e].float() * sa[s:e, None]) @ (b[i].float() * sb[i][:, None]).t()
    return a, b, sa, sb, offs, ref


def _tma_skip(device):
    if device == "cuda" and (torch.version.hip or torch.cuda.get_device_capability()[0] < 9):
        pytest.skip("TMA descriptors need CUDA sm_90+")


@pytest.mark.parametrize("tensorwise", [False, True], ids=["rowwise", "tensorwise"])
def test_grouped_gemm_fp8_tma_kernel_interpreter(tensorwise, device):
    """Every interpreter tile of the TMA fp8 kernel (GPU: covered by the _gpu test): odd and
    empty groups, an empty first and last group, rows past the last group zeroed, N and K not
    multiples of the tile (descriptor zero-fill / next expert's rows masked out)."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    if device != "cpu":
        pytest.skip("interpreter tiles; the GPU tiles run in test_grouped_gemm_fp8_tma_gpu")
    a, b, sa, sb, offs, ref = _tma_case([0, 5, 0, 20, 9, 0], 24, 48, device, 3, tensorwise)
    assert mod.fp8_tma_usable(a, b, torch.bfloat16)
    for variant, cfg in mod.fp8_tma_plans(ArchFamily.CPU):
        c = mod.grouped_gemm_fp8_tma(a, b, offs, sa, sb, torch.float32, cfg, variant)
        torch.testing.assert_close(c, ref, rtol=1e-5, atol=1e-4, msg=f"{variant} {cfg.name}")


def test_grouped_gemm_fp8_tma_usable_and_env(monkeypatch, device):
    """fp8_tma_usable: 1-byte operands with 16-byte rows only; the env var switches it off; a
    config filter naming no candidate raises naming the variable."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    _tma_skip(device)
    f8 = torch.float8_e4m3fn
    a = torch.zeros(8, 32, dtype=f8, device=device)
    b = torch.zeros(2, 16, 32, dtype=f8, device=device)
    try:
        for value, want in (("1", True), ("0", False)):
            monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_FP8_TMA", value)
            mod.fp8_tma_enabled.cache_clear()
            assert mod.fp8_tma_usable(a, b, torch.bfloat16) is want
        mod.fp8_tma_enabled.cache_clear()
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_FP8_TMA", "1")
        a24 = torch.zeros(8, 24, dtype=f8, device=device)  # 24-byte rows
        assert not mod.fp8_tma_usable(a24, torch.zeros(2, 16, 24, dtype=f8, device=device),
                                      torch.bfloat16)  # fmt: skip
        assert not mod.fp8_tma_usable(a.to(torch.bfloat16), b, torch.bfloat16)
        assert not mod.fp8_tma_usable(a, b.transpose(1, 2), torch.bfloat16)
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_FP8_CONFIG", "m1n1k1g1w1s1")
        mod.fp8_config_filter.cache_clear()
        with pytest.raises(ValueError, match="PRIMUS_TURBO_GROUPED_GEMM_FP8_CONFIG"):
            mod.fp8_tma_plans(ArchFamily.HOPPER)
        monkeypatch.setenv(
            "PRIMUS_TURBO_GROUPED_GEMM_FP8_CONFIG", "m128n128k128g8w4s3,f8s:m128n256k128g8w8s3"
        )
        mod.fp8_config_filter.cache_clear()
        got = [f"{v}:{c.name}" for v, c in mod.fp8_tma_plans(ArchFamily.HOPPER)]
        assert got == ["f8s:m128n128k128g8w4s3", "f8s:m128n256k128g8w8s3"]
    finally:
        mod.fp8_tma_enabled.cache_clear()
        mod.fp8_config_filter.cache_clear()


def _hopper_plans():
    """Session 7's plans (``PRIMUS_TURBO_GROUPED_GEMM_FP8_KERNEL=tma``; ``f8tma`` is also the
    fallback for outputs the TMA store cannot take)."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    h = ArchFamily.HOPPER
    return [("f8tma", c) for c in mod.fp8_tma_configs(h)] + [
        ("f8tmas", c) for c in mod.fp8_tma_configs(h) if mod._tma_store_cfg(c, h)
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("plan", _hopper_plans(), ids=lambda p: f"{p[0]}-{p[1].name}")
def test_grouped_gemm_fp8_tma_gpu(plan, device):
    """Every sm_90 candidate plan of the TMA fp8 kernels vs the dequantized fp32 product (bf16
    out: relative error of bf16 rounding), rows past the groups zeroed; aligned sizes and
    ragged ones (N, K not multiples of the tile)."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    _tma_skip(device)
    variant, cfg = plan
    bad = []
    for lens, n, k in ([512, 0, 1000, 3, 2048, 129, 0], 768, 1024), ([0, 77, 300, 0], 1000, 1040):
        a, b, sa, sb, offs, ref = _tma_case(lens, n, k, device, tail=5)
        assert mod.fp8_tma_usable(a, b, torch.bfloat16)
        c = mod.grouped_gemm_fp8_tma(a, b, offs, sa, sb, torch.bfloat16, cfg, variant).float()
        err = ((c - ref).norm() / ref.norm()).item()
        if not err < 5e-3 or c[sum(lens) :].any():
            bad.append(f"{lens}, {n}, {k}: rel err {err:.2e}")
    assert not bad, bad


@pytest.mark.gpu
@pytest.mark.parametrize("tma", ["1", "0"], ids=["tma", "pointer"])
@pytest.mark.parametrize("gran", GRANS, ids=lambda g: g.name)
def test_grouped_gemm_fp8_tma_op(tma, gran, monkeypatch, device):
    """The op end to end with the TMA fp8 forward on and off (env), forward + both grads by
    SNR, odd and empty groups."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel

    _tma_skip(device)
    monkeypatch.setattr(grouped_gemm_kernel, "_tune_min_work", lambda: 1 << 62)
    monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_FP8_TMA", tma)
    mod.fp8_tma_enabled.cache_clear()
    try:
        fp8 = PrecisionType.FP8
        GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON, precision=fp8)
        _check([300, 0, 1000, 7, 0, 129], 1024, 768, True, gran, Format.E4M3, device)
    finally:
        mod.fp8_tma_enabled.cache_clear()


def test_grouped_gemm_fp8_weight_cache(monkeypatch, device):
    """PRIMUS_TURBO_GROUPED_GEMM_FP8_WEIGHT_CACHE=1: the weights are quantized once while the
    tensor is unchanged, again after an in-place update (version counter), the output equals
    the uncached one, and the entry goes with the weight."""
    import gc
    import importlib

    mod = importlib.import_module("primus_turbo.pytorch.ops.grouped_gemm_fp8")
    calls = []
    real = mod._quant_experts
    monkeypatch.setattr(mod, "_quant_experts", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_FP8_WEIGHT_CACHE", "1")
    mod._weight_cache_on.cache_clear()
    try:
        gl = torch.tensor([5, 0, 11], device=device)
        a = rand(16, 32, dtype=torch.bfloat16, device=device)
        b = rand(3, 24, 32, dtype=torch.bfloat16, device=device, requires_grad=True)
        cfg = Float8QuantConfig(granularity=ScalingGranularity.ROWWISE)
        out1 = turbo.ops.grouped_gemm_fp8(a, b, gl, config=cfg)
        out2 = turbo.ops.grouped_gemm_fp8(a, b, gl, config=cfg)
        assert len(calls) == 1 and torch.equal(out1, out2)
        with torch.no_grad():
            b.mul_(2)
        out3 = turbo.ops.grouped_gemm_fp8(a, b, gl, config=cfg)
        assert len(calls) == 2
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_FP8_WEIGHT_CACHE", "0")
        mod._weight_cache_on.cache_clear()
        assert torch.equal(out3, turbo.ops.grouped_gemm_fp8(a, b, gl, config=cfg))
        key = id(b)
        assert key in mod._WEIGHT_CACHE
        del b, out1, out2, out3  # the outputs' graphs hold b
        gc.collect()
        assert key not in mod._WEIGHT_CACHE
    finally:
        mod._weight_cache_on.cache_clear()
        mod._WEIGHT_CACHE.clear()


def test_grouped_gemm_fp8_weight_cache_never_stale(monkeypatch, device):
    """The cached weight quantization is never reused after the weight changed: an in-place
    update through ``.detach()`` (version counter), a fused optimizer step (no version bump:
    the step hook empties the cache), a ``.data`` write followed by ``clear_weight_cache``;
    each output equals the uncached one. CUDA: a captured forward quantizes in the graph, so a
    replay after an in-place update uses the new weights."""
    import importlib

    mod = importlib.import_module("primus_turbo.pytorch.ops.grouped_gemm_fp8")
    cfg = Float8QuantConfig(granularity=ScalingGranularity.ROWWISE)
    gl = torch.tensor([5, 0, 11], device=device)
    a = rand(16, 32, dtype=torch.bfloat16, device=device)
    b = torch.nn.Parameter(rand(3, 24, 32, dtype=torch.bfloat16, device=device))

    def run(cache: str):
        monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_FP8_WEIGHT_CACHE", cache)
        mod._weight_cache_on.cache_clear()
        with torch.no_grad():
            return turbo.ops.grouped_gemm_fp8(a, b, gl, config=cfg)

    def check_fresh():
        torch.testing.assert_close(run("1"), run("0"), rtol=0, atol=0)

    try:
        check_fresh()
        with torch.no_grad():
            b.detach().mul_(-1.5)
        check_fresh()
        b.grad = rand(*b.shape, dtype=torch.bfloat16, device=device)
        try:
            torch.optim.AdamW([b], lr=0.5, fused=True).step()
        except RuntimeError:  # no fused kernel for this device / dtype
            torch.optim.SGD([b], lr=0.5).step()
        check_fresh()
        run("1")
        b.data.mul_(0.25)  # no version bump
        mod.clear_weight_cache()
        check_fresh()
        if device != "cpu":
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                run("0")  # warm-up off the default stream
                run("1")  # cache filled: the capture below must not use it
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=stream), torch.no_grad():
                    captured = turbo.ops.grouped_gemm_fp8(a, b, gl, config=cfg)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.no_grad():
                b.mul_(3.0)
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(captured, run("0"), rtol=0, atol=0)
    finally:
        mod._weight_cache_on.cache_clear()
        mod.clear_weight_cache()


def test_weight_cache_entry_rules():
    """``WeightCache``, the one mechanism of the raw op's cache and the modules'
    ``Fp8WeightCache``: an entry serves only its own tensor, is fresh while the signature
    (version counter, ...) and the generation hold, and goes with its tensor unless the key
    was given to another tensor since."""
    import gc

    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import (
        WeightCache,
        clear_weight_cache,
        weight_signature,
    )

    cache = WeightCache()
    w, v = torch.randn(2, 3), torch.randn(2, 3)
    cache.put("k", w, weight_signature(w), "q")
    hit = cache.entry("k", w)
    assert cache.fresh(hit, weight_signature(w)) and hit[2] == "q"
    assert cache.entry("k", v) is None
    w.add_(1)  # version counter
    assert not cache.fresh(cache.entry("k", w), weight_signature(w))
    cache.put("k", w, weight_signature(w), "q2")
    clear_weight_cache()  # generation
    assert not cache.fresh(cache.entry("k", w), weight_signature(w))
    cache.put("k", v, weight_signature(v), "r")
    del w
    gc.collect()
    assert cache["k"][2] == "r"  # w's death does not drop v's entry
    del v
    gc.collect()
    assert "k" not in cache


# ---- session 8: grouped_gemm_fp8_pre_kernel (plan f8s; env ..._FP8_KERNEL) ----


def _pre_plans(family):
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    return [(v, cfg) for v in mod.PRE_VARIANTS for cfg in mod.fp8_tma_configs(family)]


@pytest.mark.parametrize("tensorwise", [False, True], ids=["rowwise", "tensorwise"])
def test_grouped_gemm_fp8_pre_kernel_interpreter(tensorwise, device):
    """Every interpreter tile of the session-8 plans vs the dequantized fp32 product: odd,
    empty and multi-tile ragged groups (remainders above and at most half a tile; groups
    smaller than a tile), rows past the last group zeroed, N and K not multiples of the
    tile."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    if device != "cpu":
        pytest.skip("interpreter tiles; the GPU tiles run in test_grouped_gemm_fp8_pre_gpu")
    for lens in ([0, 5, 0, 20, 9, 0], [40, 0, 7, 33, 16, 12, 25, 8]):
        a, b, sa, sb, offs, ref = _tma_case(lens, 24, 48, device, 3, tensorwise)
        for variant, cfg in _pre_plans(ArchFamily.CPU):
            c = mod.grouped_gemm_fp8_tma(a, b, offs, sa, sb, torch.float32, cfg, variant)
            msg = f"{lens} {variant} {cfg.name}"
            torch.testing.assert_close(c, ref, rtol=1e-5, atol=1e-4, msg=msg)


def test_grouped_gemm_fp8_kernel_env(monkeypatch):
    """PRIMUS_TURBO_GROUPED_GEMM_FP8_KERNEL picks the tuner's plan kinds (pre default, tma,
    all); a bad value (the removed ``mixed`` too) raises naming the variable."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    try:
        for value, kinds in (("", {"f8s"}), ("pre", {"f8s"}), ("tma", {"f8tma", "f8tmas"}),
                             ("all", {"f8tma", "f8tmas", "f8s"})):  # fmt: skip
            monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_FP8_KERNEL", value)
            mod.fp8_kernel_set.cache_clear()
            assert {v for v, _ in mod.fp8_tma_plans(ArchFamily.HOPPER)} == kinds, value
        for bad in ("bogus", "mixed"):
            monkeypatch.setenv("PRIMUS_TURBO_GROUPED_GEMM_FP8_KERNEL", bad)
            mod.fp8_kernel_set.cache_clear()
            with pytest.raises(ValueError, match="PRIMUS_TURBO_GROUPED_GEMM_FP8_KERNEL"):
                mod.fp8_tma_plans(ArchFamily.HOPPER)
    finally:
        mod.fp8_kernel_set.cache_clear()


def _pre_plans_hopper():
    from primus_turbo.pytorch.core.platform import ArchFamily

    return _pre_plans(ArchFamily.HOPPER)


@pytest.mark.gpu
@pytest.mark.parametrize("plan", _pre_plans_hopper(), ids=lambda p: f"{p[0]}-{p[1].name}")
def test_grouped_gemm_fp8_pre_gpu(plan, device):
    """Every sm_90 session-8 plan vs the dequantized fp32 product, rows past the groups zeroed;
    f8s bitwise equal to the f8tma plan of the same tile (same MMA order, same scaling; a
    moved-up tile recomputes its rows with the same instructions); deterministic (a second
    run equal). A Qwen3-like case (many small groups with remainders below and above half a
    tile, K = 768) and ragged N / K."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    _tma_skip(device)
    variant, cfg = plan
    bad = []
    qwen = [0, 300, 517, 1, 129, 0, 640, 255, 256, 1000, 77, 0, 384, 511, 2, 700, 64, 40, 192]
    cases = (([512, 0, 1000, 3, 2048, 129, 0], 768, 1024), ([0, 77, 300, 0], 1000, 1040),
             (qwen, 2048, 768))  # fmt: skip
    for lens, n, k in cases:
        a, b, sa, sb, offs, ref = _tma_case(lens, n, k, device, tail=5)
        c = mod.grouped_gemm_fp8_tma(a, b, offs, sa, sb, torch.bfloat16, cfg, variant)
        old = mod.grouped_gemm_fp8_tma(a, b, offs, sa, sb, torch.bfloat16, cfg, "f8tma")
        err = ((c.float() - ref).norm() / ref.norm()).item()
        same = torch.equal(c, old)
        again = torch.equal(c, mod.grouped_gemm_fp8_tma(a, b, offs, sa, sb, torch.bfloat16, cfg,
                                                        variant))  # fmt: skip
        if not same or not again or not err < 5e-3 or c[sum(lens) :].any():
            bad.append(f"{lens}, {n}, {k}: equal {same}, again {again}, rel err {err:.2e}")
    assert not bad, bad
