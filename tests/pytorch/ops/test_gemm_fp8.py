"""FP8 GEMM: output and both gradients vs the fp32 reference by SNR, per granularity, format,
backend and layout. CPU: TORCH backend and the Triton kernel under the interpreter, tiny shapes."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core import BackendType, GlobalBackendManager
from primus_turbo.pytorch.core.backend import BackendChoice
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity
from primus_turbo.pytorch.core.platform import fp8_dtypes
from primus_turbo.pytorch.kernels.gemm.gemm_fp8_impl import GemmFp8Dispatcher
from primus_turbo.pytorch.ops.gemm_fp8 import gemm_fp8
from primus_turbo.pytorch.reference import gemm_ref
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import snr_db

pytestmark = pytest.mark.gemm_fp8

DEV = "cuda" if HAS_GPU else "cpu"
G = ScalingGranularity
GRANS = [G.TENSORWISE, G.ROWWISE, G.BLOCKWISE]
E4M3_DEV = fp8_dtypes(DEV)[0]
GATE = {Format.E4M3: (25, 25), Format.E5M2: (20, 20), Format.HYBRID: (25, 20)}  # (out, grads)

if HAS_GPU:
    CASES = [
        (m, n, k, ta, tb, be)
        for (m, n, k) in [(256, 512, 384), (1000, 1000, 1000), (4096, 4096, 4096), (300, 4096, 576)]
        for (ta, tb) in [(False, True), (False, False), (True, False), (True, True)]
        for be in [None, BackendType.HIPBLASLT, BackendType.TRITON, BackendType.TORCH]
    ]
else:  # the interpreter runs about 2 s per fwd+bwd at these sizes
    CASES = [
        (40, 48, 160, False, True, BackendType.TRITON),
        (33, 20, 144, True, False, BackendType.TORCH),
        (17, 24, 130, False, False, BackendType.TORCH),
    ]


def _cfg(g, fmt=Format.E4M3):
    return Float8QuantConfig(
        format=fmt, granularity=g, block_size=128 if g == G.BLOCKWISE else None
    )


def _gemm_calls(a, b, ta, tb, g, dtype):
    """The three NT GEMMs of one fwd+bwd as ops/gemm_fp8.py issues them (name, kwargs)."""
    from primus_turbo.pytorch.ops.gemm_fp8 import _quant_dual

    two_d = g == G.BLOCKWISE
    qa, qa_t = _quant_dual((a.t() if ta else a).detach(), E4M3_DEV, g)
    qb, qb_t = _quant_dual((b if tb else b.t()).detach(), E4M3_DEV, g, two_d)
    m, n = qa[0].shape[0], qb[0].shape[0]
    qg, qg_t = _quant_dual(torch.randn(m, n, device=DEV).to(dtype), E4M3_DEV, g)
    pairs = {"fwd": (qa, qb), "dgrad": (qg, qb_t), "wgrad": (qg_t, qa_t) if tb else (qa_t, qg_t)}
    return {
        name: dict(
            a=x[0],
            b=y[0],
            sa=x[1],
            sb=y[1],
            granularity=g.value,
            sa_group=x[2],
            sb_group=y[2],
            out_dtype=dtype,
        )  # fmt: skip
        for name, (x, y) in pairs.items()
    }


def _run(m, n, k, ta, tb, g, fmt, backend, dtype=torch.bfloat16):
    a = torch.randn(*((k, m) if ta else (m, k)), device=DEV).to(dtype).requires_grad_()
    b = torch.randn(*((n, k) if tb else (k, n)), device=DEV).to(dtype).requires_grad_()
    cfg = _cfg(g, fmt)
    choice = BackendChoice(backend) if backend is not None else None
    calls = _gemm_calls(a, b, ta, tb, g, dtype)
    if backend is not None:  # a pinned backend must handle all three GEMMs, else skip (why)
        impl = GemmFp8Dispatcher.backend_class(backend)
        for name, kw in calls.items():
            verdict = impl.can_handle(**kw)
            if not verdict:
                pytest.skip(f"{backend.name} cannot handle the {name} GEMM: {verdict.reason}")
    resolved = {name: GemmFp8Dispatcher.resolve(choice, **kw).name for name, kw in calls.items()}
    info = (f"M={m} N={n} K={k} trans_a={ta} trans_b={tb} {g.name} {fmt.name} backends "
            f"{resolved}")  # fmt: skip
    try:
        out = gemm_fp8(a, b, ta, tb, config=cfg, backend=choice)
        grad = torch.randn(m, n, device=DEV).to(dtype)
        out.backward(grad)
    except Exception as e:
        raise AssertionError(f"{info}: {type(e).__name__}: {e}") from e
    assert out.shape == (m, n) and out.dtype == dtype, info
    a_ref = a.detach().double().requires_grad_()
    b_ref = b.detach().double().requires_grad_()
    ref = gemm_ref(a_ref, b_ref, ta, tb, torch.float64, acc_dtype=torch.float64)
    ref.backward(grad.double())
    assert a.grad.shape == a.shape and b.grad.shape == b.shape, info
    gate_out, gate_grad = GATE[fmt]
    snrs = (snr_db(ref, out), snr_db(a_ref.grad, a.grad), snr_db(b_ref.grad, b.grad))
    msg = f"{info}: SNR out/da/db {snrs[0]:.1f}/{snrs[1]:.1f}/{snrs[2]:.1f} dB"
    assert snrs[0] >= gate_out and min(snrs[1:]) >= gate_grad, msg


@pytest.mark.parametrize("g", GRANS, ids=lambda g: g.name)
@pytest.mark.parametrize("m,n,k,ta,tb,backend", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_gemm_fp8_snr(m, n, k, ta, tb, backend, g):
    _run(m, n, k, ta, tb, g, Format.E4M3, backend)


@pytest.mark.parametrize("fmt", [Format.E5M2, Format.HYBRID], ids=lambda f: f.name)
@pytest.mark.parametrize("g", GRANS, ids=lambda g: g.name)
def test_gemm_fp8_formats(fmt, g):
    if not HAS_GPU and g != G.TENSORWISE:
        pytest.skip("CPU tier checks one granularity per format (interpreter time budget)")
    shape = (512, 768, 1024) if HAS_GPU else (32, 16, 128)
    _run(*shape, False, True, g, fmt, None if HAS_GPU else BackendType.TORCH)


@pytest.mark.parametrize("g", GRANS, ids=lambda g: g.name)
def test_gemm_fp8_zero_size(g):
    for m, n, k in [(0, 16, 128), (16, 0, 128), (16, 16, 0)]:
        a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=DEV, dtype=torch.bfloat16)
        out = gemm_fp8(a, b, trans_b=True, config=_cfg(g), backend=BackendChoice(BackendType.TORCH))
        assert out.shape == (m, n) and (out == 0).all()


def test_gemm_fp8_default_backends():
    a = torch.randn(256, 256, device=DEV, dtype=torch.bfloat16)
    kw = dict(a=a, b=a, sa=a.new_ones(()), sb=a.new_ones(()), sa_group=1, sb_group=1,
              out_dtype=torch.bfloat16)  # fmt: skip
    want_tw = BackendType.HIPBLASLT if HAS_GPU else BackendType.TRITON
    assert GemmFp8Dispatcher.default_backend(granularity=G.TENSORWISE.value, **kw) == want_tw
    # BLOCKWISE: test_gemm_fp8_blockwise_default_prefers_scaled_mm (real block scales)


def test_gemm_fp8_blockwise_default_prefers_scaled_mm():
    """BLOCKWISE default: HIPBLASLT (cuBLASLt) wherever it can handle the GEMM on CUDA, else
    TRITON; every GEMM of a Linear-like fwd+bwd is checked."""
    a = torch.randn(512, 512, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(1024, 512, device=DEV, dtype=torch.bfloat16)
    for name, kw in _gemm_calls(a, b, False, True, G.BLOCKWISE, torch.bfloat16).items():
        got = GemmFp8Dispatcher.default_backend(**kw)
        hip = GemmFp8Dispatcher.backend_class(BackendType.HIPBLASLT).can_handle(**kw)
        if not HAS_GPU:
            want = BackendType.TRITON
        elif hip and torch.version.hip is None:
            want = BackendType.HIPBLASLT
        else:
            want = BackendType.TRITON
        assert got == want, f"{name}: {got} (HIPBLASLT: {hip.reason or 'can handle'})"


def test_gemm_fp8_bad_inputs():
    a = torch.randn(16, 128, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="reduction size"):
        gemm_fp8(a, torch.randn(64, 16, device=DEV, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="config"):
        gemm_fp8(a, a, trans_b=True, config="tensorwise")
    with pytest.raises(ValueError, match="block_size"):
        gemm_fp8(a, a, trans_b=True, config=Float8QuantConfig(granularity=G.BLOCKWISE,
                                                               block_size=64))  # fmt: skip
    with pytest.raises(TypeError, match="dtype"):
        gemm_fp8(a, a.half(), trans_b=True)
    with pytest.raises(ValueError, match="2-D"):
        gemm_fp8(a[0], a, trans_b=True)


@pytest.mark.skipif(not HAS_GPU, reason="HIPBLASLT needs a GPU")
def test_pinned_hipblaslt_refuses_with_reason():
    a = torch.randn(16, 100, device=DEV, dtype=torch.bfloat16)  # K=100: not a multiple of 16
    with pytest.raises(ValueError, match="cannot handle"):
        gemm_fp8(a, a, trans_b=True, backend=BackendChoice(BackendType.HIPBLASLT))


@pytest.mark.skipif(not HAS_GPU, reason="determinism is a GPU property (the CPU tier is exact)")
@pytest.mark.deterministic
@pytest.mark.parametrize("g", GRANS, ids=lambda g: g.name)
def test_gemm_fp8_triton_deterministic(g):
    GlobalBackendManager.set_gemm_backend(BackendType.TRITON)
    try:
        a = torch.randn(1000, 1000, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(1000, 1000, device=DEV, dtype=torch.bfloat16)
        first = gemm_fp8(a, b, trans_b=True, config=_cfg(g))
        for _ in range(5):
            torch.testing.assert_close(gemm_fp8(a, b, trans_b=True, config=_cfg(g)), first,
                                       rtol=0, atol=0)  # fmt: skip
    finally:
        GlobalBackendManager.reset()


def _torch_accepts(t_shape, scale, kind):
    """Mirror of torch's ``is_blockwise_1x128_scaling`` / ``is_blockwise_128x128_scaling``
    (aten/src/ATen/native/cuda/Blas.cpp) for an operand of shape ``t_shape`` = (R, K)."""
    r, k = t_shape

    def size_stride(dim, size, stride):
        return scale.shape[dim] == size and (size <= 1 or scale.stride(dim) == stride)

    kb = -(-k // 128)
    if scale.dtype != torch.float32 or scale.dim() != 2:
        return False
    if kind == "1x128":
        return size_stride(0, r, 1) and size_stride(1, kb, r)
    return size_stride(0, -(-r // 128), kb) and size_stride(1, kb, 1)


@pytest.mark.parametrize("two_d", [True, False], ids=["1x128_128x128", "1x128_1x128"])
def test_blockwise_scaled_mm_scale_layouts(two_d):
    """The scales handed to torch._scaled_mm(a, b.t(), scale_a, scale_b) pass torch's checks:
    ``is_desired_scaling(a, scale_a)`` and ``is_desired_scaling(b.t(), scale_b.t())`` (this
    failed on the H200 with "Invalid scaling configuration" before the fix)."""
    from primus_turbo.pytorch.kernels.gemm.gemm_fp8_impl import _blockwise_scales_for_scaled_mm
    from primus_turbo.pytorch.ops.gemm_fp8 import _quant_dual

    m, n, k = 48, 256, 512
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(n, k, device=DEV, dtype=torch.bfloat16)
    qa, _ = _quant_dual(a, E4M3_DEV, G.BLOCKWISE)
    qb, _ = _quant_dual(b, E4M3_DEV, G.BLOCKWISE, two_d)
    sa, sb = _blockwise_scales_for_scaled_mm(qa[1], qb[1], qa[2], qb[2])
    assert _torch_accepts((m, k), sa, "1x128")
    assert _torch_accepts((n, k), sb.t(), "128x128" if two_d else "1x128")
    # any other layout of the same values is re-laid out, never passed through wrongly
    odd_a = qa[1].contiguous()
    odd_b = qb[1].t().contiguous().t() if two_d else qb[1].contiguous()
    sa2, sb2 = _blockwise_scales_for_scaled_mm(odd_a, odd_b, qa[2], qb[2])
    assert _torch_accepts((m, k), sa2, "1x128") and torch.equal(sa2, qa[1])
    assert _torch_accepts((n, k), sb2.t(), "128x128" if two_d else "1x128")
    assert torch.equal(sb2.t(), qb[1])


def _launch_block(qa, qb, cfg, family, out_dtype=torch.float32):
    """The blockwise Triton kernel with one given config on ``(q, s, group)`` operands."""
    from primus_turbo.triton.gemm import gemm_fp8_kernel as kern

    out = torch.empty(qa[0].shape[0], qb[0].shape[0], device=DEV, dtype=out_dtype)
    strides = (kern._scale_strides(qa[1]), kern._scale_strides(qb[1]))
    kern._launch(qa[0], qb[0], out, qa[1], qb[1], kern.BLOCK, qa[2], qb[2], *strides, cfg, family)
    return out


# sm_90 fp8 wgmma sums in a reduced-precision adder (about 13 fraction bits, truncating; the
# "fast accumulation" of cuBLAS); Triton's sm_90 default max_num_imprecise_acc is 2**30, so every
# K-block product is that imprecise (v1) and RESCALE also chains the running sum through it.
# An emulation of that adder on these inputs gives v1 0.7-2.1e-4 and RESCALE 1.0-3.4e-4 relative
# max error at K <= 1100 (RESCALE 1.6e-3 at K = 16384, v1 1.6e-4); the interpreter multiplies
# exactly in fp32. Logic bugs (a wrong K-block scale, edge rows, the K tail) are >= 1e-2 here.
BLOCK_TOL = 1e-5 if DEV == "cpu" else 2e-3


def _block_err(out, ref, what: str) -> tuple[float, str]:
    """Relative max error and a message naming where it is (row, col, out, ref)."""
    diff = (out.float() - ref).abs()
    flat = int(torch.nan_to_num(diff, nan=float("inf")).argmax())
    i, j = divmod(flat, diff.shape[1])
    err = float(diff.max() / ref.abs().max())
    return err, (
        f"{what}: relative max error {err:.2e} at [{i}, {j}] of {tuple(out.shape)}: "
        f"out {float(out[i, j]):.6g} ref {float(ref[i, j]):.6g} (|ref| max "
        f"{float(ref.abs().max()):.6g}, nonfinite {int((~torch.isfinite(out)).sum())})"
    )


@pytest.mark.parametrize("m,n,k,two_d", [(40, 48, 300, True), (33, 20, 256, False)])
def test_gemm_fp8_block_rescale_kernel(m, n, k, two_d):
    """The rescaled-accumulator promotion (RESCALE, the v2 sm_90 candidates) against the
    dequantized fp32 product: K tail, edge tiles, scalar (128x128) and per-column (1x128) b
    scales, rows with very different scales per K-block. Launched directly with the config."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.pytorch.kernels.gemm.gemm_fp8_impl import dequant_operand
    from primus_turbo.pytorch.ops.gemm_fp8 import _quant_dual
    from primus_turbo.triton.gemm import gemm_fp8_kernel as kern

    a = torch.randn(m, k, device=DEV) * torch.logspace(-3, 2, k, device=DEV)
    b = torch.randn(n, k, device=DEV)
    qa, _ = _quant_dual(a, E4M3_DEV, G.BLOCKWISE)
    qb, _ = _quant_dual(b, E4M3_DEV, G.BLOCKWISE, two_d)
    bw = G.BLOCKWISE.value
    ref = dequant_operand(qa[0], qa[1], bw, qa[2]) @ dequant_operand(qb[0], qb[1], bw, qb[2]).t()
    family = ArchFamily.CPU if DEV == "cpu" else ArchFamily.OTHER_GPU
    size = 32 if DEV == "cpu" else 64
    cfg = kern._cfg(size, size, 128, 4, 1 if DEV == "cpu" else 3, per_cu=2, RESCALE=True)
    err, msg = _block_err(_launch_block(qa, qb, cfg, family), ref, cfg.name)
    plain = kern._cfg(size, size, 128, 4, 1 if DEV == "cpu" else 3)  # the v1 promotion, same tile
    _, plain_msg = _block_err(_launch_block(qa, qb, plain, family), ref, plain.name)
    assert err < BLOCK_TOL, f"{msg}; tolerance {BLOCK_TOL:.0e}; {plain_msg}"


