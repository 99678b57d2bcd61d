"""The one shared benchmark harness: device facts, timing, correctness metrics, CSV/markdown output.

Benchmark scripts only build inputs and state their FLOP/byte formulas; everything else lives here:

* :func:`device_info` -- platform (CUDA/ROCm/CPU), short GPU name, torch/triton versions, date.
* :func:`time_ms` -- ``(median_ms, stddev_ms)`` of one callable: ``triton.testing.do_bench`` on a
  GPU (CUDA events, L2 flushed before every call), a ``perf_counter`` loop on CPU.
* :func:`bench_modes` -- forward / backward / step timings of one autograd op (backward is
  ``out.backward(grad, retain_graph=True)`` timed alone, input grads reset to ``None`` before each
  call so no gradient-accumulation kernel is timed).
* Timing mode (``--timing`` / ``PRIMUS_TURBO_BENCH_TIMING``): ``eager`` times each call as
  launched from Python; ``graph`` captures the call once in a CUDA graph and times its replays
  (same L2 flush before each), so host launch and Python overhead are excluded from both sides:
  the device time of the op's kernels. A call that cannot be captured falls back to eager and
  the row's ``Timing`` column says so.
* :func:`time_loop_ms` -- wall clock of ``iters`` back-to-back calls between two synchronisations
  (the engine of ``quick_test_bench.py``; do not compare its numbers with :func:`time_ms`).
* :func:`compute_snr`, :func:`check_allclose` -- chunked fp64 correctness metrics.
* :class:`Results` -- tidy CSV (one row per measured case; numbers stay numbers) plus the
  ``Platform, GPU, torch, triton, date`` columns, and a markdown table printer.
* :func:`geomean`, :func:`tflops`, :func:`gbps`, :func:`shard`, :func:`add_common_args`.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import enum
import functools
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import torch

# bench_modes times the backward as ``out.backward(grad, retain_graph=True)`` on one saved forward.
# torch.compile'd peers otherwise compile their backward with donated buffers, which refuses
# retain_graph ("compiled with non-empty donated buffers ..."); donation saves memory, not time.
try:
    import torch._functorch.config as _functorch_config

    _functorch_config.donated_buffer = False
except (ImportError, AttributeError):  # older torch: no donation, nothing to turn off
    pass

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"

# Correctness gates shared by every benchmark (DESIGN.md section 7, primus_api.md section 5).
# allclose tolerances are applied after dividing both tensors by the reference's abs-max, so one
# tolerance works for any K (outputs grow like sqrt(K)); see check_allclose.
ALLCLOSE_TOL: dict[torch.dtype, float] = {
    torch.float32: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 1e-2,
}
# SNR (dB) that every compared tensor must exceed. bf16 rounding of an exactly computed result
# alone gives ~55 dB against an fp32 reference (fp16: ~65 dB); 35 dB leaves room for fp32
# accumulation-order differences at large K while any real bug (a dropped K tile, a wrong
# stride) lands far below 20 dB. fp8/fp4 values follow the upstream benchmark gates.
SNR_THRESHOLD_DB: dict[str, float] = {
    "fp32": 60.0,
    "bf16": 35.0,
    "fp16": 35.0,
    "fp8_e4m3": 25.0,
    "fp8_e5m2": 20.0,
    "fp4": 10.0,
}

_CHUNK = 1 << 24  # elements per chunk for fp64 metrics (128 MiB of fp64 per operand)

T = TypeVar("T")


# ------------------------------------------------------------------------------------------
# Device facts
# ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """Where the benchmark runs. ``gpu`` is the short name used in file names ("H200")."""

    device: torch.device
    platform: str  # "CUDA", "ROCm" or "CPU"
    gpu: str  # "H200", "MI300X", ... or "cpu"
    device_name: str  # full name reported by the driver
    torch_version: str
    triton_version: str
    date: str  # YYYY-MM-DD

    @property
    def is_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def date_compact(self) -> str:
        return self.date.replace("-", "")

    def columns(self) -> dict[str, str]:
        """The metadata columns every CSV row carries."""
        return {
            "Platform": self.platform,
            "GPU": self.gpu,
            "torch": self.torch_version,
            "triton": self.triton_version,
            "date": self.date,
        }

    def banner(self) -> str:
        return (
            f"device: {self.device_name} ({self.platform}, {self.device}) | torch "
            f"{self.torch_version} | triton {self.triton_version} | {self.date}"
        )


_GPU_NAME_RE = re.compile(r"(MI\d+[A-Z]*|GB\d+|[HBA]\d{2,3}[A-Z]*|L40S?|RTX ?\d+\w*)", re.I)


def short_gpu_name(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"H200"``, ``"AMD Instinct MI300X"`` -> ``"MI300X"``."""
    match = _GPU_NAME_RE.search(name)
    short = match.group(1) if match else (name.split()[-1] if name.split() else "gpu")
    return re.sub(r"[^A-Za-z0-9_.-]", "", short.replace(" ", "")) or "gpu"


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except Exception:  # triton is optional for CPU-only baselines
        return "none"


