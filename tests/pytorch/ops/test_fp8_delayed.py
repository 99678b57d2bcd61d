"""Delayed tensorwise FP8 scaling (ScalingStrategy.DELAYED): the one-pass kernel with a given
scale vs the torch reference (bitwise, amax exact), saturation and special values, the scaler's
history rules, first-use initialisation, Float8Linear training steps, config validation,
torch.compile, CUDA-graph capture (GPU). CPU runs the interpreter with small tiles."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from primus_turbo.pytorch.core.low_precision import (
    Float4QuantConfig,
    Float8QuantConfig,
    Format,
    ScalingGranularity,
    ScalingStrategy,
    triton_fp8_support,
)
from primus_turbo.pytorch.modules.float8_linear import Float8Linear
from primus_turbo.pytorch.ops.fp8_delayed import (
    Fp8DelayedScaler,
    Fp8DelayedScaling,
    quantize_fp8_delayed,
)
from primus_turbo.pytorch.ops.gemm_fp8 import gemm_fp8
from primus_turbo.pytorch.ops.quantization import quantize_fp8
from primus_turbo.pytorch.reference import fp8_delayed as ref
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import snr_db

pytestmark = pytest.mark.quantization

DEV = "cuda" if HAS_GPU else "cpu"
G = ScalingGranularity
DELAYED = ScalingStrategy.DELAYED
E4M3, E5M2, FNUZ = torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz
_FNUZ_OK, _FNUZ_WHY = triton_fp8_support(FNUZ, DEV)
FP8 = [E4M3, E5M2, pytest.param(FNUZ, marks=pytest.mark.skipif(not _FNUZ_OK, reason=_FNUZ_WHY))]
SHAPES = [(37, 200), (1, 1), (3, 520), (64, 128)]
if HAS_GPU:
    SHAPES += [(1000, 1000), (4096, 2048), (8192, 4096), (6144, 4096)]


@pytest.fixture(autouse=True)
def _small_tiles(monkeypatch):
    """Interpreter: 1024-wide flat tiles and 16x32 dual tiles (many tiles per program). The
    guard's global override is unset (the tests set it where they test it)."""
    monkeypatch.delenv("PRIMUS_TURBO_QUANT_TWD_GUARD", raising=False)
    if not HAS_GPU:
        monkeypatch.setenv("PRIMUS_TURBO_QUANT_TW_BLOCK", "1024")
        monkeypatch.setenv("PRIMUS_TURBO_QUANT_TW_TILE", "16x32")


def _x(m, n, scale=3.0, dtype=torch.bfloat16):
    return (torch.randn(m, n, device=DEV) * scale).to(dtype)


def _bits_equal(a, b):
    """Bitwise; under the interpreter -0 counts as +0 (its fp8 encoder writes a negative value
    that rounds to zero as +0; 0x80 is -0 only in the OCP formats)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ua, ub = a.view(torch.uint8), b.view(torch.uint8)
    if not HAS_GPU and a.dtype in (E4M3, E5M2):
        ua, ub = ua.masked_fill(ua == 0x80, 0), ub.masked_fill(ub == 0x80, 0)
    return torch.equal(ua, ub)


def _check(x, dtype, scale_val, dual, amax0=0.0):
    scale = torch.tensor([scale_val], device=DEV)
    amax = torch.full((1,), amax0, device=DEV)
    out = quantize_fp8_delayed(x, dtype, scale, amax, with_trans=dual)
    q_ref, s_ref, a_ref = ref.quantize_tensorwise_given_ref(x, dtype, scale)
    assert len(out) == (4 if dual else 2)
    assert _bits_equal(out[0], q_ref)
    assert out[1].shape == () and torch.equal(out[1], s_ref)
    assert amax.item() == max(amax0, a_ref.item())  # exact: a max of input values
    if dual:
        assert out[2].is_contiguous() and out[3] is out[1]
        assert _bits_equal(out[2], q_ref.t().contiguous())
    return out, amax


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("m,n", SHAPES)
def test_given_scale_matches_reference_bitwise(dual, m, n):
    x = _x(m, n)
    x[m - 1, n - 1] = 40.0  # the amax in the last tile
    _check(x, E4M3, 448.0 / 45.0, dual)


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_formats_and_input_dtypes(dtype):
    _check(_x(37, 200), dtype, 5.0, True)
    _check(_x(37, 200, dtype=torch.float16), dtype, 5.0, False)
    _check(_x(37, 200, dtype=torch.float32), dtype, 5.0, False)


@pytest.mark.parametrize("dual", [False, True])
def test_filtered_rewalk_same_bits(dual):
    """The filtered re-walk (an inf in the input; plain: tile-shaped running max, dual: per-tile
    scalar max) gives the reference's bits and amax."""
    x = _x(100, 300)
    x[50, 7] = float("inf")
    x[99, 299] = -30.0
    _check(x, E4M3, 10.0, dual)


