"""Does a host-TMA-descriptor launch from a fresh thread need ``host_tma.ensure_context``?
Launches the TRITON grouped GEMM's TMA plan from two new threads (no CUDA call made in either
before): first with ``ensure_context`` replaced by a no-op, then with it. Prints OK / FAILED for
each (call 10.10). Needs an NVIDIA sm_90+ GPU."""

from __future__ import annotations

import importlib
import os
import sys
import threading
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["PRIMUS_TURBO_GROUPED_GEMM_DEFAULT"] = "triton"
os.environ["PRIMUS_TURBO_GROUPED_GEMM_KERNEL"] = "tma"

import primus_turbo.pytorch as turbo  # noqa: E402
import primus_turbo.triton.host_tma as host_tma  # noqa: E402
from primus_turbo.pytorch.reference import group_offsets  # noqa: E402


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a GPU")
        return 0
    a = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4, 512, 512, device="cuda", dtype=torch.bfloat16)
    gl = torch.tensor([1000, 1000, 1096, 1000], device="cuda")
    offs = group_offsets(gl)
    turbo.ops.grouped_gemm(a, b, gl, offs, trans_b=True)  # compile + warm in the main thread
    torch.cuda.synchronize()

    def run(tag):
        try:
            turbo.ops.grouped_gemm(a, b, gl, offs, trans_b=True)
            torch.cuda.synchronize()
            print(f"{tag}: OK", flush=True)
        except Exception as exc:  # noqa: BLE001 - the check prints the failure
            print(f"{tag}: FAILED {type(exc).__name__}: {str(exc)[:160]}", flush=True)

    host_tma.ensure_context = lambda device: None
    t = threading.Thread(target=run, args=("fresh thread, no ensure_context",))
    t.start()
    t.join()
    importlib.reload(host_tma)
    t = threading.Thread(target=run, args=("fresh thread, ensure_context",))
    t.start()
    t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
