"""``GroupedLinear``: per-group ``y_g = x_g @ W_g^T`` through :func:`ops.grouped_gemm`, or in FP8
through :func:`ops.grouped_gemm_fp8` (``fp8_config``), optionally on an fp8 copy of the weight
kept from one optimizer step to the next (``fp8_weight_cache``)."""

from __future__ import annotations

import math

import torch
from torch import nn

from primus_turbo.pytorch.core.checks import check
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig
from primus_turbo.pytorch.ops.grouped_gemm import grouped_gemm
from primus_turbo.pytorch.ops.grouped_gemm_fp8 import (
    _mode,
    grouped_gemm_fp8,
    quantize_grouped_weight,
    weight_generation,
    weight_signature,
)


class GroupedLinear(nn.Module):
    """One linear layer per group (MoE experts), no bias; weight ``[G, out, in]``.

    ``forward(x, group_lens, group_offs=None)``: ``x [M, in]`` packed by group, ``group_lens``
    int64 ``[G]`` on x's device; returns ``[M, out]``.

    ``fp8_config`` (a ``Float8QuantConfig``, TENSORWISE or ROWWISE): the GEMMs run in FP8
    (``grouped_gemm_fp8``, output in x's dtype). ``fp8_weight_cache=True`` (FP8 only): the
    weight's fp8 copies (forward, and the dgrad's along the other axis when gradients are
    enabled; ``quantize_grouped_weight``) are kept and reused while the weight is unchanged:
    refreshed after each optimizer step (a global step post-hook), any in-place change of the
    weight (version counter) or ``grouped_gemm_fp8.clear_weight_cache()`` (call it after
    ``.data`` writes). So with gradient accumulation the weights are quantized once per step.
    Bypassed (quantized in every call) under CUDA-graph capture and torch.compile tracing.
    Memory: the two fp8 copies take the bytes of one bf16 weight. Gradients reach
    ``self.weight`` as without the cache.
    """

    def __init__(
        self,
        group_num: int,
        in_features: int,
        out_features: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        fp8_config: Float8QuantConfig | None = None,
        fp8_weight_cache: bool = False,
    ) -> None:
        super().__init__()
        op = "GroupedLinear"
        check(fp8_config is None or isinstance(fp8_config, Float8QuantConfig), op, "fp8_config",
              "None or a Float8QuantConfig", type(fp8_config).__name__, TypeError)  # fmt: skip
        check(not fp8_weight_cache or fp8_config is not None, op, "fp8_weight_cache",
              "False without fp8_config", fp8_weight_cache)  # fmt: skip
        self.fp8_config = fp8_config
        self.fp8_weight_cache = fp8_weight_cache
        self._fp8_cached: tuple | None = None  # (signature, generation, QuantizedTensorPair)
        self.group_num = group_num
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(
            torch.empty(group_num, out_features, in_features, device=device, dtype=dtype)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in self.weight.data:  # each expert as its own nn.Linear weight
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))

    def forward(
        self,
        x: torch.Tensor,
        group_lens: torch.Tensor,
        group_offs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        check(
            x.dim() == 2 and x.shape[-1] == self.in_features,
            "GroupedLinear",
            "x",
            f"a tensor [M, {self.in_features}]",
            f"shape {tuple(x.shape)}",
        )
        if self.fp8_config is None:
            return grouped_gemm(x, self.weight, group_lens, group_offs, trans_b=True)
        return self._fp8_forward(x, group_lens, group_offs)

    @torch._dynamo.disable
    def _fp8_forward(self, x, group_lens, group_offs):
        w = self.fp8_weight() if self.fp8_weight_cache else self.weight
        return grouped_gemm_fp8(x, w, group_lens, group_offs, trans_b=True, out_dtype=x.dtype,
                                config=self.fp8_config)  # fmt: skip

    def fp8_weight(self):
        """The weight as ``grouped_gemm_fp8`` takes it: the cached ``QuantizedTensorPair``
        (refreshed when stale, see the class doc), or ``self.weight`` itself while capturing a
        CUDA graph or compiling."""
        w = self.weight
        capturing = w.is_cuda and torch.cuda.is_current_stream_capturing()
        if torch.compiler.is_compiling() or capturing:
            return w
        dgrad = torch.is_grad_enabled() and _mode("DGRAD", "fp8") == "fp8"
        gen, sig = weight_generation(), weight_signature(w)
        hit = self._fp8_cached
        if hit is not None and hit[:2] == (sig, gen) and (hit[2].data_t is not None or not dgrad):
            return hit[2]
        self._fp8_cached = None  # free the stale copies before quantizing again
        pair = quantize_grouped_weight(w, self.fp8_config, True, with_dgrad=dgrad)
        self._fp8_cached = (sig, gen, pair)
        return pair

    def extra_repr(self) -> str:
        return (
            f"group_num={self.group_num}, in_features={self.in_features}, "
            f"out_features={self.out_features}"
            + (f", fp8={self.fp8_config}, fp8_weight_cache={self.fp8_weight_cache}"
               if self.fp8_config is not None else "")
        )  # fmt: skip


def _copy_pair(dst, src) -> bool:
    """Copy ``src``'s fp8 data and scales into ``dst``'s buffers (same layout); False when the
    two pairs differ in shape, dtype or in having ``data_t``."""
    pairs = [(dst.data, src.data)]
    if (dst.data_t is None) != (src.data_t is None):
        return False
    if dst.data_t is not None:
        pairs.append((dst.data_t, src.data_t))
    for d, s in pairs:
        for a, b in ((d.qdata, s.qdata), (d.scale_inv, s.scale_inv)):
            if a.shape != b.shape or a.dtype != b.dtype or a.stride() != b.stride():
                return False
    for d, s in pairs:
        d.qdata.copy_(s.qdata)
        d.scale_inv.copy_(s.scale_inv)
    return True


def cached_fp8_weight(cache: dict, name: str, w: torch.Tensor, config, force: bool = False):
    """``cache[name]``'s ``QuantizedTensorPair`` of the expert weight ``w`` (forward, and the
    dgrad's copy when gradients are enabled), re-quantized when stale (optimizer step,
    in-place change: as ``GroupedLinear.fp8_weight``) or ``force``; a refresh writes into the
    previous buffers, so a CUDA graph that captured them reads the new values. Under graph
    capture a fresh entry is returned as is (a graph input), a stale or missing one gives
    ``w`` (quantized inside the graph); under torch.compile ``w``."""
    if torch.compiler.is_compiling():
        return w
    capturing = w.is_cuda and torch.cuda.is_current_stream_capturing()
    dgrad = torch.is_grad_enabled() and _mode("DGRAD", "fp8") == "fp8"
    gen, sig = weight_generation(), weight_signature(w)
    hit = cache.get(name)
    fresh = hit is not None and hit[:2] == (sig, gen) and (hit[2].data_t is not None or not dgrad)
    if fresh and not force:
        return hit[2]
    if capturing:
        return w
    pair = quantize_grouped_weight(w, config, True, with_dgrad=dgrad or (
        hit is not None and hit[2].data_t is not None))  # fmt: skip
    if hit is not None and _copy_pair(hit[2], pair):
        pair = hit[2]
    cache[name] = (sig, gen, pair)
    return pair
