"""Platform helpers: device kind, AMD arch, CUDA capability, fp8 dtypes per arch.

Nothing here queries the device at import time; every probe is lazy and cached per device.
"""

from __future__ import annotations

import enum
import functools
import os

import torch


class DeviceKind(enum.Enum):
    CPU = "cpu"
    ROCM = "rocm"
    CUDA = "cuda"


class ArchFamily(enum.Enum):
    """Families that share kernel configs (autotune spaces are keyed by these)."""

    CDNA3 = "cdna3"  # gfx942: MI300X / MI325X
    CDNA4 = "cdna4"  # gfx950: MI350X / MI355X
    HOPPER = "hopper"  # sm_90: H100 / H200
    OTHER_GPU = "other_gpu"
    CPU = "cpu"


def is_rocm() -> bool:
    """True when torch was built for ROCm (HIP)."""
    return torch.version.hip is not None


def gpu_available() -> bool:
    return torch.cuda.is_available()


def device_kind(device: torch.device | str | None = None) -> DeviceKind:
    """What runs tensors on ``device`` (default: the current accelerator, else CPU)."""
    if device is None:
        device = torch.device("cuda") if gpu_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type != "cuda":
        return DeviceKind.CPU
    return DeviceKind.ROCM if is_rocm() else DeviceKind.CUDA


def _index(device: torch.device | str | int | None) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _props(index: int):
    return torch.cuda.get_device_properties(index)


def amd_arch(device: torch.device | str | int | None = None) -> str | None:
    """The gfx name (``gfx942``, ``gfx950``, ...) of an AMD device, else ``None``."""
    if not (gpu_available() and is_rocm()):
        return None
    name = getattr(_props(_index(device)), "gcnArchName", "")
    return name.split(":")[0] or None


def cuda_capability(device: torch.device | str | int | None = None) -> tuple[int, int] | None:
    """``(major, minor)`` of an NVIDIA device, else ``None``."""
    if not gpu_available() or is_rocm():
        return None
    p = _props(_index(device))
    return (p.major, p.minor)


def is_gfx942(device=None) -> bool:
    return amd_arch(device) == "gfx942"


def is_gfx950(device=None) -> bool:
    return amd_arch(device) == "gfx950"


def arch_family_of(arch: str | None, capability: tuple[int, int] | None) -> ArchFamily:
    """Pure mapping from an AMD arch name or a CUDA capability to a family."""
    if arch is not None:
        return {"gfx942": ArchFamily.CDNA3, "gfx950": ArchFamily.CDNA4}.get(
            arch, ArchFamily.OTHER_GPU
        )
    if capability is not None:
        return ArchFamily.HOPPER if capability[0] == 9 else ArchFamily.OTHER_GPU
    return ArchFamily.CPU


def arch_family(device: torch.device | str | int | None = None) -> ArchFamily:
    """The family of ``device``; CPU when it is a CPU device or no GPU is present."""
    if isinstance(device, torch.device):  # the per-launch path: cached per device
        return _arch_family_cached(device.type, device.index)
    if device is not None and not isinstance(device, int) and torch.device(device).type != "cuda":
        return ArchFamily.CPU
    if not gpu_available():
        return ArchFamily.CPU
    return arch_family_of(amd_arch(device), cuda_capability(device))


@functools.lru_cache(maxsize=64)
def _arch_family_cached(kind: str, index: int | None) -> ArchFamily:
    if kind != "cuda" or not gpu_available():
        return ArchFamily.CPU
    dev = index if index is not None else torch.cuda.current_device()
    return arch_family_of(amd_arch(dev), cuda_capability(dev))


def num_compute_units(device: torch.device | str | int | None = None) -> int:
    """CUs (AMD) or SMs (NVIDIA) of ``device``; the CPU core count on CPU."""
    if not gpu_available():
        return os.cpu_count() or 1
    return _props(_index(device)).multi_processor_count


def device_name(device: torch.device | str | int | None = None) -> str:
    if device is not None and not isinstance(device, int) and torch.device(device).type != "cuda":
        return "cpu"
    if not gpu_available():
        return "cpu"
    return _props(_index(device)).name


def warp_size(device: torch.device | str | int | None = None) -> int:
    """64 on AMD (wavefront), 32 on NVIDIA."""
    return 64 if device_kind(device if device is not None else None) == DeviceKind.ROCM else 32


def fp8_dtypes_for(arch: str | None) -> tuple[torch.dtype, torch.dtype]:
    """``(e4m3, e5m2)`` for an arch: FNUZ on gfx942, OCP on gfx950, NVIDIA and CPU."""
    if arch == "gfx942":
        return torch.float8_e4m3fnuz, torch.float8_e5m2fnuz
    return torch.float8_e4m3fn, torch.float8_e5m2


def fp8_dtypes(device: torch.device | str | int | None = None) -> tuple[torch.dtype, torch.dtype]:
    """``(e4m3, e5m2)`` for ``device`` (see :func:`fp8_dtypes_for`)."""
    if arch_family(device) == ArchFamily.CPU:
        return fp8_dtypes_for(None)
    return fp8_dtypes_for(amd_arch(device))


def triton_interpret() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def is_graph_capturing() -> bool:
    return gpu_available() and torch.cuda.is_current_stream_capturing()