@functools.cache
def device_info(force_cpu: bool = False) -> DeviceInfo:
    """Facts about the benchmark device: the current GPU, or the CPU when there is none."""
    today = datetime.date.today().isoformat()
    if torch.cuda.is_available() and not force_cpu:
        name = torch.cuda.get_device_name(torch.cuda.current_device())
        platform = "ROCm" if torch.version.hip is not None else "CUDA"
        device = torch.device("cuda", torch.cuda.current_device())
        gpu = short_gpu_name(name)
    else:
        import platform as _platform

        name = _platform.processor() or _platform.machine() or "cpu"
        platform, device, gpu = "CPU", torch.device("cpu"), "cpu"
    return DeviceInfo(device, platform, gpu, name, torch.__version__, _triton_version(), today)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------
class Timing(NamedTuple):
    median_ms: float
    stddev_ms: float


NAN_TIMING = Timing(math.nan, math.nan)

GPU_WARMUP_MS, GPU_REP_MS = 50.0, 200.0  # twice do_bench's defaults: steadier medians
CPU_WARMUP_MS, CPU_REP_MS = 5.0, 25.0  # CPU runs only exercise code paths; keep them short


def default_budget(device: torch.device) -> tuple[float, float]:
    """``(warmup_ms, rep_ms)`` defaults for ``device``."""
    return (GPU_WARMUP_MS, GPU_REP_MS) if device.type == "cuda" else (CPU_WARMUP_MS, CPU_REP_MS)


def _summary(times_ms: Sequence[float]) -> Timing:
    med = statistics.median(times_ms)
    std = statistics.stdev(times_ms) if len(times_ms) > 1 else 0.0
    return Timing(float(med), float(std))


def _reset_grads(tensors: Sequence[torch.Tensor] | None) -> None:
    for t in tensors or ():
        t.grad = None


def _cpu_time(
    fn: Callable[[], Any],
    warmup_ms: float,
    rep_ms: float,
    grad_to_none: Sequence[torch.Tensor] | None,
    min_rep: int = 3,
    max_rep: int = 10_000,
) -> list[float]:
    """Per-call perf_counter times, sized like do_bench (estimate, then fill the budgets)."""
    _reset_grads(grad_to_none)
    fn()
    t0 = time.perf_counter()
    for _ in range(3):
        _reset_grads(grad_to_none)
        fn()
    estimate_ms = max((time.perf_counter() - t0) * 1e3 / 3, 1e-6)
    for _ in range(max(1, min(max_rep, int(warmup_ms / estimate_ms)))):
        _reset_grads(grad_to_none)
        fn()
    times = []
    for _ in range(max(min_rep, min(max_rep, int(rep_ms / estimate_ms)))):
        _reset_grads(grad_to_none)
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return times


TIMING_MODES = ("eager", "graph")
_TIMING = {"mode": None, "fallbacks": 0}  # mode None: PRIMUS_TURBO_BENCH_TIMING at first use


def _env_timing() -> str:
    mode = os.environ.get("PRIMUS_TURBO_BENCH_TIMING", "").strip().lower() or "eager"
    if mode not in TIMING_MODES:
        raise ValueError(f"PRIMUS_TURBO_BENCH_TIMING expected one of {TIMING_MODES}, got {mode!r}")
    return mode