def test_amax_accumulates_and_saturation():
    x = _x(37, 200)
    _, amax = _check(x, E4M3, 1.0, False, amax0=1e6)  # the larger old value stays
    assert amax.item() == 1e6
    # a scale far too large: everything beyond +-448 saturates, signs kept
    out, _ = _check(x, E4M3, 1e4, True)
    q = out[0].float()
    big = (x.float() * 1e4).abs() > 448
    assert big.any() and torch.equal(q[big].abs(), torch.full_like(q[big], 448.0))
    assert torch.equal(q[big].sign(), x.float()[big].sign())


def test_special_values():
    x = _x(37, 200)
    x[0, 0], x[1, 1], x[2, 2] = float("inf"), float("-inf"), float("nan")
    x[36, 199] = 9.5
    out, amax = _check(x, E4M3, 2.0, True)
    assert amax.item() == ref.quantize_tensorwise_given_ref(x, E4M3, torch.tensor(2.0))[2]
    q = out[0].float()
    assert q[0, 0] == 448 and q[1, 1] == -448 and torch.isnan(q[2, 2])
    assert torch.isnan(q).sum() == 1
    for fill in (0.0, float("nan"), float("inf")):  # all-zero / all-NaN / all-inf: amax 0
        _, amax = _check(torch.full((5, 70), fill, device=DEV, dtype=torch.bfloat16), E4M3, 3.0,
                         False)  # fmt: skip
        assert amax.item() == 0.0


def test_zero_size():
    for shape in ((0, 16), (16, 0)):
        x = torch.empty(shape, device=DEV, dtype=torch.bfloat16)
        out, amax = _check(x, E4M3, 4.0, True, amax0=2.0)
        assert out[0].shape == shape and out[2].shape == shape[::-1] and amax.item() == 2.0
        assert out[1].item() == 0.25


def test_raw_op_bad_arguments():
    x = _x(8, 8)
    s, a = torch.ones(1, device=DEV), torch.zeros(1, device=DEV)
    with pytest.raises(TypeError, match="quantize_fp8_delayed.*out_dtype"):
        quantize_fp8_delayed(x, torch.bfloat16, s, a)
    with pytest.raises(ValueError, match="quantize_fp8_delayed.*scale"):
        quantize_fp8_delayed(x, E4M3, torch.ones(2, device=DEV), a)
    with pytest.raises(TypeError, match="quantize_fp8_delayed.*amax_out"):
        quantize_fp8_delayed(x, E4M3, s, torch.zeros(1, device=DEV, dtype=torch.float64))


# ---- the scaler ------------------------------------------------------------------------