def test_gemm_fp8_block_config_sets(monkeypatch):
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.gemm import gemm_fp8_kernel as kern

    v1 = kern.fp8_configs(ArchFamily.HOPPER, kern.BLOCK, "v1")
    v2 = kern.fp8_configs(ArchFamily.HOPPER, kern.BLOCK, "v2")
    assert not any(dict(c.extra).get("RESCALE") for c in v1)
    assert any(dict(c.extra).get("RESCALE") for c in v2) and v1 != v2
    assert kern.fp8_configs(ArchFamily.CDNA3, kern.BLOCK, "v2") == kern.fp8_configs(
        ArchFamily.CDNA3, kern.BLOCK, "v1"
    )
    kern.block_config_set.cache_clear()
    v3 = kern.fp8_configs(ArchFamily.HOPPER, kern.BLOCK, "v3")
    tma = kern.fp8_configs(ArchFamily.HOPPER, kern.BLOCK, "tma")
    assert all(kern.is_tma(c) for c in tma) and set(v3) <= set(v2) | set(tma)
    assert len(v3) <= 6 and any(kern.is_tma(c) for c in v3)  # tune cost: six timings a shape
    assert not all(kern.is_tma(c) for c in v3)  # operands TMA cannot describe keep a candidate
    assert kern.fp8_configs(ArchFamily.CDNA3, kern.BLOCK, "v3") == kern.fp8_configs(
        ArchFamily.CDNA3, kern.BLOCK, "v1"
    )
    monkeypatch.setenv("PRIMUS_TURBO_FP8_BLOCK_CONFIGS", "v9")
    try:
        with pytest.raises(ValueError, match="PRIMUS_TURBO_FP8_BLOCK_CONFIGS"):
            kern.block_config_set()
    finally:
        kern.block_config_set.cache_clear()