def set_timing(mode: str) -> None:
    """Select ``eager`` or ``graph`` timing for every later :func:`time_ms` call on a GPU."""
    if mode not in TIMING_MODES:
        raise ValueError(f"timing mode must be one of {TIMING_MODES}, got {mode!r}")
    _TIMING["mode"] = mode


def timing_mode() -> str:
    if _TIMING["mode"] is None:
        _TIMING["mode"] = _env_timing()
    return _TIMING["mode"]


class _SetTiming(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        set_timing(values)


_BENCH_STREAM: dict[int, torch.cuda.Stream] = {}


def bench_stream() -> torch.cuda.Stream:
    """The one non-default stream a graph-timed benchmark process runs on (see
    :func:`use_bench_stream`)."""
    dev = torch.cuda.current_device()
    if dev not in _BENCH_STREAM:
        _BENCH_STREAM[dev] = torch.cuda.Stream()
    return _BENCH_STREAM[dev]


def use_bench_stream() -> None:
    """Make :func:`bench_stream` the current stream of the process (graph timing only).

    Autograd records the current stream in a leaf's AccumulateGrad node when the node is made
    (first forward that uses the leaf); a backward captured on another stream must then sync
    with that stream, which invalidates the capture (H200, sessions 3 and 4: any forward made
    before the timing -- the correctness check, a peer -- kept such a node alive on the default
    stream). With every forward, warm-up and capture on one stream there is nothing to sync."""
    if torch.cuda.is_available():
        s = bench_stream()
        s.wait_stream(torch.cuda.default_stream())
        torch.cuda.set_stream(s)


def _graph_times(
    fn: Callable[[], Any], warmup: float, rep: float, grad_to_none: Sequence[torch.Tensor] | None
) -> list[float]:
    """do_bench samples of replaying ``fn`` captured once in a CUDA graph, warmed up and captured
    on :func:`bench_stream` (not the legacy default stream, as capture requires). Raises whatever
    capture raises."""
    graph = None
    try:
        graph = _capture(fn, grad_to_none)
        with torch.cuda.stream(bench_stream()):
            return _replay_times(graph, warmup, rep, bench_stream())
    finally:
        del graph
        _reset_grads(grad_to_none)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the graph's private pool; failed captures leaked 130 GB


# GPU cycles of the idle kernel queued between the L2 flush and each timed replay (~0.1 ms at
# 2 GHz): the events then bracket device work only, even when a busy host (the other lane's
# pytest compiles, run 5.1) is slow to launch the replay after recording the start event.
_LAUNCH_SLACK_CYCLES = 200_000


def _replay_times(graph, warmup: float, rep: float, stream) -> list[float]:
    """do_bench's sampling (L2 flushed before each sample, ``warmup``/``rep`` in ms) of
    ``graph.replay()``, with an idle kernel ahead of each start event so host launch latency is
    never counted as device time."""
    from triton import runtime

    driver = runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(5):
        driver.clear_cache(cache)
        graph.replay()
    end.record(stream)
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup / estimate_ms))):
        graph.replay()
    n = max(1, int(rep / estimate_ms))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends, strict=True):
        driver.clear_cache(cache)
        torch.cuda._sleep(_LAUNCH_SLACK_CYCLES)
        s.record(stream)
        graph.replay()
        e.record(stream)
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def _graph_or_none(fn, warmup, rep, grad_to_none) -> list[float] | None:
    """Graph samples, or ``None`` after a failed capture. A failed capture can leave CUDA state
    (the RNG's capture bookkeeping) unusable for later captures, so graph timing is switched off
    for the rest of the process and every later call is timed eagerly."""
    try:
        return _graph_times(fn, warmup, rep, grad_to_none)
    except Exception as e:  # noqa: BLE001 -- any capture failure means "time it eagerly"
        _TIMING["fallbacks"] += 1
        _TIMING["mode"] = "eager"
        torch.cuda.synchronize()
        print(
            f"[harness] CUDA graph capture failed ({type(e).__name__}: {str(e)[:160]}); "
            "this and every later timing in this process are eager"
        )
        return None


