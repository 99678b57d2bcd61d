"""The Hopper grouped GEMM (``torch.ops.primus_turbo_cpp.grouped_gemm_bf16_nt_hopper``,
csrc/kernels/grouped_gemm_hopper.cu): bf16 NT forward ``out = a_g @ b[g]^T`` on sm_90a, a
warp-specialised persistent kernel (TMA producer warpgroup, two wgmma consumer warpgroups on a
128 x 256 tile, 4-stage ring), with ``cluster=2`` blocks in pairs sharing each weight tile by
TMA multicast. NVIDIA only (AMD runs the Triton kernels); built when the CUDA arch list has
``9.0a`` (the default for an H100 / H200 build).

``PRIMUS_TURBO_GROUPED_GEMM_HOPPER``: ``2`` (unset: pairs with multicast), ``1`` (one block per
tile), ``0`` (never).
"""

from __future__ import annotations

import os

import torch

_MAX_GROUPS = 1024
_LIMIT = 2**31 - 256
_MODES = {"0": 0, "1": 1, "2": 2}


def hopper_mode() -> int:
    """``PRIMUS_TURBO_GROUPED_GEMM_HOPPER``: the cluster size (1 or 2), or 0 (off)."""
    raw = os.environ.get("PRIMUS_TURBO_GROUPED_GEMM_HOPPER", "").strip() or "2"
    if raw not in _MODES:
        raise ValueError(
            f"primus_turbo: PRIMUS_TURBO_GROUPED_GEMM_HOPPER expected 0, 1 or 2, got {raw!r}"
        )
    return _MODES[raw]


def hopper_available(device: torch.device) -> bool:
    """True when the loaded extension has the kernel (a CUDA build with 9.0a) and ``device`` is
    an sm_90 GPU."""
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    from primus_turbo.build_info import native_has_gpu, native_ops

    op = "grouped_gemm_bf16_nt_hopper"
    if not native_has_gpu() or not hasattr(native_ops(), op):
        return False
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"primus_turbo_cpp::{op}", "CUDA"):
        return False
    return torch.cuda.get_device_capability(device) == (9, 0)


def hopper_can_run(a: torch.Tensor, b: torch.Tensor, trans_b: bool, out_dtype) -> str:
    """Empty when the kernel takes this call, else why not (one line)."""
    if not trans_b:
        return "only the NT layout (trans_b=True)"
    if a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16 or out_dtype != torch.bfloat16:
        return f"bf16 only, got {a.dtype}/{b.dtype} -> {out_dtype}"
    if a.dim() != 2 or b.dim() != 3:
        return f"a 2-D and b 3-D expected, got {tuple(a.shape)}, {tuple(b.shape)}"
    m, k = a.shape
    g, n = b.shape[0], b.shape[1]
    if not 1 <= g <= _MAX_GROUPS or n % 8 or k % 8 or k == 0 or m >= _LIMIT or g * n >= _LIMIT:
        return f"needs 1 <= G <= {_MAX_GROUPS}, N and K multiples of 8, got G={g} N={n} K={k}"
    if not (a.is_contiguous() and b.is_contiguous()):
        return "contiguous a and b only"
    if a.data_ptr() % 16 or b.data_ptr() % 16:
        return "16-byte aligned a and b only"
    if not hopper_available(a.device):
        return f"no sm_90a kernel for device {a.device}"
    return ""


def grouped_gemm_hopper(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
                        cluster: int = 2, variant: int = 0) -> torch.Tensor:  # fmt: skip
    """``[M, N]`` bf16: rows ``offs[i]:offs[i+1]`` of ``a`` times ``b[i]^T``; rows past
    ``offs[G]`` are zero. ``offs``: int64 ``[G + 1]`` on the device. ``variant``: kernel
    options for A/B (see grouped_gemm_hopper.h)."""
    from primus_turbo.build_info import native_ops

    out = torch.empty((a.shape[0], b.shape[1]), dtype=torch.bfloat16, device=a.device)
    native_ops().grouped_gemm_bf16_nt_hopper(a, b, offs, out, cluster, variant)
    return out
