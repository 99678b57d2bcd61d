"""Core: backend registry + dispatcher, platform helpers, checks, autotune cache, logging."""

from primus_turbo.pytorch.core.backend import (
    AutoKernelDispatcher,
    BackendChoice,
    BackendType,
    GlobalBackendManager,
    KernelBackend,
    PrecisionType,
    Verdict,
)
from primus_turbo.pytorch.core.logging import get_logger
from primus_turbo.pytorch.core.platform import (
    ArchFamily,
    DeviceKind,
    amd_arch,
    arch_family,
    cuda_capability,
    device_kind,
    fp8_dtypes,
    is_gfx942,
    is_gfx950,
)

__all__ = [
    "ArchFamily",
    "AutoKernelDispatcher",
    "BackendChoice",
    "BackendType",
    "DeviceKind",
    "GlobalBackendManager",
    "KernelBackend",
    "PrecisionType",
    "Verdict",
    "amd_arch",
    "arch_family",
    "cuda_capability",
    "device_kind",
    "fp8_dtypes",
    "get_logger",
    "is_gfx942",
    "is_gfx950",
]
