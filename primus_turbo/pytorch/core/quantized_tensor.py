"""Pre-quantized GEMM operands: :class:`QuantizedTensor` and :class:`QuantizedTensorPair`.

A GEMM op that accepts them skips its own quantization of that operand (e.g. weights quantized
once per optimizer step and reused by every micro-batch). The op checks that the operand matches
the recipe it would have built (:func:`check_quantized_tensor`: fp8 dtype, granularity, axis,
shape) and raises a clear error otherwise.

Departure from upstream: a plain container, not a ``torch.Tensor`` wrapper subclass, so it
never enters autograd or ``__torch_dispatch__``. Gradients go to ``source``: the high-precision
tensor it was quantized from, kept (by reference) when that tensor requires grad, so an op
returns the weight gradient to the parameter while computing its forward on the fp8 copy.

Layout: ``qdata`` has the logical shape of the source; its storage is the source moved so
``quantized_axis`` is innermost (contiguous along the scaled axis, what an NT GEMM reads), i.e.
``qdata`` may be a transposed view. ``scale_inv`` (fp32, dequantisation ``x ~ q * scale_inv``)
is 0-d for TENSORWISE and has the source's shape with size 1 at ``quantized_axis`` for ROWWISE
(keepdim). TENSORWISE records ``quantized_axis`` too (only a layout hint). ``grad_only``: the
source is a gradient sink only (its values are not read; see the field). BLOCKWISE / MX are
not built here yet (NotImplementedError).
"""

from __future__ import annotations

import dataclasses

import torch

from primus_turbo.pytorch.core.checks import check, check_tensor, fail
from primus_turbo.pytorch.core.low_precision import ScalingGranularity, is_fp8_dtype

__all__ = ["QuantizedTensor", "QuantizedTensorPair", "check_quantized_tensor"]

_OP = "QuantizedTensor"
_ROW, _TENSOR = ScalingGranularity.ROWWISE, ScalingGranularity.TENSORWISE


