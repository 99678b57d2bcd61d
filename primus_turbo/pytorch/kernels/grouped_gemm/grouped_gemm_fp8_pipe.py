"""Pipelined FP8 rowwise grouped GEMM forward: the weight quantization of later experts runs
while the fp8 GEMM of earlier experts runs on a side stream.

The forward of ``grouped_gemm_fp8`` quantizes a (``[M, K]``, ~1.4 GB moved for DeepSeek-V3
gate_up) and the weights b (``[G, N, K]``, ~2.8 GB moved) before the compute-bound fp8 GEMM
(H200 run 5.4: ~1.2 ms of quantization before a 2.7 ms GEMM). The quantization is memory-bound
and the GEMM needs little memory bandwidth, so this path splits the experts into ``chunks``
contiguous ranges and issues:

* caller's stream: per chunk, the quantization of its activation rows (the row window of its
  groups, read on the device; or all of a up front) and of its weights, then an event;
* a side stream at a higher priority: per chunk, wait for its event, then the fp8 GEMM of
  that chunk's groups (``grouped_gemm_fp8_chunk_kernel``: the ``f8tma`` walk over the chunk's
  groups; only the last chunk zeroes the rows past ``offs[G]``).

The first ``reserve_chunks`` GEMM launches use ``SMs - free_sms`` programs, leaving SMs to the
quantization of the next chunks (a persistent GEMM program fills an SM's registers and shared
memory: 243 registers x 256 threads, 176 KiB on sm_90); the later ones use every SM. Rowwise
only: each chunk's per-(expert, column) scales equal the whole tensor's, so the output is
bitwise the unpipelined one for the same tile. The host never reads the group sizes; the side
stream joins the caller's stream before the function returns (CUDA graph capture works).
Selected by ``PRIMUS_TURBO_GROUPED_GEMM_FP8_PIPELINE`` (see ``spec``). On the CPU
interpreter the same chunks run in order on one stream (tests).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch


@functools.cache
def spec() -> tuple[int, int, int, int]:
    """``PRIMUS_TURBO_GROUPED_GEMM_FP8_PIPELINE`` = ``chunks[:free_sms[:reserve_chunks[:a_rows]]]``:
    ``0`` / unset: off (one quantization of all weights, then one GEMM: the pre-session-6
    forward); ``chunks >= 2``: pipelined; ``free_sms`` (default 16) SMs left to the quantization
    by the first ``reserve_chunks`` GEMM launches (default ``chunks - 1``: the quantization of
    chunk ``i + 1`` runs during the GEMM of chunk ``i``, none during the last); ``a_rows`` (default
    ``1``): the activation rows of each chunk's groups are quantized right before its GEMM
    (``grouped_gemm_fp8_quant``, row window read on the device), ``0``: all of a up front."""
    var = "PRIMUS_TURBO_GROUPED_GEMM_FP8_PIPELINE"
    raw = os.environ.get(var, "").strip()
    if not raw:
        return 0, 0, 0, 0
    try:
        parts = [int(x) for x in raw.split(":")]
    except ValueError:
        parts = []
    ok = 1 <= len(parts) <= 4 and all(x >= 0 for x in parts) and parts[0] != 1
    if not ok or (len(parts) == 4 and parts[3] > 1):
        raise ValueError(
            f"primus_turbo: {var} expected 'chunks[:free_sms[:reserve_chunks[:a_rows]]]' with "
            f"chunks 0 or >= 2, a_rows 0 or 1 and non-negative integers, got {raw!r}"
        )
    chunks = parts[0]
    free = parts[1] if len(parts) > 1 else 16
    reserve = parts[2] if len(parts) > 2 else max(chunks - 1, 0)
    a_rows = parts[3] if len(parts) > 3 else 1
    return chunks, free, reserve, a_rows


@functools.cache
def _gemm_stream(index: int) -> torch.cuda.Stream:
    """The GEMM side stream of device ``index``, above the default priority (``-1``; the
    caller's stream is usually ``0``): when a chunk's GEMM launches, the block scheduler
    hands it the SMs as the quantization's blocks drain."""
    return torch.cuda.Stream(device=index, priority=-1)


def usable(a: torch.Tensor, b: torch.Tensor, trans_b: bool, rowwise: bool) -> bool:
    """On (env), ROWWISE, at least two experts, and the TMA fp8 kernel usable for the
    quantized operands (CUDA sm_90+ with ``PRIMUS_TURBO_GROUPED_GEMM_FP8_TMA`` on, or the
    interpreter; K a multiple of 16: 16-byte fp8 rows)."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_fp8_tma import fp8_tma_device_ok

    if spec()[0] < 2 or not rowwise or b.shape[0] < 2:
        return False
    m, k = a.shape
    n = b.shape[1] if trans_b else b.shape[2]
    if m == 0 or n == 0 or k < 16 or k % 16:
        return False
    return fp8_tma_device_ok(a.device)


def pipelined_forward(
    a: torch.Tensor,
    b: torch.Tensor,
    group_offs: torch.Tensor,
    trans_b: bool,
    out_dtype: torch.dtype,
    fp8_dtype: torch.dtype,
    quant_rows: Callable,
    quant_experts: Callable,
) -> torch.Tensor:
    """``[M, N]`` of ``out_dtype``: the rowwise fp8 forward (the caller checked ``usable``).
    ``quant_rows(x) -> (q, s [rows])`` and ``quant_experts(w [Gc, N, K]) -> (q, s [Gc, N])``
    are the op's quantizations (``fp8_dtype`` and granularity bound)."""
    from primus_turbo.pytorch.core.platform import num_compute_units
    from primus_turbo.triton.grouped_gemm.grouped_gemm_fp8_quant import (
        ROW_IN_REGS,
        quant_rows_window,
    )
    from primus_turbo.triton.grouped_gemm.grouped_gemm_fp8_tma import chunk_plan, launch_fp8_chunk

    chunks, free_sms, reserve, a_rows = spec()
    g = b.shape[0]
    chunks = min(chunks, g)
    bounds = [round(i * g / chunks) for i in range(chunks + 1)]
    plan = chunk_plan()
    ppc = plan[1].programs_per_cu
    cuda = a.is_cuda
    if cuda:
        main = torch.cuda.current_stream(a.device)
        side = _gemm_stream(a.device.index if a.device.index is not None else 0)
        full = num_compute_units(a.device) * ppc
        reduced = max(1, full - free_sms * ppc)
    else:
        full = reduced = 4
    m, k = a.shape
    n = b.shape[1] if trans_b else b.shape[2]
    x = a.contiguous()
    window = a_rows == 1 and k <= ROW_IN_REGS
    if window:  # each chunk's rows right before its GEMM (quant_rows_window below)
        qa = torch.empty((m, k), dtype=fp8_dtype, device=a.device)
        sa = torch.empty((m,), dtype=torch.float32, device=a.device)
    else:
        qa, sa = quant_rows(x)
        sa = sa.reshape(-1)
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    # quantization on the caller's stream, chunk GEMMs on the side stream as each chunk's
    # operands are ready. Every tensor the side stream reads is made before its event and held
    # (``keep``) until after the final join: the allocator frees in the caller's stream order,
    # so a chunk's weights freed earlier could be reused while its GEMM still reads them
    keep = []
    for i in range(chunks):
        g0, g1 = bounds[i], bounds[i + 1]
        if window:
            quant_rows_window(x, qa, sa, group_offs[g0 : g1 + 1])
        w = b[g0:g1]
        qb, sb = quant_experts((w if trans_b else w.transpose(1, 2)).contiguous())
        keep.append((qb, sb))
        programs = reduced if i < reserve else full
        args = (qa, qb, c, group_offs[g0:], sa, sb, plan, programs, i == chunks - 1)
        if not cuda:
            launch_fp8_chunk(*args)
            continue
        event = torch.cuda.Event()
        event.record(main)
        side.wait_event(event)
        with torch.cuda.stream(side):
            launch_fp8_chunk(*args)
    if cuda:
        main.wait_stream(side)
    del keep
    return c