def time_ms(
    fn: Callable[[], Any],
    warmup: float | None = None,
    rep: float | None = None,
    *,
    device: torch.device | None = None,
    grad_to_none: Sequence[torch.Tensor] | None = None,
) -> Timing:
    """``(median_ms, stddev_ms)`` of ``fn()``.

    Args:
        fn: the callable to time (no arguments).
        warmup, rep: warm-up and measurement budgets in milliseconds (as in ``do_bench``);
            default per device (:func:`default_budget`).
        device: where ``fn`` runs; default the benchmark device.
        grad_to_none: tensors whose ``.grad`` is reset before every call.

    On a GPU this is ``triton.testing.do_bench(..., return_mode="all")`` (CUDA/HIP events, L2
    flushed before every call); the median of those samples is exactly what
    ``return_mode="median"`` returns, and one run gives the stddev as well. On CPU it is a
    ``perf_counter`` loop with the same warm-up/repetition sizing.
    """
    device = device if device is not None else device_info().device
    dw, dr = default_budget(device)
    warmup = dw if warmup is None else warmup
    rep = dr if rep is None else rep
    if device.type == "cuda":
        import triton.testing

        times = None
        if timing_mode() == "graph":
            times = _graph_or_none(fn, warmup, rep, grad_to_none)
        if times is None:
            times = triton.testing.do_bench(
                fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none, return_mode="all"
            )
    else:
        times = _cpu_time(fn, warmup, rep, grad_to_none)
    return _summary(times)


def time_loop_ms(
    fn: Callable[[], Any],
    iters: int,
    device: torch.device,
    grad_to_none: Sequence[torch.Tensor] | None = None,
) -> float:
    """Mean ms per call of ``iters`` back-to-back calls, timed by ``perf_counter`` between two
    synchronisations (the launch queue stays full, as in a training loop)."""
    synchronize(device)
    t = time.perf_counter()
    for _ in range(iters):
        _reset_grads(grad_to_none)
        fn()
    synchronize(device)
    return (time.perf_counter() - t) * 1e3 / iters


class Mode(enum.Enum):
    """What one timing covers."""

    FWD = "fwd"  # the forward call, autograd graph recorded (as in training)
    BWD = "bwd"  # out.backward(grad, retain_graph=True) alone, on a saved forward
    STEP = "step"  # forward + backward in one timed call


def bench_modes(
    fwd: Callable[[], torch.Tensor],
    grad_out: torch.Tensor | None,
    leaves: Sequence[torch.Tensor],
    modes: Iterable[Mode] = (Mode.FWD, Mode.BWD),
    warmup: float | None = None,
    rep: float | None = None,
    device: torch.device | None = None,
) -> dict[Mode, Timing]:
    """Time ``fwd`` in each requested mode.

    Args:
        fwd: builds the output from the (captured) inputs; called under ``enable_grad``.
        grad_out: gradient of the output (same shape); needed for BWD and STEP.
        leaves: the inputs that receive gradients; their ``.grad`` is reset before each call.
    """
    out_timings: dict[Mode, Timing] = {}
    dev = device if device is not None else device_info().device
    modes = tuple(modes)
    if dev.type == "cuda" and timing_mode() == "graph" and Mode.BWD in modes:
        graphed = _graph_bwd(fwd, grad_out, leaves, modes, warmup, rep, dev)
        if graphed is not None:
            return graphed
        return bench_modes(fwd, grad_out, leaves, modes, warmup, rep, device)  # now eager
    with torch.enable_grad():
        for mode in modes:
            if mode is Mode.FWD:
                out_timings[mode] = time_ms(fwd, warmup, rep, device=device)
            elif mode is Mode.BWD:
                assert grad_out is not None, "BWD mode needs grad_out"
                out = fwd()

                def _bwd(out: torch.Tensor = out) -> None:
                    out.backward(grad_out, retain_graph=True)

                out_timings[mode] = time_ms(_bwd, warmup, rep, device=device, grad_to_none=leaves)
                del out
            elif mode is Mode.STEP:
                assert grad_out is not None, "STEP mode needs grad_out"

                def _step() -> None:
                    fwd().backward(grad_out)

                out_timings[mode] = time_ms(_step, warmup, rep, device=device, grad_to_none=leaves)
    _reset_grads(leaves)
    return out_timings