@pytest.mark.skipif(not HAS_GPU, reason="every tuner candidate of this GPU's family (compiled)")
@pytest.mark.parametrize("two_d", [True, False], ids=["1x128_128x128", "1x128_1x128"])
def test_gemm_fp8_block_every_candidate(two_d):
    """Each blockwise candidate of both sets (the tuner only ever runs the fastest): odd M/N,
    a K tail, vs the dequantized fp32 product."""
    from primus_turbo.pytorch.core.platform import arch_family
    from primus_turbo.pytorch.kernels.gemm.gemm_fp8_impl import dequant_operand
    from primus_turbo.pytorch.ops.gemm_fp8 import _quant_dual
    from primus_turbo.triton.gemm import gemm_fp8_kernel as kern

    m, n, k = 777, 1000, 1100
    a = torch.randn(m, k, device=DEV) * torch.logspace(-3, 2, k, device=DEV)
    b = torch.randn(n, k, device=DEV)
    qa, _ = _quant_dual(a, E4M3_DEV, G.BLOCKWISE)
    qb, _ = _quant_dual(b, E4M3_DEV, G.BLOCKWISE, two_d)
    bw = G.BLOCKWISE.value
    ref = dequant_operand(qa[0], qa[1], bw, qa[2]) @ dequant_operand(qb[0], qb[1], bw, qb[2]).t()
    family = arch_family(torch.device(DEV))
    cands = {c.name + f"_cu{c.programs_per_cu}": c for s in kern.BLOCK_CONFIG_SETS
             for c in kern.fp8_configs(family, kern.BLOCK, s)}  # fmt: skip
    bad = []
    for name, cfg in cands.items():
        if kern.is_tma(cfg):  # K = 1100: rows not 16-byte aligned (test_gemm_fp8_block_tma)
            continue
        err, msg = _block_err(_launch_block(qa, qb, cfg, family), ref, name)
        if not err < BLOCK_TOL:
            bad.append(msg)
    assert not bad, f"candidates off the reference (tolerance {BLOCK_TOL:.0e}): {bad}"


