"""The Hopper grouped GEMM (``torch.ops.primus_turbo_cpp.grouped_gemm_bf16_nt_hopper``,
csrc/kernels/grouped_gemm_hopper.cu): bf16 NT forward ``out = a_g @ b[g]^T`` on sm_90a, a
warp-specialised persistent kernel (TMA producer warpgroup, two wgmma consumer warpgroups on a
128 x 256 tile, 4-stage ring), with ``cluster=2`` blocks in pairs sharing each weight tile by
TMA multicast. NVIDIA only; built when the CUDA arch list has ``9.0a`` (the default for an H100
/ H200 build).

Not dispatched by any op: on the H200 (session 11, calls 11.0-11.7, scripts/hopper_probe.py) it
is bitwise equal to torch._grouped_mm but not faster than our Triton kernel (0.85-1.00 of it on
the large experts, 0.74-0.93 on the small ones, where its per-tile epilogue of 4-byte stores
costs ~3 us a tile). It stays as the base for the Hopper-specific work the Triton compiler
cannot express (clusters with multicast, warp specialisation with setmaxnreg); see
docs/moe_notes.md, session 11.
"""

from __future__ import annotations

import torch


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


def grouped_gemm_hopper(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
                        cluster: int = 2, variant: int = 0) -> torch.Tensor:  # fmt: skip
    """``[M, N]`` bf16: rows ``offs[i]:offs[i+1]`` of ``a`` (bf16 ``[M, K]``) times ``b[i]^T``
    (``b`` bf16 ``[G, N, K]``); rows past ``offs[G]`` are zero. ``offs``: int64 ``[G + 1]`` on
    the device. ``variant``: kernel options for A/B (bits: 1 launch without the cluster
    attribute, 2 drain every k step, 4 bands of 16 row tiles)."""
    from primus_turbo.build_info import native_ops

    out = torch.empty((a.shape[0], b.shape[1]), dtype=torch.bfloat16, device=a.device)
    native_ops().grouped_gemm_bf16_nt_hopper(a, b, offs, out, cluster, variant)
    return out