def _graph_bwd(fwd, grad_out, leaves, modes, warmup, rep, device) -> dict[Mode, Timing] | None:
    """Graph timing of FWD/BWD/STEP: a captured backward needs its forward in the same capture,
    so BWD is STEP minus FWD. ``None`` when either capture fails (the caller times eagerly).

    The captured step computes the input gradients with ``torch.autograd.grad`` instead of
    ``.backward()`` (no ``.grad`` accumulation inside the graph), and every forward of a
    graph-timed process runs on :func:`bench_stream` so that the leaves' AccumulateGrad nodes
    belong to the capture stream (see :func:`use_bench_stream`). The eager BWD mode resets
    ``.grad`` to ``None`` before each call, so it does no
    accumulation work either: both modes time the same kernels."""
    assert grad_out is not None, "BWD mode needs grad_out"
    dw, dr = default_budget(device)
    warmup = dw if warmup is None else warmup
    rep = dr if rep is None else rep
    inputs = [t for t in leaves if t.requires_grad]

    def _step() -> None:
        torch.autograd.grad(fwd(), inputs, grad_out, allow_unused=True)

    with torch.enable_grad():
        t_fwd = _graph_or_none(fwd, warmup, rep, leaves)
        t_step = _graph_or_none(_step, warmup, rep, leaves) if t_fwd is not None else None
    _reset_grads(leaves)
    if t_fwd is None or t_step is None:
        return None
    f, st = _summary(t_fwd), _summary(t_step)
    out = {
        Mode.FWD: f,
        Mode.STEP: st,
        Mode.BWD: Timing(
            max(st.median_ms - f.median_ms, 1e-6), math.hypot(st.stddev_ms, f.stddev_ms)
        ),
    }
    return {m: out[m] for m in modes}


def _capture(fn: Callable[[], Any], grad_to_none: Sequence[torch.Tensor] | None):
    """``fn`` warmed up and captured on :func:`bench_stream` -> the CUDA graph."""
    stream = bench_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            _reset_grads(grad_to_none)
            fn()
        _reset_grads(grad_to_none)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    return graph


def _graph_pair(ours, peer, grad_out, modes, warmup, rep):
    """Graph timing of both sides with their replays interleaved sample by sample (ABBA over
    ours/peer, each sample after an L2 flush and an idle kernel), so clock and power drift reach
    both sides alike: the 4-round pairing read 0.95-1.06 between identical cuBLAS calls (run
    5.2). FWD and STEP graphs per side, BWD = STEP - FWD. ``None`` when a capture fails."""
    from triton import runtime

    driver = runtime.driver.active
    sides = []
    try:
        with torch.enable_grad():
            for fwd, leaves in (ours, peer):
                inputs = [t for t in leaves if t.requires_grad]
                graphs = {Mode.FWD: _capture(fwd, leaves)}
                if any(m is not Mode.FWD for m in modes):
                    assert grad_out is not None, "BWD/STEP modes need grad_out"

                    def _step(fwd=fwd, inputs=inputs) -> None:
                        torch.autograd.grad(fwd(), inputs, grad_out, allow_unused=True)

                    graphs[Mode.STEP] = _capture(_step, leaves)
                sides.append(graphs)
    except Exception as e:  # noqa: BLE001 -- any capture failure means "time the old way"
        torch.cuda.synchronize()
        print(f"[harness] paired graph capture failed ({type(e).__name__}: {str(e)[:160]})")
        return None
    stream = bench_stream()
    cache = driver.get_empty_cache_for_benchmark()
    keys = [(i, m) for m in sides[0] for i in range(2)]
    samples: dict[tuple[int, Mode], list[float]] = {k: [] for k in keys}
    with torch.cuda.stream(stream):
        t0 = time.perf_counter()
        for k in keys:  # estimate one round (flush + sleep + replay of each graph)
            driver.clear_cache(cache)
            torch.cuda._sleep(_LAUNCH_SLACK_CYCLES)
            sides[k[0]][k[1]].replay()
        torch.cuda.synchronize()
        round_ms = max((time.perf_counter() - t0) * 1e3, 1e-3)
        for _ in range(max(1, int(warmup / round_ms))):
            for k in keys:
                sides[k[0]][k[1]].replay()
        n = max(8, int(rep * len(keys) / 2 / round_ms))
        events = []
        for r in range(n):
            for k in keys if r % 2 == 0 else keys[::-1]:
                driver.clear_cache(cache)
                torch.cuda._sleep(_LAUNCH_SLACK_CYCLES)
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record(stream)
                sides[k[0]][k[1]].replay()
                e.record(stream)
                events.append((k, s, e))
        torch.cuda.synchronize()
    for k, s, e in events:
        samples[k].append(s.elapsed_time(e))
    for graphs in sides:
        graphs.clear()
    for side in (ours, peer):
        _reset_grads(side[1])
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    result = []
    for i in range(2):
        f = _summary(samples[(i, Mode.FWD)])
        out = {Mode.FWD: f}
        if (i, Mode.STEP) in samples:
            st = _summary(samples[(i, Mode.STEP)])
            out[Mode.STEP] = st
            out[Mode.BWD] = Timing(
                max(st.median_ms - f.median_ms, 1e-6), math.hypot(st.stddev_ms, f.stddev_ms)
            )
        result.append({m: out[m] for m in modes})
    return result[0], result[1]


