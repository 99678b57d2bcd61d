"""``GroupedLinear``: per-group ``y_g = x_g @ W_g^T`` through :func:`ops.grouped_gemm`, or in FP8
through :func:`ops.grouped_gemm_fp8` (``fp8_config``), optionally on an fp8 copy of the weight
kept from one optimizer step to the next (``fp8_weight_cache``)."""

from __future__ import annotations

import math
import weakref

import torch
from torch import nn

from primus_turbo.pytorch.core.checks import check
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig
from primus_turbo.pytorch.ops.fp8_delayed import refuse_delayed
from primus_turbo.pytorch.ops.grouped_gemm import grouped_gemm
from primus_turbo.pytorch.ops.grouped_gemm_fp8 import (
    WeightCache,
    _mode,
    grouped_gemm_fp8,
    quantize_grouped_weight,
    register_step_refresh,
    weight_signature,
)


class GroupedLinear(nn.Module):
    """One linear layer per group (MoE experts), no bias; weight ``[G, out, in]``.

    ``forward(x, group_lens, group_offs=None)``: ``x [M, in]`` packed by group, ``group_lens``
    int64 ``[G]`` on x's device; returns ``[M, out]``.

    ``fp8_config`` (a ``Float8QuantConfig``, TENSORWISE or ROWWISE): the GEMMs run in FP8
    (``grouped_gemm_fp8``, output in x's dtype). ``fp8_weight_cache`` (default None = on in
    fp8 mode; False: quantized in every call, no extra memory): the weight's fp8 copies
    (forward, and the dgrad's along the other axis when gradients are enabled;
    ``quantize_grouped_weight``) are kept and reused while the weight is unchanged, and
    re-quantized in place (same buffers) right after each optimizer step that owns the weight
    (a global step post-hook: ``Fp8WeightCache``), lazily after any other in-place change
    (version counter) or ``grouped_gemm_fp8.clear_weight_cache()``; ``.data`` writes need
    ``refresh_fp8_weights()``. Also used under CUDA-graph capture (the copies are graph
    inputs, fresh at every replay; see ``cached_fp8_weight``); bypassed under torch.compile
    tracing. Memory: the two fp8 copies take the bytes of one bf16 weight, weakly tied to it.
    Gradients reach ``self.weight`` as without the cache.
    """

    def __init__(
        self,
        group_num: int,
        in_features: int,
        out_features: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        fp8_config: Float8QuantConfig | None = None,
        fp8_weight_cache: bool | None = None,
    ) -> None:
        super().__init__()
        op = "GroupedLinear"
        check(fp8_config is None or isinstance(fp8_config, Float8QuantConfig), op, "fp8_config",
              "None or a Float8QuantConfig", type(fp8_config).__name__, TypeError)  # fmt: skip
        refuse_delayed(op, "fp8_config", fp8_config)
        check(fp8_weight_cache in (None, True, False), op, "fp8_weight_cache",
              "None, True or False", repr(fp8_weight_cache), TypeError)  # fmt: skip
        check(not fp8_weight_cache or fp8_config is not None, op, "fp8_weight_cache",
              "False or None without fp8_config", fp8_weight_cache)  # fmt: skip
        self.fp8_config = fp8_config
        if fp8_weight_cache is None:  # default: on in fp8 mode
            fp8_weight_cache = fp8_config is not None
        self.fp8_weight_cache = fp8_weight_cache
        self._fp8_cached = Fp8WeightCache(fp8_config)
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
        (``cached_fp8_weight``: refreshed when stale, also under CUDA-graph capture), or
        ``self.weight`` itself under torch.compile."""
        return cached_fp8_weight(self._fp8_cached, "weight", self.weight, self.fp8_config)

    def refresh_fp8_weights(self) -> None:
        """Re-quantize the cached fp8 weight now, in place (same buffers): needed only after
        writes that neither an optimizer step nor the version counter sees (``.data``)."""
        self._fp8_cached.refresh()

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


class Fp8WeightCache(WeightCache):
    """A module's fp8 weight copies: ``name -> (signature, generation, QuantizedTensorPair,
    weakref to the weight)``: a ``grouped_gemm_fp8.WeightCache``, the raw op's cache mechanism
    (same freshness rule, an entry freed with its weight). Every live cache is refreshed
    EAGERLY by the optimizer step post-hook (``grouped_gemm_fp8``'s, any
    ``torch.optim.Optimizer``): the entries of the weights that optimizer steps are
    re-quantized right after the step, in place into the same buffers, so a CUDA graph that
    captured them reads fresh values at every replay, and a fully captured step (optimizer
    inside the graph) captures the refresh after the update.
    Entries of weights the optimizer does not own are marked stale (re-quantized lazily, in
    place, at their next use: e.g. weights copied from fp32 master weights after the step)."""

    def __init__(self, config=None) -> None:
        super().__init__()
        self.config = config
        _LIVE[id(self)] = self

    def __reduce__(self):  # copy / deepcopy / pickle of a module: a new, empty cache
        return (Fp8WeightCache, (self.config,))

    def refresh(self, params: set | None = None) -> None:
        """Re-quantize in place the entries whose weight is alive (and in ``params``, a set of
        ``id``s, when given); drop the dead ones."""
        with torch.no_grad():
            for name, hit in list(self.items()):
                w = hit[3]()
                if w is None:
                    self.pop(name, None)
                elif params is None or id(w) in params:
                    cached_fp8_weight(self, name, w, self.config, force=True)


_LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id -> Fp8WeightCache


def _refresh_after_step(opt) -> None:
    """The step post-hook's part for module caches (registered with ``grouped_gemm_fp8``)."""
    params = {id(p) for group in getattr(opt, "param_groups", ()) for p in group["params"]}
    for cache in list(_LIVE.values()):
        cache.refresh(params)


register_step_refresh(_refresh_after_step)


def cached_fp8_weight(cache: WeightCache, name: str, w: torch.Tensor, config, force: bool = False):
    """``cache[name]``'s ``QuantizedTensorPair`` of the expert weight ``w`` (forward, and the
    dgrad's copy when gradients are enabled), re-quantized when stale (another generation:
    ``clear_weight_cache()`` or an optimizer step that does not own ``w``; an in-place change
    of ``w``: version counter; another tensor object) or ``force``. A re-quantization writes
    into the previous buffers (same layout), so a CUDA graph that captured them reads the new
    values. Also under CUDA-graph capture: a fresh entry is a graph input; a stale one is
    re-quantized inside the graph (into the same buffers); a missing one is quantized inside
    the graph into new buffers that the cache keeps (in the graph's pool), shared by later
    replays and eager calls. Warm up eagerly before capturing so that the graph holds no
    quantization. Under torch.compile: ``w``."""
    if torch.compiler.is_compiling():
        return w
    dgrad = torch.is_grad_enabled() and _mode("DGRAD", "fp8") == "fp8"
    sig = weight_signature(w)
    hit = cache.entry(name, w)
    if not force and cache.fresh(hit, sig) and (hit[2].data_t is not None or not dgrad):
        return hit[2]
    pair = quantize_grouped_weight(w, config, True, with_dgrad=dgrad or (
        hit is not None and hit[2].data_t is not None))  # fmt: skip
    if hit is not None and _copy_pair(hit[2], pair):
        pair = hit[2]
    return cache.put(name, w, sig, pair)
