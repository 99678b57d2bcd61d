"""What the ahead-of-time check compiles: one ``AotSpec`` per kernel config and target."""

from __future__ import annotations

import dataclasses
from typing import Any

# Targets of the AOT check: (name, backend, arch, warp size).
AOT_TARGETS: dict[str, tuple[str, str | int, int]] = {
    "gfx942": ("hip", "gfx942", 64),
    "gfx950": ("hip", "gfx950", 64),
    "sm_90": ("cuda", 90, 32),
}


@dataclasses.dataclass(frozen=True)
class AotSpec:
    """One kernel specialisation to compile.

    ``signature`` maps every non-constexpr argument to a Triton type string (``*bf16``, ``i32``);
    ``constexprs`` maps every constexpr argument to its value; ``options`` holds compile options
    (``num_warps``, ``num_stages`` and backend-specific ones such as ``waves_per_eu``).
    """

    name: str
    fn: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    options: dict[str, Any]
    default: bool = False  # the config the heuristic picks for a typical large shape


def triton_dtype_name(dtype) -> str:
    """Triton pointer element name of a torch dtype (``torch.bfloat16`` -> ``bf16``)."""
    import torch

    return {
        torch.bfloat16: "bf16",
        torch.float16: "fp16",
        torch.float32: "fp32",
        torch.float8_e4m3fn: "fp8e4nv",
        torch.float8_e5m2: "fp8e5",
        torch.float8_e4m3fnuz: "fp8e4b8",
        torch.float8_e5m2fnuz: "fp8e5b16",
        torch.int32: "i32",
        torch.int64: "i64",
        torch.uint8: "u8",
    }[dtype]
