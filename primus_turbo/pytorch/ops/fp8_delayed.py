"""Delayed tensorwise FP8 scaling (``ScalingStrategy.DELAYED``, TransformerEngine's recipe).

Dynamic tensorwise scaling needs the whole tensor's amax before the first value is cast, so it
reads the input twice (bounded at 0.60 / 0.67 of copy bandwidth, plain / dual). Delayed scaling
casts with a scale derived from the amaxes of EARLIER steps and records the current amax in the
same pass: one read (2 B) and one write (1 B) per bf16 element.

* :func:`quantize_fp8_delayed` -- the raw one-pass op: cast ``x`` with a given device ``scale``
  and fold ``amax(x)`` into ``amax_out`` (no state, no host sync).
* :class:`Fp8DelayedScaler` -- the state of ONE tensor: ``amax_history [L]`` (slot 0 accumulates
  the current step), ``scale``, ``scale_inv`` (device buffers of an ``nn.Module``, so they move
  with ``.to()`` and are saved in ``state_dict``). ``quantize(x, dtype)`` casts with the CURRENT
  scale and records the amax in slot 0; ``update()`` takes ``max(history)`` (``"max"``) or
  ``history[0]`` (``"most_recent"``), rolls the history by -1 (slot 0 -> slot L-1), zeroes slot 0
  and sets ``scale = fp8_max / amax * 2**-margin`` (amax 0, or a non-finite result: the old
  scale stays), in one Triton launch. Device ops only: quantize + update can be captured in a
  CUDA graph.
* Saturation (TransformerEngine's semantics, the default): a tensor whose range outgrew its
  history (a weight after a large optimizer step, an activation spike) is cast with the old
  scale, so its largest values saturate to +-fp8_max until ``update()`` catches up. Found by
  the GPU test of Float8Linear (H200 call 8.1): one SGD step at lr 1e-3 on a 512-token batch
  grew the weight's amax 4.4x (0.031 -> 0.136), the step-0 scale (margin 1) clipped 2.7% of
  the weights and the output fell to 22.0 dB (dynamic: 28.5).
* Saturation guard (opt-in: ``saturation_guard=True`` here or in the DELAYED
  ``Float8QuantConfig``; ``PRIMUS_TURBO_QUANT_TWD_GUARD=1`` / ``0`` forces it on / off for every
  scaler): the scaler's cast is followed by ``tw_delayed_guard_kernel``: when the recorded amax
  (slot 0, this tensor's included) times the scale exceeds 1.125 fp8_max (a clip beyond an fp8
  rounding step), the tensor is cast again with ``fp8_max / amax * 2**-margin`` (and that
  ``scale_inv`` returned); otherwise its programs return after two scalar loads. Off by
  default: the extra launch cost ~4% of copy bandwidth on the H200 (call 8.2, 8192x4096 /
  6144x4096: 0.823 / 0.830 of copy guarded, 0.866 / 0.864 without).
* First use: a scaler with no history would cast step 1 with scale 1 (TransformerEngine's
  start), which saturates or flushes most values of a real tensor. Instead the first
  ``quantize`` of a scaler first computes the tensor's own amax (one extra read: one dynamic
  quantization) and derives the scale from it, so step 1 matches dynamic scaling. This is
  decided on the host (``initialized``, saved in the state dict): call ``quantize`` once
  eagerly before capturing a CUDA graph (the usual warm-up).
* Values beyond the scale's range saturate to +-fp8_max; NaN stays NaN; NaN and inf are left
  out of the recorded amax (the dynamic kernels' rules).
* :class:`Fp8DelayedScaling` -- the three scalers of an FP8 GEMM (``input``, ``weight``,
  ``grad_output``) built from a DELAYED :class:`Float8QuantConfig`; ``gemm_fp8(...,
  delayed_scaling=...)`` quantizes with them and updates ``input`` / ``weight`` after the
  forward and ``grad_output`` after the backward (``Float8Linear`` keeps one per module).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from primus_turbo.pytorch.core.checks import check, check_tensor, fail
from primus_turbo.pytorch.core.low_precision import (
    AMAX_COMPUTE_ALGOS,
    Float8QuantConfig,
    ScalingGranularity,
    ScalingStrategy,
    is_fp8_dtype,
)
from primus_turbo.pytorch.core.platform import triton_interpret
from primus_turbo.pytorch.kernels.quantization.quant_delayed_impl import quantize_delayed_impl
from primus_turbo.pytorch.reference.fp8_delayed import scale_from_amax

__all__ = ["Fp8DelayedScaler", "Fp8DelayedScaling", "quantize_fp8_delayed", "refuse_delayed"]

_FLOAT = (torch.float16, torch.bfloat16, torch.float32)


def refuse_delayed(op: str, arg: str, config) -> None:
    """The FP8 entry points without delayed-scaling state (grouped GEMM, GroupedLinear,
    MoELayer, FP8 attention) refuse a DELAYED config instead of running it as dynamic."""
    if getattr(config, "strategy", None) == ScalingStrategy.DELAYED:
        fail(op, f"{arg}.strategy", "DYNAMIC (DELAYED scaling works only in gemm_fp8 with "
             "delayed_scaling= and Float8Linear)", "DELAYED")  # fmt: skip


def _scalar_f32(op, arg, t) -> None:
    check_tensor(op, arg, t, dtypes=(torch.float32,))
    check(t.numel() == 1 and t.is_contiguous(), op, arg, "a contiguous 1-element fp32 tensor",
          f"shape {tuple(t.shape)}")  # fmt: skip


def quantize_fp8_delayed(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    scale: torch.Tensor,
    amax_out: torch.Tensor,
    *,
    with_trans: bool = False,
):
    """One-pass tensorwise FP8 cast with a given scale.

    Args:
        x: 2-D fp16/bf16/fp32.
        out_dtype: an fp8 dtype.
        scale: fp32, 1 element, on x's device: ``q = sat(x * scale)``.
        amax_out: fp32, 1 element, contiguous: updated in place to ``max(amax_out, amax(x))``
            (finite values of x).
        with_trans: also return ``x.T`` quantized with the same scale (``[N, M]`` contiguous).
    Returns:
        ``(q, scale_inv)`` or ``(q, scale_inv, q_t, scale_inv)``; ``scale_inv = 1 / scale``
        (a fresh 0-d tensor: later updates of ``scale`` do not change it).
    """
    op = "quantize_fp8_delayed"
    check_tensor(op, "x", x, ndim=2, dtypes=_FLOAT)
    if not is_fp8_dtype(out_dtype):
        fail(op, "out_dtype", "an fp8 dtype", out_dtype, TypeError)
    _scalar_f32(op, "scale", scale)
    _scalar_f32(op, "amax_out", amax_out)
    for arg, t in (("scale", scale), ("amax_out", amax_out)):
        check(t.device == x.device, op, arg, f"a tensor on {x.device}", t.device)
    return quantize_delayed_impl(x, out_dtype, scale, amax_out, with_trans)


def _guard_on(default: bool) -> bool:
    """``PRIMUS_TURBO_QUANT_TWD_GUARD`` (0 / 1) overrides the scaler's ``saturation_guard``."""
    raw = os.environ.get("PRIMUS_TURBO_QUANT_TWD_GUARD", "").strip()
    if not raw:
        return default
    if raw not in ("0", "1"):
        raise ValueError(f"primus_turbo: PRIMUS_TURBO_QUANT_TWD_GUARD expected 0 or 1, got {raw!r}")
    return raw == "1"


