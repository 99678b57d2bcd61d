"""How the grouped GEMM config tuner times its candidates (``grouped_gemm_kernel._choose``)."""

from __future__ import annotations

import functools

import torch
import triton

from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import _env_choice


@functools.cache
def _tune_min_work() -> int:
    """``M * N * K`` below which the heuristic's config is used untimed (default ``2**30``, about
    2 GFLOP, a few microseconds on an H200): timing compiles every candidate config (seconds
    each), which bought nothing on tiny problems and made the small GPU tests run for minutes.
    ``PRIMUS_TURBO_GROUPED_GEMM_TUNE_MIN_MNK`` overrides it (0: tune every shape)."""
    import os

    raw = os.environ.get("PRIMUS_TURBO_GROUPED_GEMM_TUNE_MIN_MNK", "").strip()
    if not raw:
        return 1 << 30
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(
            "primus_turbo: PRIMUS_TURBO_GROUPED_GEMM_TUNE_MIN_MNK expected a non-negative "
            f"integer (M*N*K; default {1 << 30}), got {raw!r}"
        )
    return value


@functools.cache
def tune_timing() -> str:
    """``PRIMUS_TURBO_GROUPED_GEMM_TUNE_TIMING``: ``rounds`` (default, ``time_rounds``) or
    ``do_bench`` (one ``triton.testing.do_bench`` per candidate, 20 ms each: 3 runs of a
    6 ms DeepSeek-V3 GEMM, which picked a 9 % slower dgrad plan in H200 run 4.2)."""
    return _env_choice("PRIMUS_TURBO_GROUPED_GEMM_TUNE_TIMING", "rounds", ("rounds", "do_bench"))


def time_rounds(cands: list, launch, rounds: int = 3, budget_ms: float = 25.0) -> dict:
    """Per candidate, the best of ``rounds`` interleaved rounds (candidate order rotated each
    round), each the mean of ``n`` back-to-back launches between two events (``n`` from a first
    timed launch: about ``budget_ms`` per round, 2 to 50). Interleaving spreads clock and
    thermal drift over all candidates instead of charging it to the last ones; a candidate
    that fails to compile or launch is dropped."""
    alive, est = [], {}
    for cand in cands:
        try:
            launch(cand)  # compile + first run
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launch(cand)
            end.record()
            end.synchronize()
            est[cand] = max(start.elapsed_time(end), 1e-3)
            alive.append(cand)
        except Exception:  # e.g. out of shared memory for this tile on this chip
            continue
    best = {c: float("inf") for c in alive}
    for r in range(rounds):
        order = alive[r % max(len(alive), 1) :] + alive[: r % max(len(alive), 1)]
        for cand in order:
            n = int(min(50, max(2, budget_ms / est[cand])))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                launch(cand)
            end.record()
            end.synchronize()
            best[cand] = min(best[cand], start.elapsed_time(end) / n)
    return best


def time_candidates(cands: list, launch) -> dict:
    """``{candidate: ms}`` of every candidate that runs, timed as ``tune_timing()`` says."""
    if tune_timing() == "rounds":
        return time_rounds(cands, launch)
    timings = {}
    for cand in cands:
        try:
            timings[cand] = triton.testing.do_bench(
                lambda cand=cand: launch(cand), warmup=5, rep=20, return_mode="median"
            )
        except Exception:  # e.g. out of shared memory for this tile on this chip
            continue
    return timings
