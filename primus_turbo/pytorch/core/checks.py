"""The one input-check helper used at every public boundary.

Errors name the op, the argument, what was expected and what was given, e.g.
``primus_turbo.gemm: argument 'b' expected a 2-D tensor, got shape (3, 4, 5)``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def fail(op: str, arg: str, expected: str, got: object, exc: type[Exception] = ValueError):
    """Raise ``exc`` with the project's standard message."""
    raise exc(f"primus_turbo.{op}: argument '{arg}' expected {expected}, got {got}")


def check(
    cond: bool, op: str, arg: str, expected: str, got: object, exc: type[Exception] = ValueError
) -> None:
    """Raise ``exc`` with the standard message unless ``cond`` holds."""
    if not cond:
        fail(op, arg, expected, got, exc)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return "{" + ", ".join(str(d).replace("torch.", "") for d in dtypes) + "}"


def check_tensor(
    op: str,
    arg: str,
    t: object,
    *,
    ndim: int | tuple[int, ...] | None = None,
    dtypes: Iterable[torch.dtype] | None = None,
) -> None:
    """Check that ``t`` is a tensor of the given rank(s) and dtype(s).

    Messages are formatted only on failure: this runs on every op call.
    """
    if not isinstance(t, torch.Tensor):
        fail(op, arg, "a torch.Tensor", type(t).__name__, TypeError)
    if ndim is not None:
        ranks = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in ranks:
            rank_text = "/".join(str(r) for r in ranks)
            fail(op, arg, f"a {rank_text}-D tensor", f"shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        fail(op, arg, f"dtype in {_dtype_names(dtypes)}", t.dtype, TypeError)


def check_same_device(op: str, **tensors: torch.Tensor) -> None:
    """Check that every tensor lives on one device."""
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        got = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        fail(op, "/".join(devices), "all tensors on one device", got, RuntimeError)


def check_dtype_arg(op: str, arg: str, value: object, allowed: Iterable[torch.dtype]) -> None:
    """Check a ``torch.dtype`` argument (e.g. ``out_dtype``)."""
    if value not in allowed:
        fail(op, arg, f"a dtype in {_dtype_names(allowed)}", value, TypeError)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def env_flag(name: str, default: bool) -> bool:
    """An on/off environment variable: ``1/true/yes/on`` or ``0/false/no/off`` (any case);
    unset or empty means ``default``. Anything else raises, naming the variable (before, a
    typo such as ``PRIMUS_TURBO_TRITON_TUNE=false`` silently left tuning on)."""
    import os

    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"primus_turbo: environment variable {name} expected one of "
        f"{_TRUE + _FALSE} (or unset), got {os.environ[name]!r}"
    )