@pytest.mark.parametrize(
    "m,n,k,two_d", [(40, 48, 304, True), (33, 20, 256, False)] if DEV == "cpu" else
    [(777, 1000, 1104, True), (777, 1000, 1104, False), (4096, 4096, 4096, True)],
)  # fmt: skip
def test_gemm_fp8_block_tma(m, n, k, two_d):
    """The TMA kernel (v3/tma sets, sm_90; the interpreter on CPU) against the dequantized fp32
    product: K tail (K % 128 != 0, 16-byte rows), edge tiles zero-filled by the descriptor,
    both b scale layouts; on the GPU every TMA candidate."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.pytorch.kernels.gemm.gemm_fp8_impl import dequant_operand
    from primus_turbo.pytorch.ops.gemm_fp8 import _quant_dual
    from primus_turbo.triton.gemm import gemm_fp8_kernel as kern

    if torch.version.hip or (HAS_GPU and torch.cuda.get_device_capability()[0] < 9):
        pytest.skip("TMA descriptors need CUDA sm_90+")
    a = torch.randn(m, k, device=DEV) * torch.logspace(-3, 2, k, device=DEV)
    b = torch.randn(n, k, device=DEV)
    qa, _ = _quant_dual(a, E4M3_DEV, G.BLOCKWISE)
    qb, _ = _quant_dual(b, E4M3_DEV, G.BLOCKWISE, two_d)
    assert kern._tma_usable(qa[0], qb[0])
    bw = G.BLOCKWISE.value
    ref = dequant_operand(qa[0], qa[1], bw, qa[2]) @ dequant_operand(qb[0], qb[1], bw, qb[2]).t()
    if DEV == "cpu":
        family = ArchFamily.CPU
        cands = [kern._cfg(32, 32, 32, 4, 1, TMA=True), kern._cfg(16, 32, 64, 4, 1, TMA=True,
                                                                 FLATTEN=True),
                 kern._cfg(32, 32, 32, 4, 1, TMA=True, DEFER=True),
                 kern._cfg(16, 64, 64, 4, 1, TMA=True, DEFER=True, FLATTEN=True)]  # fmt: skip
    else:  # every TMA config of every set (``tma`` holds them all), fp32 out (and bf16 for the
        # v3 ones): the epilogue's shared memory depends on the out dtype (a 320 KiB config
        # with fp32 out once failed here)
        family = ArchFamily.HOPPER
        cands = {c.name + f"_cu{c.programs_per_cu}": c for s in kern.BLOCK_CONFIG_SETS
                 for c in kern.fp8_configs(family, kern.BLOCK, s) if kern.is_tma(c)}  # fmt: skip
        cands = list(cands.values())
    bad = []
    v3 = set(kern.fp8_configs(family, kern.BLOCK, "v3")) if DEV == "cuda" else set()
    for cfg in cands:  # fp32 out needs the most shared memory / registers; bf16 for the default
        for out_dtype in (torch.float32, torch.bfloat16) if cfg in v3 else (torch.float32,):
            out = _launch_block(qa, qb, cfg, family, out_dtype)
            err, msg = _block_err(out, ref, f"{cfg.name} {out_dtype}")
            if not err < (BLOCK_TOL if out_dtype == torch.float32 else 1e-2):  # bf16 rounding
                bad.append(msg)
    assert not bad, f"TMA candidates off the reference (tolerance {BLOCK_TOL:.0e}): {bad}"


def test_gemm_fp8_block_configs_fit_sm90():
    """Every sm_90 blockwise candidate of every set launches (shared memory of the modeled upper
    bound within the 227 KiB per block, bf16 and fp32 out) and its ``programs_per_cu`` copies
    fit one SM's 228 KiB (bf16 out) -- on CPU, before a GPU ever sees the list. The model is
    checked against the AOT figures of real configs, including the one that failed on the H200
    (128x256 w8 s4 FLATTEN, fp32 out: 327712 bytes)."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.gemm import gemm_fp8_kernel as kern

    smem = kern.block_smem_bytes
    aot = {  # (config, out bytes): sm_90 AOT shared bytes (scripts/aot_check.py, triton 3.6)
        (kern._cfg(128, 128, 128, 8, 3, per_cu=2, TMA=True), 2): 98328,
        (kern._cfg(128, 128, 128, 4, 3, per_cu=2, TMA=True), 4): 98840,
        (kern._cfg(128, 128, 128, 8, 3, TMA=True, FLATTEN=True), 2): 131096,
        (kern._cfg(128, 128, 128, 8, 3, TMA=True, FLATTEN=True), 4): 163864,
        (kern._cfg(128, 128, 128, 8, 3, TMA=True, DEFER=True, FLATTEN=True), 4): 131096,
        (kern._cfg(128, 64, 128, 4, 3, per_cu=3, TMA=True), 4): 74264,
        (kern._cfg(128, 256, 128, 8, 4, TMA=True, FLATTEN=True), 4): 327712,
        (kern._cfg(128, 256, 128, 8, 4, TMA=True), 4): 197664,
    }
    for (cfg, out_bytes), real in aot.items():
        assert real <= smem(cfg, out_bytes) <= real + 2048, (cfg.name, out_bytes, real)
    too_big = kern._cfg(128, 256, 128, 8, 4, TMA=True, FLATTEN=True)
    assert smem(too_big, 4) > kern.SM90_SMEM_PER_BLOCK
    sets = {s: kern.fp8_configs(ArchFamily.HOPPER, kern.BLOCK, s) for s in kern.BLOCK_CONFIG_SETS}
    for name, cfgs in sets.items():
        for cfg in cfgs:
            for out_bytes in (2, 4):
                assert smem(cfg, out_bytes) <= kern.SM90_SMEM_PER_BLOCK, (name, cfg.name, out_bytes)
            per_sm = cfg.programs_per_cu * (smem(cfg, 2) + 1024)
            assert per_sm <= kern.SM90_SMEM_PER_SM, (name, cfg.name, cfg.programs_per_cu, per_sm)