def bench_pair(
    ours: tuple[Callable[[], torch.Tensor], Sequence[torch.Tensor]],
    peer: tuple[Callable[[], torch.Tensor], Sequence[torch.Tensor]],
    grad_out: torch.Tensor | None,
    modes: Iterable[Mode] = (Mode.FWD, Mode.BWD),
    rounds: int = 4,
    warmup: float | None = None,
    rep: float | None = None,
    device: torch.device | None = None,
) -> tuple[dict[Mode, Timing], dict[Mode, Timing]]:
    """Time our op and the peer in alternating rounds, in ABBA order (ours, peer, peer, ours, ...).

    Clock and thermal drift then reach both alike instead of biasing whichever ran second, and
    neither side always runs first after the other's load (a fixed order showed up to 5%
    spread between two sides running the very same cuBLAS kernel). Each side's figure per mode
    is the median over rounds of the per-round medians; the budget ``rep`` is split over the
    rounds. ``ours``/``peer`` are ``(fwd, leaves)`` as for :func:`bench_modes`.
    """
    modes = tuple(modes)
    device = device if device is not None else device_info().device
    dw, dr = default_budget(device)
    warmup = dw if warmup is None else warmup
    if device.type == "cuda" and timing_mode() == "graph":
        paired = _graph_pair(ours, peer, grad_out, modes, warmup, dr if rep is None else rep)
        if paired is not None:
            return paired
    rep_each = (dr if rep is None else rep) / max(rounds, 1)
    runs: tuple[dict[Mode, list[Timing]], dict[Mode, list[Timing]]] = ({}, {})
    for r in range(max(rounds, 1)):
        order = ((runs[0], ours), (runs[1], peer))
        for side, (fwd, leaves) in order if r % 2 == 0 else order[::-1]:
            for mode, t in bench_modes(
                fwd, grad_out, leaves, modes, warmup, rep_each, device
            ).items():
                side.setdefault(mode, []).append(t)

    def _combine(side: dict[Mode, list[Timing]]) -> dict[Mode, Timing]:
        return {
            m: Timing(
                statistics.median(t.median_ms for t in ts),
                statistics.median(t.stddev_ms for t in ts),
            )
            for m, ts in side.items()
        }

    return _combine(runs[0]), _combine(runs[1])


def tflops(flops: float, ms: float) -> float:
    """``flops / (ms * 1e-3) / 1e12``; NaN for a missing or zero time."""
    if not (ms > 0) or math.isnan(ms):
        return math.nan
    return flops / (ms * 1e-3) / 1e12


