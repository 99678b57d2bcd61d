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
    """``PRIMUS_TURBO_GROUPED_GEMM_TUNE_TIMING``: ``flushed`` (default since session 13,
    ``time_flushed``: cold-L2 device time, what the benchmarks measure), ``rounds``
    (``time_rounds``: back-to-back launches on a warm L2, the default before; it ranked plans
    differently from the graph timing on several keys, hence the large-expert rules of sessions
    8 and 11) or ``do_bench`` (one ``triton.testing.do_bench`` per candidate, 20 ms each: 3 runs
    of a 6 ms DeepSeek-V3 GEMM, which picked a 9 % slower dgrad plan in H200 run 4.2). H200
    call 13.4, bf16 op forward vs torch._grouped_mm, geomean of 8 cases: 1.057 / 1.058 with
    ``flushed`` (the second with the mid-size forward rule off: the tuner then found the rule's
    plan itself on gpt-oss-20b) vs 1.051-1.055 with ``rounds``; Qwen3-30B-A3B 1.093-1.098 /
    1.132 vs 1.079-1.086 / 1.094-1.120."""
    return _env_choice(
        "PRIMUS_TURBO_GROUPED_GEMM_TUNE_TIMING", "flushed", ("flushed", "rounds", "do_bench")
    )


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


# L2 of the largest GPU we time on (H200: 50 MB; MI300X: 256 MB of Infinity Cache) rounded up
_FLUSH_BYTES = 256 << 20
# GPU cycles of the idle kernel queued after each flush (~1 ms at 1.98 GHz): the host enqueues
# the timed launches meanwhile, so Python / launch overhead stays out of the sample
_SLACK_CYCLES = 2_000_000


def time_flushed(cands: list, launch, rounds: int = 3, samples: int = 3) -> dict:
    """Per candidate, the best of ``rounds`` interleaved rounds (order rotated) of the median of
    ``samples`` single launches, each after an L2 flush and an idle kernel that covers the
    host's enqueue time: device time with cold caches, what the benchmarks' graph timing
    measures (``time_rounds`` times back-to-back launches on a warm L2, where host overhead and
    L2 reuse between launches count). A candidate that fails to compile or launch is dropped;
    without 256 MB free for the flush buffer it falls back to ``time_rounds``."""
    alive = []
    for cand in cands:
        try:
            launch(cand)  # compile + first run
            alive.append(cand)
        except Exception:  # e.g. out of shared memory for this tile on this chip
            continue
    if not alive:
        return {}
    torch.cuda.synchronize()
    try:
        scratch = torch.empty(_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    except torch.cuda.OutOfMemoryError:  # no room for the flush buffer: warm timing instead
        return time_rounds(alive, launch)
    best = {c: float("inf") for c in alive}
    for r in range(rounds):
        order = alive[r % len(alive) :] + alive[: r % len(alive)]
        events = {c: [] for c in order}
        for cand in order:
            for _ in range(samples):
                scratch.zero_()
                torch.cuda._sleep(_SLACK_CYCLES)
                pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                pair[0].record()
                launch(cand)
                pair[1].record()
                events[cand].append(pair)
        torch.cuda.synchronize()
        for cand, pairs in events.items():
            times = sorted(s.elapsed_time(e) for s, e in pairs)
            best[cand] = min(best[cand], times[len(times) // 2])
    return best


def time_candidates(cands: list, launch) -> dict:
    """``{candidate: ms}`` of every candidate that runs, timed as ``tune_timing()`` says."""
    if tune_timing() == "rounds":
        return time_rounds(cands, launch)
    if tune_timing() == "flushed":
        return time_flushed(cands, launch)
    timings = {}
    for cand in cands:
        try:
            timings[cand] = triton.testing.do_bench(
                lambda cand=cand: launch(cand), warmup=5, rep=20, return_mode="median"
            )
        except Exception:  # e.g. out of shared memory for this tile on this chip
            continue
    return timings