@dataclasses.dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """fp8 data, fp32 ``scale_inv`` and the recipe metadata (see the module doc)."""

    qdata: torch.Tensor
    scale_inv: torch.Tensor
    dtype: torch.dtype  # the high-precision dtype it was quantized from
    granularity: ScalingGranularity
    quantized_axis: int
    source: torch.Tensor | None = None
    # True: ``source`` only receives the gradient (a placeholder, e.g. a zero-stride tensor
    # from an op that produced the fp8 data directly: fused activation + quantization, fp8
    # permute); its values are never read, a backward GEMM uses the dequantized fp8 data
    grad_only: bool = False

    @property
    def real_dtype(self) -> torch.dtype:
        return self.qdata.dtype

    @property
    def shape(self) -> torch.Size:
        return self.qdata.shape

    @property
    def device(self) -> torch.device:
        return self.qdata.device

    def dim(self) -> int:
        return self.qdata.dim()

    @classmethod
    def quantize(
        cls,
        hp_tensor: torch.Tensor,
        dest_dtype: torch.dtype,
        granularity: ScalingGranularity,
        *,
        axis: int = -1,
        keep_source: bool | None = None,
    ) -> QuantizedTensor:
        """Quantize ``hp_tensor`` (2-D or 3-D, fp16/bf16/fp32) to ``dest_dtype`` with dynamic
        scaling: ROWWISE one scale per line along ``axis``, TENSORWISE one scale (``axis`` then
        only picks the storage layout). ``keep_source`` (default: ``hp_tensor.requires_grad``)
        keeps a reference to ``hp_tensor`` for gradients. Runs without autograd."""
        from primus_turbo.pytorch.ops.quantization import quantize_fp8

        check_tensor(_OP, "hp_tensor", hp_tensor, ndim=(2, 3))
        check(not is_fp8_dtype(hp_tensor.dtype), _OP, "hp_tensor", "a high-precision tensor",
              hp_tensor.dtype, TypeError)  # fmt: skip
        check(is_fp8_dtype(dest_dtype), _OP, "dest_dtype", "an fp8 dtype", dest_dtype, TypeError)
        if granularity not in (_ROW, _TENSOR):
            fail(_OP, "granularity", "TENSORWISE or ROWWISE (BLOCKWISE/MX not implemented)",
                 getattr(granularity, "name", granularity), NotImplementedError)  # fmt: skip
        nd = hp_tensor.dim()
        check(-nd <= axis < nd, _OP, "axis", f"an axis of a {nd}-D tensor", axis)
        ax = axis % nd
        with torch.no_grad():
            x = hp_tensor.detach()
            moved = x.movedim(ax, -1).contiguous()  # the scaled axis innermost
            rows = moved.reshape(-1, moved.shape[-1])
            if granularity == _TENSOR:
                q, s = quantize_fp8(rows, dest_dtype, _TENSOR)
                s = s.reshape(())
            else:
                q, s = quantize_fp8(rows, dest_dtype, _ROW, axis=-1)
                s = s.reshape(*moved.shape[:-1], 1).movedim(-1, ax)
            q = q.reshape(moved.shape).movedim(-1, ax)
        if keep_source is None:
            keep_source = hp_tensor.requires_grad
        src = hp_tensor if keep_source else None
        return cls(q, s, hp_tensor.dtype, granularity, ax, src)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``qdata * scale_inv`` in fp32, cast to ``dtype`` (default: the source dtype)."""
        out = self.qdata.float() * self.scale_inv.float()
        return out.to(dtype or self.dtype)

    def __repr__(self) -> str:
        return (
            f"QuantizedTensor(shape={tuple(self.shape)}, real_dtype={self.real_dtype}, "
            f"dtype={self.dtype}, granularity={self.granularity.name}, "
            f"quantized_axis={self.quantized_axis}, source={self.source is not None}"
            + (", grad_only=True)" if self.grad_only else ")")
        )


@dataclasses.dataclass(frozen=True, eq=False)
class QuantizedTensorPair:
    """An operand quantized for the forward (``data``) plus, optionally, the same tensor
    quantized along another axis (``data_t``, same logical shape) for a backward GEMM that
    reduces over that axis (e.g. the dgrad of a weight)."""

    data: QuantizedTensor
    data_t: QuantizedTensor | None = None

    def __post_init__(self) -> None:
        op = "QuantizedTensorPair"
        check(isinstance(self.data, QuantizedTensor), op, "data", "a QuantizedTensor",
              type(self.data).__name__, TypeError)  # fmt: skip
        t = self.data_t
        if t is not None:
            check(isinstance(t, QuantizedTensor), op, "data_t", "a QuantizedTensor or None",
                  type(t).__name__, TypeError)  # fmt: skip
            check(t.shape == self.data.shape, op, "data_t", f"shape {tuple(self.data.shape)}",
                  tuple(t.shape))  # fmt: skip

    @property
    def source(self) -> torch.Tensor | None:
        return self.data.source


def check_quantized_tensor(
    op: str,
    arg: str,
    qt: QuantizedTensor,
    *,
    dtype: torch.dtype,
    granularity: ScalingGranularity,
    axis: int,
    shape: tuple[int, ...] | None = None,
) -> None:
    """Raise (op, argument, expected, got) unless ``qt`` is what ``op`` would have built: fp8
    ``dtype``, ``granularity``, scaled along ``axis`` (ROWWISE), ``shape`` when given, scales
    of the matching shape."""
    check(isinstance(qt, QuantizedTensor), op, arg, "a QuantizedTensor", type(qt).__name__,
          TypeError)  # fmt: skip
    check(qt.real_dtype == dtype, op, arg, f"fp8 data of dtype {dtype} (the recipe's)",
          qt.real_dtype, TypeError)  # fmt: skip
    check(qt.granularity == granularity, op, arg, f"{granularity.name} scaling (the recipe's)",
          qt.granularity.name)  # fmt: skip
    nd = qt.dim()
    ax = axis % nd
    if shape is not None:
        check(tuple(qt.shape) == tuple(shape), op, arg, f"shape {tuple(shape)}", tuple(qt.shape))
    if granularity == _TENSOR:
        check(qt.scale_inv.numel() == 1, op, arg, "one TENSORWISE scale",
              f"scale_inv of shape {tuple(qt.scale_inv.shape)}")  # fmt: skip
        return
    check(qt.quantized_axis == ax, op, arg, f"ROWWISE scales along axis {ax} (the reduction)",
          f"quantized_axis={qt.quantized_axis}")  # fmt: skip
    want = list(qt.shape)
    want[ax] = 1
    check(list(qt.scale_inv.shape) == want, op, arg, f"scale_inv of shape {tuple(want)}",
          tuple(qt.scale_inv.shape))  # fmt: skip