def test_first_use_matches_dynamic_then_records_amax():
    x = _x(37, 200)
    sc = Fp8DelayedScaler(amax_history_len=4, device=DEV)
    q, s = sc.quantize(x, E4M3)
    q_dyn, s_dyn = quantize_fp8(x, E4M3, G.TENSORWISE)
    amax = ref.quantize_tensorwise_given_ref(x, E4M3, torch.ones(()))[2]
    # the dynamic kernel divides in Triton (may differ from torch's division by an ulp, which
    # moves values on rounding midpoints by one fp8 step: the rule of test_quantization.py)
    torch.testing.assert_close(s, s_dyn, rtol=1e-6, atol=0)
    a_, b_ = q.float(), q_dyn.float()
    assert ((a_ - b_).abs() <= b_.abs() * 0.26 + 2.0**-9).all()
    if not HAS_GPU:
        assert _bits_equal(q, q_dyn)
    assert sc.initialized and sc.amax_history.tolist() == [amax.item(), 0, 0, 0]
    assert sc.scale.item() == pytest.approx(448.0 / amax.item(), rel=1e-6)
    # step 2 casts with the CURRENT scale, also when x2 outgrew it (4x: saturated, the default
    # without the guard, TransformerEngine's behaviour); the scale changes only at update()
    old = sc.scale.clone()
    for mult in (1.05, 4.0):
        q2, s2 = sc.quantize(x * mult, E4M3)
        assert _bits_equal(q2, ref.quantize_tensorwise_given_ref(x * mult, E4M3, old)[0])
        assert torch.equal(s2, torch.reciprocal(old))
    assert (q2.float().abs() == 448.0).sum() > 10
    assert torch.equal(sc.scale, old)
    assert sc.amax_history[0].item() == 4 * amax.item()  # accumulated: max of the calls


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("length", [1, 3])
@pytest.mark.parametrize("margin", [0, 2])
def test_update_rules_match_reference(algo, length, margin):
    """The update (one Triton launch) and the casts give the reference's bits (the 8x step
    outgrows the scale: saturated by default (margin 0), re-cast by the opt-in saturation guard
    (margin 2))."""
    guard = margin == 2
    sc = Fp8DelayedScaler(length, algo, margin, device=DEV, saturation_guard=guard)
    scale = sc.scale.clone()
    hist = sc.amax_history.clone()
    for i, mult in enumerate((2.0, 8.0, 1.0, 0.5, 0.0)):
        x = _x(16, 64) * mult
        q, s = sc.quantize(x, E4M3)
        if i == 0:  # first use: the scale of x's own amax
            scale = sc.scale.clone()
        hist[0] = torch.maximum(hist[0], ref.quantize_tensorwise_given_ref(x, E4M3, scale)[2])
        eff = ref.guard_scale(hist[0], scale, E4M3, margin) if guard else scale
        assert _bits_equal(q, ref.quantize_tensorwise_given_ref(x, E4M3, eff)[0])
        assert torch.equal(s, torch.reciprocal(eff)) and torch.equal(sc.scale, scale)
        assert torch.equal(sc.amax_history, hist)
        sc.update()
        hist, scale, sinv = ref.update_history_ref(hist, scale, 448.0, algo, margin)
        assert torch.equal(sc.amax_history, hist) and torch.equal(sc.scale, scale)
        assert torch.equal(sc.scale_inv, sinv)


def test_roll_order_and_zero_amax_keeps_scale():
    sc = Fp8DelayedScaler(3, "max", device=DEV)
    sc.fmax = 448.0
    sc.initialized = True
    for v in (1.0, 2.0, 4.0):
        sc.amax_history[0] = v
        sc.update()
    # slot 0 accumulates; older entries move down: [0, 2, 4] after three steps (1 dropped)
    assert sc.amax_history.tolist() == [0.0, 2.0, 4.0]
    assert sc.scale.item() == 448.0 / 4.0
    sc.update()  # max(0, 2, 4) = 4 again
    assert sc.amax_history.tolist() == [0.0, 4.0, 0.0] and sc.scale.item() == 112.0
    sc.update()
    sc.update()  # history all zero: the scale stays
    assert sc.amax_history.tolist() == [0.0, 0.0, 0.0] and sc.scale.item() == 112.0
    mr = Fp8DelayedScaler(3, "most_recent", margin=1, device=DEV)
    mr.fmax = 448.0
    mr.amax_history[0] = 7.0
    mr.amax_history[1] = 100.0
    mr.update()
    assert mr.scale.item() == 448.0 / 7.0 / 2.0 and mr.amax_history.tolist() == [0, 0, 7.0]