class Fp8DelayedScaler(nn.Module):
    """Delayed-scaling state of one tensor (see the module docstring)."""

    def __init__(self, amax_history_len: int = 1024, amax_compute_algo: str = "max",
                 margin: int = 0, device=None,
                 saturation_guard: bool = False) -> None:  # fmt: skip
        super().__init__()
        op = "Fp8DelayedScaler"
        n = amax_history_len
        check(isinstance(n, int) and not isinstance(n, bool) and n >= 1, op,
              "amax_history_len", "an int >= 1", repr(n))  # fmt: skip
        check(amax_compute_algo in AMAX_COMPUTE_ALGOS, op, "amax_compute_algo",
              f"one of {AMAX_COMPUTE_ALGOS}", repr(amax_compute_algo))  # fmt: skip
        check(isinstance(margin, int) and not isinstance(margin, bool) and margin >= 0, op,
              "margin", "an int >= 0", repr(margin))  # fmt: skip
        check(isinstance(saturation_guard, bool), op, "saturation_guard", "a bool",
              repr(saturation_guard), TypeError)  # fmt: skip
        self.amax_compute_algo = amax_compute_algo
        self.margin = margin
        self.saturation_guard = saturation_guard
        self.fmax: float | None = None  # of the dtype of the last quantize
        self.initialized = False
        f32 = dict(dtype=torch.float32, device=device)
        self.register_buffer("amax_history", torch.zeros(n, **f32))
        self.register_buffer("scale", torch.ones((), **f32))
        self.register_buffer("scale_inv", torch.ones((), **f32))

    @classmethod
    def from_config(cls, config: Float8QuantConfig, device=None) -> Fp8DelayedScaler:
        return cls(config.amax_history_len, config.amax_compute_algo, config.margin, device,
                   config.saturation_guard)  # fmt: skip

    def quantize(self, x: torch.Tensor, dtype: torch.dtype, dual: bool = False):
        """``(q, scale_inv)`` (``(q, s, q_t, s)`` with ``dual``) of ``x`` cast with the current
        scale; ``amax(x)`` is folded into ``amax_history[0]``."""
        op = "Fp8DelayedScaler.quantize"
        check_tensor(op, "x", x, ndim=2, dtypes=_FLOAT)
        if not is_fp8_dtype(dtype):
            fail(op, "dtype", "an fp8 dtype", dtype, TypeError)
        if self.scale.device != x.device:
            self.to(x.device)
        fmax = float(torch.finfo(dtype).max)
        if self.fmax is not None and fmax != self.fmax:
            fail(op, "dtype", f"an fp8 dtype of max {self.fmax} (as before)", dtype)
        self.fmax = fmax
        if not self.initialized:  # step 1: the scale from x's own amax (see module docstring)
            amax = torch.zeros(1, dtype=torch.float32, device=x.device)
            quantize_delayed_impl(x, dtype, self.scale, amax, False, store=False)
            self._set_scale(scale_from_amax(amax[0], self.scale, fmax, self.margin))
            self.initialized = True
        guard = self.margin if _guard_on(self.saturation_guard) else None
        return quantize_delayed_impl(x, dtype, self.scale, self.amax_history[:1], dual,
                                     guard=guard)  # fmt: skip

    def _set_scale(self, new: torch.Tensor) -> None:
        self.scale.copy_(new)
        torch.reciprocal(self.scale, out=self.scale_inv)

    @torch.no_grad()
    def update(self) -> None:
        """Roll the history and recompute the scale (device ops only): one Triton launch where
        Triton runs (GPU or interpreter), else ~7 torch ops. (The torch ops on a GPU were
        removed: a host->device copy broke CUDA-graph capture, and 1.45x bf16 vs 1.80x eager
        in H200 call 8.1.)"""
        h = self.amax_history
        if self.fmax is not None and (h.device.type == "cuda" or triton_interpret()):
            from primus_turbo.triton.quantization.quant_tw_launch import delayed_update

            delayed_update(h, self.scale, self.scale_inv, self.fmax,
                           self.amax_compute_algo == "most_recent", self.margin)  # fmt: skip
            return
        amax = h.max() if self.amax_compute_algo == "max" else h[0].clone()
        if h.numel() > 1:
            h.copy_(torch.roll(h, -1, 0))
        h[0] = 0.0
        if self.fmax is not None:  # nothing quantized yet: no format, nothing recorded
            self._set_scale(scale_from_amax(amax, self.scale, self.fmax, self.margin))

    def get_extra_state(self):
        return {"initialized": self.initialized, "fmax": self.fmax}

    def set_extra_state(self, state) -> None:
        self.initialized = bool(state.get("initialized", False))
        self.fmax = state.get("fmax")

    def extra_repr(self) -> str:
        return (f"amax_history_len={self.amax_history.numel()}, "
                f"amax_compute_algo={self.amax_compute_algo!r}, margin={self.margin}, "
                f"saturation_guard={self.saturation_guard}")  # fmt: skip


class Fp8DelayedScaling(nn.Module):
    """The three scalers of an FP8 GEMM: ``input`` (a), ``weight`` (b), ``grad_output``."""

    def __init__(self, config: Float8QuantConfig, device=None) -> None:
        super().__init__()
        op = "Fp8DelayedScaling"
        if not isinstance(config, Float8QuantConfig):
            fail(op, "config", "a Float8QuantConfig", type(config).__name__, TypeError)
        check(config.strategy == ScalingStrategy.DELAYED, op, "config.strategy",
              "DELAYED", config.strategy.name)  # fmt: skip
        check(config.granularity == ScalingGranularity.TENSORWISE, op, "config.granularity",
              "TENSORWISE", config.granularity.name)  # fmt: skip
        self.config = config
        self.input = Fp8DelayedScaler.from_config(config, device)
        self.weight = Fp8DelayedScaler.from_config(config, device)
        self.grad_output = Fp8DelayedScaler.from_config(config, device)