def gbps(nbytes: float, ms: float) -> float:
    """``nbytes / (ms * 1e-3) / 1e9``; NaN for a missing or zero time."""
    if not (ms > 0) or math.isnan(ms):
        return math.nan
    return nbytes / (ms * 1e-3) / 1e9


def ratio(x: float, y: float) -> float:
    """``x / y`` or NaN when either side is missing or ``y`` is zero."""
    if math.isnan(x) or math.isnan(y) or y == 0:
        return math.nan
    return x / y


# ------------------------------------------------------------------------------------------
# Correctness metrics
# ------------------------------------------------------------------------------------------
def _chunks(x: torch.Tensor) -> Iterable[torch.Tensor]:
    flat = x.detach().reshape(-1)
    for i in range(0, flat.numel(), _CHUNK):
        yield flat[i : i + _CHUNK]


def compute_snr(ref: torch.Tensor, out: torch.Tensor) -> float:
    """``10 * log10(||ref||^2 / ||ref - out||^2)`` in dB, accumulated in fp64 (chunked).

    ``inf`` when the tensors are equal, ``nan`` when the reference is all zeros and they differ.
    """
    if ref.shape != out.shape:
        raise ValueError(f"compute_snr: shapes differ: {tuple(ref.shape)} vs {tuple(out.shape)}")
    signal = noise = 0.0
    for r, o in zip(_chunks(ref), _chunks(out), strict=True):
        r64 = r.to(torch.float64)
        signal += float(r64.square().sum())
        noise += float((r64 - o.to(torch.float64)).square().sum())
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return math.nan
    return 10.0 * math.log10(signal / noise)


def check_allclose(
    out: torch.Tensor,
    ref: torch.Tensor,
    dtype: torch.dtype,
    rtol: float | None = None,
    atol: float | None = None,
) -> bool:
    """``allclose(out / s, ref / s)`` with ``s = max|ref|`` and the :data:`ALLCLOSE_TOL` of
    ``dtype`` (the input precision), so the gate does not depend on the output's magnitude."""
    if out.shape != ref.shape:
        return False
    tol = ALLCLOSE_TOL.get(dtype, 1e-2)
    rtol = tol if rtol is None else rtol
    atol = tol if atol is None else atol
    scale = max((float(c.abs().max()) for c in _chunks(ref) if c.numel()), default=0.0) or 1.0
    for o, r in zip(_chunks(out), _chunks(ref), strict=True):
        o32 = o.to(torch.float32) / scale
        r32 = r.to(torch.float32) / scale
        if not torch.allclose(o32, r32, rtol=rtol, atol=atol):
            return False
    return True


# ------------------------------------------------------------------------------------------
# Aggregates and sharding
# ------------------------------------------------------------------------------------------
def geomean(values: Iterable[float]) -> float:
    """Geometric mean of the finite positive values; NaN when there are none."""
    ok = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    logs = [math.log(v) for v in ok]
    return math.exp(sum(logs) / len(logs)) if logs else math.nan


def shard(items: Sequence[T], num_shards: int, shard_id: int) -> list[tuple[int, T]]:
    """``(1-based id, item)`` pairs of shard ``shard_id`` (round-robin over the full list, so ids
    stay stable across shard counts)."""
    if num_shards < 1:
        raise ValueError(f"--num-shards expected >= 1, got {num_shards}")
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"--shard-id expected in [0, {num_shards}), got {shard_id}")
    return [(i + 1, x) for i, x in enumerate(items) if i % num_shards == shard_id]