def _guarded_scaler(**kw):
    cfg = Float8QuantConfig(strategy=DELAYED, saturation_guard=True, **kw)
    return Fp8DelayedScaling(cfg, device=DEV).weight


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("mode", ["default", "config", "env_on", "env_off"])
def test_saturation_guard(monkeypatch, dual, mode):
    """With the opt-in guard (config ``saturation_guard=True``, or the global override
    PRIMUS_TURBO_QUANT_TWD_GUARD=1) a tensor whose range outgrew the history (4x: a weight after
    a large optimizer step) is re-cast with the recorded amax's scale (margin kept), not clipped;
    a growth within an fp8 rounding step (1.1x) keeps the delayed scale; the scaler's own scale
    changes only at update(). Default, or the override =0 on a guarded config: the plain delayed
    cast (clipped, TransformerEngine's behaviour)."""
    if mode.startswith("env"):
        monkeypatch.setenv("PRIMUS_TURBO_QUANT_TWD_GUARD", "1" if mode == "env_on" else "0")
    if mode in ("config", "env_off"):
        sc = _guarded_scaler(amax_history_len=4, margin=1)
        assert sc.saturation_guard
    else:
        sc = Fp8DelayedScaler(4, margin=1, device=DEV)
        assert not sc.saturation_guard
    guard = mode in ("config", "env_on")
    x0 = _x(48, 96)
    sc.quantize(x0, E4M3)
    sc.update()
    scale = sc.scale.clone()
    for mult, fires in ((1.1, False), (4.0, True)):
        x = x0 * mult
        out = sc.quantize(x, E4M3, dual=dual)
        eff = scale
        if fires and guard:
            eff = ref.scale_from_amax(x.float().abs().amax(), scale, 448.0, 1)
            assert torch.equal(eff, ref.guard_scale(sc.amax_history[0], scale, E4M3, 1))
        q_ref = ref.quantize_tensorwise_given_ref(x, E4M3, eff)[0]
        assert _bits_equal(out[0], q_ref) and torch.equal(out[1], torch.reciprocal(eff))
        if dual:
            assert _bits_equal(out[2], q_ref.t().contiguous()) and out[3] is out[1]
        sat = (out[0].float().abs() == 448.0).sum().item()
        assert (sat > 10) == (fires and not guard)
        assert torch.equal(sc.scale, scale)
        sc.amax_history.zero_()


def test_scaler_state_dict_round_trip():
    sc = Fp8DelayedScaler(4, device=DEV)
    sc.quantize(_x(8, 32), E4M3)
    sc.update()
    other = Fp8DelayedScaler(4, device=DEV)
    other.load_state_dict(sc.state_dict())
    assert other.initialized and other.fmax == 448.0
    assert torch.equal(other.scale, sc.scale) and torch.equal(other.amax_history, sc.amax_history)


# ---- config and GEMM wiring ---------------------------------------------------------------


def test_config_validation():
    cfg = Float8QuantConfig(strategy=DELAYED, amax_history_len=16, amax_compute_algo="most_recent",
                            margin=1)  # fmt: skip
    assert cfg.strategy.value == 2 and ScalingStrategy.DYNAMIC.value == 1
    with pytest.raises(ValueError, match="DELAYED scaling needs granularity TENSORWISE"):
        Float8QuantConfig(strategy=DELAYED, granularity=G.ROWWISE)
    with pytest.raises(ValueError, match="amax_history_len"):
        Float8QuantConfig(strategy=DELAYED, amax_history_len=0)
    with pytest.raises(ValueError, match="amax_compute_algo"):
        Float8QuantConfig(strategy=DELAYED, amax_compute_algo="mean")
    with pytest.raises(ValueError, match="margin"):
        Float8QuantConfig(strategy=DELAYED, margin=-1)
    with pytest.raises(ValueError, match="'saturation_guard' expected False unless strategy is"):
        Float8QuantConfig(saturation_guard=True)  # DYNAMIC: nothing to guard
    with pytest.raises(TypeError, match="saturation_guard"):
        Float8QuantConfig(strategy=DELAYED, saturation_guard=1)
    with pytest.raises(TypeError, match="Fp8DelayedScaler.*saturation_guard"):
        Fp8DelayedScaler(saturation_guard="yes")
    with pytest.raises(ValueError, match="strategy"):
        Float4QuantConfig(strategy=DELAYED)
    with pytest.raises(ValueError, match="Fp8DelayedScaling.*strategy"):
        Fp8DelayedScaling(Float8QuantConfig())
    with pytest.raises(ValueError, match="amax_compute_algo"):
        Fp8DelayedScaler(amax_compute_algo="avg")


def test_guard_off_by_default():
    """TransformerEngine's semantics by default: no saturation guard in the config, the scaler,
    or the three scalers Float8Linear builds from a DELAYED config; the guard is opt-in."""
    assert not Float8QuantConfig().saturation_guard
    cfg = Float8QuantConfig(strategy=DELAYED)
    assert not cfg.saturation_guard and not Fp8DelayedScaler().saturation_guard
    mod = Float8Linear(32, 16, config=cfg, device=DEV)
    assert not any(sc.saturation_guard for sc in mod.fp8_scaling.children())
    on = Float8Linear(32, 16, config=Float8QuantConfig(strategy=DELAYED, saturation_guard=True),
                      device=DEV)  # fmt: skip
    assert all(sc.saturation_guard for sc in on.fp8_scaling.children())
    assert "saturation_guard=True" in repr(on.fp8_scaling.weight)


