"""PyTorch frontend: ``import primus_turbo.pytorch as turbo; turbo.ops.gemm(a, b)``.

``float8_e4m3`` / ``float8_e5m2`` are the fp8 dtypes of the current device: FNUZ
(``float8_e4m3fnuz`` / ``float8_e5m2fnuz``) on gfx942, OCP elsewhere (and on CPU). They are
resolved on first access (module ``__getattr__``), so importing never queries the device.
"""

from primus_turbo.pytorch import core, modules, ops

__all__ = ["core", "modules", "ops", "float8_e4m3", "float8_e5m2"]


def __getattr__(name: str):
    if name in ("float8_e4m3", "float8_e5m2"):
        from primus_turbo.pytorch.core.platform import fp8_dtypes

        return fp8_dtypes()[0 if name == "float8_e4m3" else 1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