def test_gemm_fp8_block_v3_heuristic(monkeypatch):
    """The untuned v3 choice on sm_90 (132 SMs): the run-4.2 winners per shape class, TMA or the
    pointer kernel by operand, always a member of the v3 candidate list."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.gemm import gemm_fp8_kernel as kern

    monkeypatch.delenv("PRIMUS_TURBO_FP8_BLOCK_CONFIGS", raising=False)
    kern.block_config_set.cache_clear()
    try:
        v3 = kern.fp8_configs(ArchFamily.HOPPER, kern.BLOCK, "v3")
        pick = lambda m, n, tma: kern.select_fp8_config(  # noqa: E731
            m, n, 7168, ArchFamily.HOPPER, 132, kern.BLOCK, tma
        )
        for tma in (True, False):
            for m, n, want in [(8192, 8192, 128), (4096, 1536, 64), (4096, 576, 128),
                               (4096, 32768, 128), (1, 1, 128)]:  # fmt: skip
                cfg = pick(m, n, tma)
                assert cfg in v3 and kern.is_tma(cfg) == tma and cfg.block_m == want, (m, n, cfg)
        assert pick(4096, 1536, True).programs_per_cu == 3
        assert pick(8192, 8192, True).programs_per_cu == 2 and pick(8192, 8192, True).num_warps == 4
    finally:
        kern.block_config_set.cache_clear()


def test_gemm_fp8_block_pick_under_capture(monkeypatch):
    """Inside a CUDA graph capture the tuner never times: a shape tuned before keeps its tuned
    config, a new shape gets the heuristic (``_pick`` with the sm_90 family; CPU tensors)."""
    from primus_turbo.pytorch.core import platform
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.gemm import gemm_fp8_kernel as kern

    monkeypatch.setattr(kern, "_tune_env", lambda: True)
    monkeypatch.setattr(platform, "is_graph_capturing", lambda: True)
    monkeypatch.setattr(kern, "_tuned", {})
    monkeypatch.delenv("PRIMUS_TURBO_FP8_BLOCK_CONFIGS", raising=False)
    kern.block_config_set.cache_clear()
    try:
        m, n, k = 64, 48, 128
        a = torch.randn(m, k).to(E4M3_DEV)  # only the dispatch runs
        b = torch.randn(n, k).to(E4M3_DEV)
        c = torch.empty(m, n, dtype=torch.bfloat16)
        args = (a, b, c, torch.ones(m, 1), torch.ones(1, 1), kern.BLOCK, 1, 128, (1, 0), (1, 1))
        tma_ok = kern._tma_usable(a, b)
        guess = kern.select_fp8_config(
            m, n, k, ArchFamily.HOPPER, platform.num_compute_units(a.device), kern.BLOCK, tma_ok
        )
        assert kern._pick(args, m, n, k, ArchFamily.HOPPER) == guess  # no timing loop ran
        tuned = kern._V3_TMA_N64 if guess != kern._V3_TMA_N64 else kern._V3_TMA_W8
        kern._tuned[kern._tune_key(args, m, n, k, tma_ok)] = tuned
        assert kern._pick(args, m, n, k, ArchFamily.HOPPER) == tuned
    finally:
        kern.block_config_set.cache_clear()