def test_guard_env_validated(monkeypatch):
    sc = Fp8DelayedScaler(2, device=DEV)
    monkeypatch.setenv("PRIMUS_TURBO_QUANT_TWD_GUARD", "yes")
    with pytest.raises(ValueError, match="PRIMUS_TURBO_QUANT_TWD_GUARD"):
        sc.quantize(_x(8, 32), E4M3)


def test_gemm_fp8_delayed_needs_state():
    a, b = _x(16, 32), _x(8, 32)
    cfg = Float8QuantConfig(strategy=DELAYED)
    with pytest.raises(TypeError, match="delayed_scaling.*Float8Linear"):
        gemm_fp8(a, b, trans_b=True, config=cfg)
    with pytest.raises(ValueError, match="delayed_scaling.*None unless"):
        gemm_fp8(a, b, trans_b=True, delayed_scaling=Fp8DelayedScaling(cfg))


def _entry_grouped_gemm(cfg):
    from primus_turbo.pytorch.ops import grouped_gemm_fp8

    a, b = _x(8, 32), _x(2 * 16, 32).reshape(2, 16, 32)
    grouped_gemm_fp8(a, b, torch.tensor([3, 5], device=DEV), config=cfg)


def _entry_grouped_weight(cfg):
    from primus_turbo.pytorch.ops import quantize_grouped_weight

    quantize_grouped_weight(_x(32, 16).reshape(2, 16, 16), cfg)


def _entry_grouped_linear(cfg):
    from primus_turbo.pytorch.modules import GroupedLinear

    GroupedLinear(2, 16, 8, device=DEV, fp8_config=cfg)


def _entry_moe(cfg):
    from primus_turbo.pytorch.modules import MoELayer

    MoELayer(16, 32, 4, 2, fp8_config=cfg, device=DEV)


def _entry_attention(cfg):
    from primus_turbo.pytorch.ops import flash_attn_fp8_func

    q = _x(16, 64).reshape(1, 4, 4, 64)
    flash_attn_fp8_func(q, q, q, fp8_config=cfg)


