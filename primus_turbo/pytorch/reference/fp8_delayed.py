"""Reference (pure torch) of delayed tensorwise FP8 scaling (``ScalingStrategy.DELAYED``).

* cast with a GIVEN scale: ``q = clamp(x * scale, -fmax, fmax)`` (NaN kept, inf and values
  beyond the scale's range saturate to +-fmax), ``scale_inv = 1 / scale``; the tensor's amax
  (NaN and inf left out, as the dynamic reference) is recorded, ``amax_out = max(amax_out,
  amax(x))``.
* history update (TransformerEngine's DelayedScaling rules): slot 0 of ``amax_history [L]``
  accumulates the current step's amax. ``update``: ``amax = max(history)`` (``"max"``) or
  ``history[0]`` (``"most_recent"``); the history rolls by -1 (slot 0 moves to slot L-1, slot
  k to k-1) and slot 0 is zeroed; ``scale = fmax / amax * 2**-margin`` where ``amax > 0`` and
  the result is finite, else the old scale stays; ``scale_inv = 1 / scale``.
* saturation guard (the scaler's casts): when the step's recorded amax (this tensor's
  included) times the scale the cast used exceeds ``1.125 * fmax`` (fp32 product: clipped by
  more than an fp8 rounding step), the tensor is cast
  with ``fmax / amax * 2**-margin`` instead (the scale of the recorded amax); the scaler's
  own ``scale`` changes only at ``update``.
"""

from __future__ import annotations

import torch

from primus_turbo.pytorch.reference.quantization import finite_abs


def quantize_tensorwise_given_ref(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor):
    """``(q, scale_inv, amax)`` of ``x`` cast with the given fp32 ``scale``."""
    fmax = float(torch.finfo(dtype).max)
    s = scale.reshape(()).float()
    y = x.float() * s
    q = torch.where(torch.isnan(y), y, y.clamp(-fmax, fmax)).to(dtype)
    amax = finite_abs(x).amax() if x.numel() else torch.zeros((), device=x.device)
    return q, torch.reciprocal(s), amax


def scale_from_amax(amax: torch.Tensor, old_scale: torch.Tensor, fmax: float, margin: int):
    """``fmax / amax * 2**-margin`` (an IEEE division -- ``float / tensor`` in torch is a
    reciprocal times the float -- then an exact power-of-two factor: the bits of the Triton
    update kernel) where ``amax > 0`` and the result is finite, else the old scale."""
    new = torch.div(torch.full_like(amax, fmax), amax) * (2.0**-margin)
    return torch.where((amax > 0) & torch.isfinite(new), new, old_scale)


def guard_scale(amax: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, margin: int):
    """The scale a guarded cast uses: ``scale``, or the recorded ``amax``'s scale where
    ``amax * scale > 1.125 * fmax`` (the given scale clipped a finite value by more than an
    fp8 rounding step)."""
    fmax = float(torch.finfo(dtype).max)
    sat = amax.float() * scale > fmax * 1.125
    return torch.where(sat, scale_from_amax(amax.float(), scale, fmax, margin), scale)


def update_history_ref(history: torch.Tensor, scale: torch.Tensor, fmax: float, algo: str,
                       margin: int):  # fmt: skip
    """``(new_history, new_scale, new_scale_inv)``; the inputs are not modified."""
    amax = history.max() if algo == "max" else history[0].clone()
    h = torch.roll(history, -1, 0) if history.numel() > 1 else history.clone()
    h[0] = 0.0
    new = scale_from_amax(amax, scale, fmax, margin)
    return h, new, torch.reciprocal(new)