def output_path(
    output: str | None, default_name: str, num_shards: int = 1, shard_id: int = 0
) -> Path:
    """``output`` if given, else ``benchmark/results/<default_name>``; shards append
    ``.part-<i>`` before the suffix."""
    path = Path(output) if output else RESULTS_DIR / default_name
    if num_shards > 1:
        path = path.with_name(f"{path.stem}.part-{shard_id}{path.suffix or '.csv'}")
    return path


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """Flags every benchmark script shares."""
    parser.add_argument("-o", "--output", default=None, help="output CSV path")
    parser.add_argument("--num-shards", type=int, default=1, help="split the cases (default 1)")
    parser.add_argument("--shard-id", type=int, default=0, help="this shard, in [0, num-shards)")
    parser.add_argument(
        "--profile",
        choices=("gpu", "cpu"),
        default=None,
        help="shape set and device; default: gpu when a GPU is visible, else cpu",
    )
    parser.add_argument(
        "--timing",
        choices=TIMING_MODES,
        default=None,
        action=_SetTiming,
        help="eager: time calls as launched from Python (default); graph: replay a CUDA graph of "
        "the call (device time, host overhead excluded); env PRIMUS_TURBO_BENCH_TIMING",
    )
    parser.add_argument("--warmup-ms", type=float, default=None, help="warm-up budget per timing")
    parser.add_argument("--rep-ms", type=float, default=None, help="measurement budget per timing")


def resolve_profile(profile: str | None) -> tuple[str, DeviceInfo]:
    """``(profile, device info)``; the cpu profile runs on the CPU even when a GPU is present."""
    if profile is None:
        profile = "gpu" if torch.cuda.is_available() else "cpu"
    if profile == "gpu" and not torch.cuda.is_available():
        raise SystemExit("--profile gpu: no GPU is visible (torch.cuda.is_available() is False)")
    if profile == "gpu" and timing_mode() == "graph":
        use_bench_stream()
    if profile == "cpu":
        # Tiny CPU GEMMs on a shared machine: OpenMP workers spin against other processes and
        # a 64^3 matmul takes 20 ms instead of 0.2 ms. One thread keeps the smoke run fast.
        torch.set_num_threads(int(os.environ.get("BENCH_CPU_THREADS", "1")))
    return profile, device_info(force_cpu=profile == "cpu")


def cpu_notice(info: DeviceInfo) -> str | None:
    if info.is_gpu:
        return None
    return (
        "NOTE: CPU profile -- tiny shapes on the CPU. These numbers exercise the code paths and "
        "are NOT performance figures."
    )


# ------------------------------------------------------------------------------------------
# Results: tidy CSV and markdown
# ------------------------------------------------------------------------------------------
def _csv_value(v: Any) -> Any:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return repr(v)  # "nan" / "inf": float() and pandas parse both
        return float(f"{v:.6g}")
    if isinstance(v, enum.Enum):
        return v.value
    return v


class Results:
    """Rows of one benchmark run. Each row is one measured case; numbers stay ints/floats (NaN
    for "not measured"), text columns stay text. The device metadata columns are appended."""

    def __init__(self, info: DeviceInfo) -> None:
        self.info = info
        self.rows: list[dict[str, Any]] = []
        self._fallbacks_seen = _TIMING["fallbacks"]

    def add(self, row: dict[str, Any]) -> dict[str, Any]:
        if self.info.is_gpu and "Timing" not in row:
            fell_back = _TIMING["fallbacks"] > self._fallbacks_seen
            self._fallbacks_seen = _TIMING["fallbacks"]
            mode = timing_mode()
            row = {**row, "Timing": "eager (graph capture failed)" if fell_back else mode}
        full = {**row, **self.info.columns()}
        self.rows.append(full)
        return full

    def columns(self) -> list[str]:
        cols: list[str] = []
        for row in self.rows:
            cols.extend(c for c in row if c not in cols)
        return cols

    def write_csv(self, path: str | os.PathLike[str]) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        cols = self.columns()
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=cols, restval="nan")
            writer.writeheader()
            for row in self.rows:
                writer.writerow({k: _csv_value(v) for k, v in row.items()})
        return path

    def markdown(self, columns: Sequence[str] | None = None) -> str:
        return markdown_table(self.rows, columns or self.columns())

    def column(self, name: str, where: Callable[[dict[str, Any]], bool] | None = None) -> list:
        return [r.get(name, math.nan) for r in self.rows if where is None or where(r)]


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, float):
        return str(v)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    a = abs(v)
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A GitHub markdown table of ``columns`` (missing cells print as ``-``)."""
    head = "| " + " | ".join(columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_fmt(r[c]) if c in r else "-" for c in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])
