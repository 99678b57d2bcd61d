"""Does ``torch._grouped_mm`` write the wgrad blocks of empty groups on this GPU? (GPU)

The HIPBLASLT grouped GEMM backend zeroes those blocks after the vendor call
(``grouped_gemm_fixup.zero_empty_groups``) because the vendor kernel may leave them unwritten.
This probe poisons the caching allocator's memory with NaN, runs the variable-K product
``x^T @ y`` with empty groups, and reports per empty group whether its block came back all
zero, NaN or other values; and times the fixup kernel on that output.

    python3 scripts/grouped_mm_empty_probe.py
"""

from __future__ import annotations

import torch


def main() -> int:
    if not torch.cuda.is_available() or not hasattr(torch, "_grouped_mm"):
        print("grouped_mm_empty_probe: needs a CUDA GPU and torch._grouped_mm")
        return 1
    from primus_turbo.triton.grouped_gemm.grouped_gemm_fixup import zero_empty_groups

    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__}")
    for g, p, q, lens in (
        (8, 28672, 4096, [2000, 0, 3000, 2500, 0, 2048, 3000, 3836]),
        (4, 512, 256, [0, 64, 0, 100]),
    ):
        m = sum(lens)
        poison = torch.full((g, p, q), float("nan"), dtype=torch.bfloat16, device=dev)
        del poison  # the next [g, p, q] bf16 allocation reuses this NaN-filled block
        x = torch.randn(m, p, dtype=torch.bfloat16, device=dev)
        y = torch.randn(m, q, dtype=torch.bfloat16, device=dev)
        ends = torch.cumsum(torch.tensor(lens, device=dev), 0).to(torch.int32)
        out = torch._grouped_mm(x.t(), y, offs=ends)
        torch.cuda.synchronize()
        for i, n in enumerate(lens):
            if n == 0:
                blk = out[i].float()
                nan = int(torch.isnan(blk).sum())
                nz = int((blk != 0).sum()) - nan
                state = "zero" if nan == 0 and nz == 0 else f"NaN {nan}, nonzero {nz}"
                print(f"  G={g} P={p} Q={q}: empty group {i}: {state}")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        zero_empty_groups(out, ends)
        start.record()
        for _ in range(10):
            zero_empty_groups(out, ends)
        end.record()
        torch.cuda.synchronize()
        empty_bytes = sum(1 for n in lens if n == 0) * p * q * 2
        us = start.elapsed_time(end) * 100
        tbs = empty_bytes / us / 1e6
        print(f"  fixup {us:.1f} us for {empty_bytes / 1e6:.1f} MB ({tbs:.2f} TB/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