@pytest.mark.parametrize(
    "entry,name,arg",
    [
        (_entry_grouped_gemm, "grouped_gemm_fp8", "config"),
        (_entry_grouped_weight, "quantize_grouped_weight", "config"),
        (_entry_grouped_linear, "GroupedLinear", "fp8_config"),
        (_entry_moe, "MoELayer", "fp8_config"),
        (_entry_attention, "flash_attn_fp8", "fp8_config"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_other_fp8_entries_refuse_delayed(entry, name, arg):
    """The FP8 entry points without delayed-scaling state refuse a DELAYED config (they used to
    run it as dynamic tensorwise): op, argument, expected DYNAMIC, got DELAYED, and where
    DELAYED works."""
    with pytest.raises(ValueError) as ei:
        entry(Float8QuantConfig(strategy=DELAYED))
    msg = str(ei.value)
    assert f"primus_turbo.{name}: argument '{arg}.strategy' expected DYNAMIC" in msg, msg
    assert "got DELAYED" in msg and "Float8Linear" in msg and "gemm_fp8" in msg


# (batch, in, out, SGD lr) of the training tests: the GPU case is H200 call 8.1's, where one
# step grew the weight's amax 4.4x (0.031 -> 0.136); the CPU lr gives the tiny layer ~4.4x too
_TRAIN = (512, 1024, 768, 1e-3) if HAS_GPU else (16, 128, 32, 0.02)


def _train_step(mod, ref_lin, step):
    """One step of ``mod`` and of an fp32 copy of its current weights on the same data: the
    (ref, fp8) output / input-grad / weight-grad pairs (the weight update is the caller's)."""
    b, i, _, _ = _TRAIN
    ref_lin.zero_grad()
    with torch.no_grad():
        ref_lin.weight.copy_(mod.weight.float())
        ref_lin.bias.copy_(mod.bias.float())
    x = torch.randn(b, i, device=DEV) * (1.0 + 0.25 * step)  # a drifting range
    x8 = x.to(torch.bfloat16).requires_grad_()
    xr = x8.detach().float().requires_grad_()
    y, yr = mod(x8), ref_lin(xr)
    g = torch.randn_like(yr)
    y.backward(g.to(torch.bfloat16))
    yr.backward(g)
    return (yr.detach(), y.detach()), (xr.grad, x8.grad), (ref_lin.weight.grad, mod.weight.grad)


@pytest.mark.parametrize("fmt", [Format.E4M3, Format.HYBRID])
def test_float8_linear_delayed_training_steps(fmt):
    """A few training steps WITH the saturation guard: every step's output and both grads reach
    the E4M3 gate (25 dB) against fp32 (step 1 too, where the weight's amax grew ~4.4x: the
    guard re-casts it), the scalers are updated once per forward / backward. The input range
    grows 25% per step, so margin 1 (half the range) keeps the larger values from saturating
    (without it the tiny CPU tensors, whose amax moves a lot, lose ~5 dB)."""
    b, i, o, lr = _TRAIN
    torch.manual_seed(0)
    cfg = Float8QuantConfig(format=fmt, strategy=DELAYED, amax_history_len=8, margin=1,
                            saturation_guard=True)  # fmt: skip
    mod = Float8Linear(i, o, config=cfg, device=DEV, dtype=torch.bfloat16)
    ref_lin = torch.nn.Linear(i, o, device=DEV, dtype=torch.float32)
    opt = torch.optim.SGD(mod.parameters(), lr=lr)
    ds = mod.fp8_scaling
    assert isinstance(ds, Fp8DelayedScaling) and ds.input.amax_history.numel() == 8
    assert ds.weight.saturation_guard
    for step in range(4):
        (yr, y), (gxr, gx), (gwr, gw) = _train_step(mod, ref_lin, step)
        gate = 25.0 if fmt == Format.E4M3 else 20.0  # HYBRID: grad_out in E5M2
        assert snr_db(yr, y) >= 25.0, step
        assert snr_db(gxr, gx) >= gate, step
        assert snr_db(gwr, gw) >= gate, step
        opt.step()
        opt.zero_grad()
        # one update per forward (slot 0 zeroed, the step's amax at the end) and per backward
        for sc in (ds.input, ds.weight, ds.grad_output):
            assert sc.amax_history[0].item() == 0.0 and sc.amax_history[-1].item() > 0
    assert ds.grad_output.fmax == (448.0 if fmt == Format.E4M3 else 57344.0)
    assert "fp8_scaling.input.amax_history" in mod.state_dict()


def test_float8_linear_delayed_unguarded_saturates_like_te():
    """The default (no guard, TransformerEngine's semantics) on the training test's step 1: the
    weight's amax grew ~4.4x in one SGD step, so the step-0 scale clips it -- the output's SNR
    falls below the guarded twin's (H200 call 8.1: 22.0 vs 28.5 dB), finite, no NaN; update()
    then catches up (step 2's weight scale covers the grown amax)."""
    b, i, o, lr = _TRAIN
    torch.manual_seed(0)
    cfg = Float8QuantConfig(strategy=DELAYED, amax_history_len=8, margin=1)
    mod = Float8Linear(i, o, config=cfg, device=DEV, dtype=torch.bfloat16)
    ref_lin = torch.nn.Linear(i, o, device=DEV, dtype=torch.float32)
    w0 = mod.weight.detach().abs().max().item()
    _train_step(mod, ref_lin, 0)
    with torch.no_grad():
        mod.weight -= lr * mod.weight.grad
        mod.bias -= lr * mod.bias.grad
    mod.weight.grad = mod.bias.grad = None
    assert mod.weight.detach().abs().max().item() > 3 * w0  # the precondition: a jump
    guarded = Float8Linear(i, o, config=dataclasses.replace(cfg, saturation_guard=True),
                           device=DEV, dtype=torch.bfloat16)  # fmt: skip
    guarded.load_state_dict(mod.state_dict())
    scale = mod.fp8_scaling.weight.scale.item()  # step 1 casts the weight with it
    clipped = (mod.weight.detach().float().abs() * scale > 448.0).float().mean().item()
    assert clipped > 1e-3, clipped  # the weight saturates under the old scale
    rng = torch.get_rng_state(), torch.cuda.get_rng_state() if HAS_GPU else None
    (yr, y), _, _ = _train_step(mod, ref_lin, 1)
    torch.set_rng_state(rng[0])
    if HAS_GPU:
        torch.cuda.set_rng_state(rng[1])
    (yr_g, y_g), _, _ = _train_step(guarded, ref_lin, 1)
    torch.testing.assert_close(yr, yr_g, rtol=1e-6, atol=1e-6)  # same data, same weights
    assert torch.isfinite(y).all()
    snr, snr_g = snr_db(yr, y), snr_db(yr_g, y_g)
    assert snr_g >= 25.0 and snr < snr_g - 2.0, (snr, snr_g)
    assert mod.fp8_scaling.weight.scale.item() * mod.weight.detach().float().abs().max() <= 448


def test_float8_linear_delayed_from_float_and_compile():
    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 32, device=DEV, dtype=torch.bfloat16)
    cfg = Float8QuantConfig(strategy=DELAYED, amax_history_len=4)
    mod = Float8Linear.from_float(lin, config=cfg)
    assert isinstance(mod.fp8_scaling, Fp8DelayedScaling)
    x = torch.randn(16, 128, device=DEV, dtype=torch.bfloat16)
    twin = Float8Linear(128, 32, config=cfg, device=DEV, dtype=torch.bfloat16)
    twin.load_state_dict(mod.state_dict())
    compiled = torch.compile(mod, backend="eager" if not HAS_GPU else "inductor")
    for _ in range(2):  # same inputs, same state sequence: the same bits
        torch.testing.assert_close(compiled(x), twin(x), rtol=0, atol=0)
    assert torch.equal(mod.fp8_scaling.input.scale, twin.fp8_scaling.input.scale)


# ---- GPU only ------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_GPU, reason="CUDA-graph capture needs a GPU")
@pytest.mark.parametrize("dual", [False, True])
def test_cuda_graph_capture_quantize_update(dual):
    torch.manual_seed(0)
    xs = [_x(4096, 2048, scale=1.0 + k) for k in range(5)]
    buf = xs[0].clone()
    eager = Fp8DelayedScaler(4, device=DEV)
    graphed = Fp8DelayedScaler(4, device=DEV)
    eager.quantize(buf, E4M3, dual)  # the first (eager) use initialises both the same way
    graphed.quantize(buf, E4M3, dual)
    eager.update()
    graphed.update()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream, then capture
        graphed.load_state_dict(eager.state_dict())
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = graphed.quantize(buf, E4M3, dual)
        graphed.update()
    graphed.load_state_dict(eager.state_dict())  # capture does not run the kernels
    for x in xs[1:]:
        buf.copy_(x)
        g.replay()
        want = eager.quantize(x, E4M3, dual)
        eager.update()
        torch.cuda.synchronize()
        for a, b in zip(out, want, strict=True):
            assert _bits_equal(a, b) if a.dtype != torch.float32 else torch.equal(a, b)
        assert torch.equal(graphed.amax_history, eager.amax_history)
        assert torch.equal(graphed.scale, eager.scale)


@pytest.mark.skipif(not HAS_GPU, reason="CUDA-graph capture needs a GPU")
def test_float8_linear_delayed_step_captured():
    """A whole Float8Linear DELAYED step (forward, backward, the three scaler updates) captured
    once and replayed equals the eager steps of a twin module, bit for bit."""
    torch.manual_seed(0)
    cfg = Float8QuantConfig(strategy=DELAYED, amax_history_len=16)
    mod = Float8Linear(1024, 768, bias=False, config=cfg, device=DEV, dtype=torch.bfloat16)
    twin = Float8Linear(1024, 768, bias=False, config=cfg, device=DEV, dtype=torch.bfloat16)
    twin.load_state_dict(mod.state_dict())
    data = [(_x(512, 1024, 1.0 + 0.1 * k), _x(512, 768, 1.0)) for k in range(5)]
    xs = data[0][0].clone().requires_grad_()
    gs = data[0][1].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # eager first steps (scaler initialisation, autograd warm-up)
        for m in (mod, twin):
            xw = data[0][0].clone().requires_grad_()
            m(xw).backward(data[0][1])
            m.weight.grad = None
        xs.grad = None
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = mod(xs)
        y.backward(gs)
    for x, g in data[1:]:
        with torch.no_grad():
            xs.copy_(x)
            gs.copy_(g)
        graph.replay()
        xt = x.clone().requires_grad_()
        twin.weight.grad = None
        yt = twin(xt)
        yt.backward(g)
        torch.cuda.synchronize()
        assert _bits_equal(y, yt)
        assert _bits_equal(xs.grad, xt.grad) and _bits_equal(mod.weight.grad, twin.weight.grad)
        for a, b in zip(mod.fp8_scaling.buffers(), twin.fp8_scaling.buffers(), strict=True):
            assert torch.equal(a, b)
