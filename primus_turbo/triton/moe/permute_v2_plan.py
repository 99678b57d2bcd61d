"""Launch plans and A/B knobs of the v2 MoE permute kernels (``permute_v2_kernel.py``).

Environment variables, read per call (an A/B needs no reload; invalid values raise naming the
variable): ``PRIMUS_TURBO_MOE_PERMUTE_GEOM`` (``2d`` default, ``v2``),
``PRIMUS_TURBO_MOE_PERMUTE_SPLITS`` (column splits, 0 = automatic),
``PRIMUS_TURBO_MOE_PERMUTE_CHUNKS`` (chunk cap of the ``2d`` fused permute, 0 = automatic),
``PRIMUS_TURBO_MOE_PERMUTE_COPY`` (``gather`` default, ``fused``: who moves the rows of the
``2d`` permute forward).
"""

from __future__ import annotations

import functools
import os

import torch
import triton


def _plan_v2(work: int, e: int, geom: str = "2d") -> tuple[int, int, int, int, int]:
    """``(E_PAD, SUB, CHUNK, C, CB)``: 16-copy sub-blocks; up to 512 chunks (256 for 64+
    experts, where every program sums a ``[C, E_PAD]`` count table; ``"2d"``: 256, or
    ``PRIMUS_TURBO_MOE_PERMUTE_CHUNKS``). ``CB`` table rows are
    summed per step: ``geom="v2"`` 4096 counts a step, ``"2d"`` up to 8192 (the whole table of
    8 experts x 512 chunks in one L2 round trip, 2 for 32 experts, 4 for 128)."""
    e_pad = triton.next_power_of_2(max(e, 2))
    sub = 16
    max_c = 256 if e_pad >= 64 else 512
    if geom != "v2":  # the column splits bring the parallelism back: halve the table traffic
        max_c = _int_env(CHUNKS_ENV) or 256
    chunk = max(sub, triton.next_power_of_2(-(-max(work, 1) // max_c)))
    grid = -(-max(work, 1) // chunk)
    if geom == "v2":
        cb = max(1, min(64, 4096 // e_pad))
    else:
        cb = max(1, min(triton.next_power_of_2(grid), 8192 // e_pad))
    return e_pad, sub, chunk, grid, cb


GEOM_ENV = "PRIMUS_TURBO_MOE_PERMUTE_GEOM"
GEOMS = ("2d", "v2")
SPLITS_ENV = "PRIMUS_TURBO_MOE_PERMUTE_SPLITS"
CHUNKS_ENV = "PRIMUS_TURBO_MOE_PERMUTE_CHUNKS"
COPY_ENV = "PRIMUS_TURBO_MOE_PERMUTE_COPY"
COPIES = ("gather", "fused")
# Largest row block in bytes (1024 bf16 = 16-byte vectors for 128 threads); tests lower it to
# get several column blocks (and splits) out of tiny interpreter shapes.
MAX_BLOCK_BYTES = 2048
# column-split targets, programs per SM: the fused permute reads the count table once per
# program (so few), the unpermute backward has no prologue (a full 2-D grid, as the forward)
PROGRAMS_PER_SM = {"permute": 4, "unpermute_bwd": 1 << 20}


def geom_choice() -> str:
    """Launch geometry of the v2 kernels, read per call: ``2d`` (default: column splits of the
    fused permute and of the unpermute backward, wide count-table steps) or ``v2`` (the
    one-program-per-chunk geometry of session 3)."""
    v = os.environ.get(GEOM_ENV, "2d").strip().lower() or "2d"
    if v not in GEOMS:
        raise ValueError(f"primus_turbo: {GEOM_ENV} expected one of {GEOMS}, got {v!r}")
    return v


def copy_choice(num_experts: int) -> str:
    """Row copy of the ``2d`` permute forward, read per call: ``gather`` (default: the map
    programs write the inverse map and no rows, then ``gather_rows_kernel`` copies on a
    ``[rows / 8, H / 1024]`` grid at ~32 registers; H200 run 4.2: the fused kernel at 211
    registers holds one 8-warp program per SM, each sub-block a chain of id load -> one-hot
    scan -> row load -> store, 0.52 of copy at Qwen3's 128 experts; v1, which gathers, 0.62-1.01)
    or ``fused`` (the map programs copy their copies' rows, column-split). ``num_experts`` is
    kept for a per-shape choice."""
    del num_experts
    v = os.environ.get(COPY_ENV, "gather").strip().lower() or "gather"
    if v not in COPIES:
        raise ValueError(f"primus_turbo: {COPY_ENV} expected one of {COPIES}, got {v!r}")
    return v


def _int_env(name: str) -> int:
    v = os.environ.get(name, "").strip() or "0"
    if not v.isdigit():
        raise ValueError(f"primus_turbo: {name} expected an integer >= 0, got {v!r}")
    return int(v)


def splits_override() -> int:
    """``PRIMUS_TURBO_MOE_PERMUTE_SPLITS``: 0 or unset = automatic, n >= 1 = at most n column
    splits (an A/B knob of the ``2d`` geometry). ``PRIMUS_TURBO_MOE_PERMUTE_CHUNKS`` (0 =
    automatic) caps the chunk count of the ``2d`` fused permute:
    every program reads the whole ``[chunks, E_PAD]`` count table, so fewer chunks mean less
    L2 traffic and longer per-program walks (the splits restore the parallelism); default 256."""
    return _int_env(SPLITS_ENV)


@functools.lru_cache(maxsize=8)
def _sm_count(dev: torch.device) -> int:
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).multi_processor_count
    return 2  # the interpreter: small, so tiny test shapes get split too


def _splits(dev: torch.device, programs: int, blocks: int, geom: str, kind: str) -> tuple[int, int]:
    """``(splits, blocks_per_split)`` of the column dimension: enough splits to give about
    ``PROGRAMS_PER_SM[kind]`` programs per SM (``programs`` without splits), never an empty
    split."""
    if geom == "v2" or blocks <= 1:
        return 1, max(blocks, 1)
    want = splits_override()
    if want == 0:
        want = -(-PROGRAMS_PER_SM[kind] * _sm_count(dev) // max(programs, 1))
    want = max(1, min(want, blocks))
    per = -(-blocks // want)
    return -(-blocks // per), per


def _block_h(h: int, elem: int) -> int:
    return min(max(triton.next_power_of_2(max(h, 1)), 16), max(MAX_BLOCK_BYTES // elem, 8))


REDUCE_TILE_ENV = "PRIMUS_TURBO_MOE_UNPERMUTE_TILE"
_GRID_Y_MAX = 65535  # CUDA's limit on grid dimension 1
# the unpermute forward's tiles (ROWS, BLOCK_H, warps): 2048 columns x tokens per 4-warp
# program, 1024-wide for top-k below 8 (fewer gathers per token), else 512-wide; the first whose
# width fits H (narrower H: the ``_tile`` default)
UNPERMUTE_TILES = ((2, 1024, 4), (4, 512, 4))


def reduce_tile(h: int, t: int, k: int = 8, unpermute: bool = False) -> tuple[int, int, int, bool]:
    """``(ROWS, BLOCK_H, num_warps, col_fast)`` of ``reduce_v2_kernel``, read per call.

    ``PRIMUS_TURBO_MOE_UNPERMUTE_TILE`` unset (``auto``): for the unpermute forward
    (``unpermute``: weighted, or writing the inverse map) the column blocks on grid axis 0 (a
    token block's columns launch together) on ``UNPERMUTE_TILES``; for the permute backward
    the row-copy tile of ``permute_kernel._tile`` for fp32 accumulation (8 x 512, 8 warps at
    these H) with the token blocks on axis 0. H200, graph, unpermute forward vs copy, ``rows``
    -> column-first: call 12.1 (8 x 512 x 8 warps for top-k 8, 2 x 1024 x 4 for top-k < 8)
    DeepSeek-V3 0.948 -> 0.970, Qwen3-30B-A3B 0.815 -> 0.824, gpt-oss-20b 0.813 -> 0.846,
    Mixtral-8x7B 0.888 -> 0.900; call 12.3 (top-k 8) 0.934 -> 0.956 / 0.800 -> 0.812, with 4 x
    512 x 4 warps 0.960 / 0.819. The permute backward read 0.85 instead of 0.89 on Qwen3 with
    the column-first order (12.1), so it keeps the token-first one. ``rows``: the token-first
    order and ``_tile`` everywhere (the session-11 default). ``"ROWS:BLOCK_H:WARPS"`` (powers
    of two; ``,`` also separates) fixes the tile, a fourth field ``c`` puts the column blocks
    on axis 0. Column-first only where the token blocks fit grid axis 1. An A/B knob."""
    from primus_turbo.triton.moe.permute_kernel import _tile

    v = os.environ.get(REDUCE_TILE_ENV, "").strip().lower() or "auto"
    if v in ("auto", "rows"):
        rows, block, warps = _tile(h, 4, t)
        col_fast = v == "auto" and unpermute
        if col_fast:
            for tile in UNPERMUTE_TILES:
                if h >= tile[1] and (k < 8 or tile[1] <= 512):
                    rows, block, warps = tile
                    break
        return rows, block, warps, col_fast and -(-t // rows) <= _GRID_Y_MAX
    parts = [x.strip() for x in v.replace(":", ",").split(",")]
    nums = parts[:3]
    flag = parts[3] if len(parts) == 4 else ""
    ok = len(parts) in (3, 4) and flag in ("", "c")
    ok = ok and all(x.isdigit() and int(x) > 0 for x in nums)
    if ok:
        rows, block, warps = (int(x) for x in nums)
        ok = all(x & (x - 1) == 0 for x in (rows, block, warps)) and warps <= 32
    if not ok:
        raise ValueError(
            f"primus_turbo: {REDUCE_TILE_ENV} expected 'auto', 'rows' or "
            f"'ROWS:BLOCK_H:WARPS[:c]' (powers of two), got {v!r}"
        )
    col_fast = flag == "c" and -(-t // rows) <= _GRID_Y_MAX
    return rows, block, warps, col_fast
