"""Host cost of an eager ``MoELayer`` training step (GPU): is the eager layer launch-bound?

Per case and mode (bf16, fp8 rowwise): the eager step's wall time (N back-to-back steps, one
sync), its GPU time (CUDA graph replay of the same step), the host enqueue time of a forward
and of a step while the GPU is held busy by a ``torch.cuda._sleep`` (so the host never waits
on the device), the kernel launches per step (torch.profiler), and a cProfile of the enqueue
(top functions by own time and cumulative time).

    python3 scripts/layer_host_profile.py --cases Qwen3-30B-A3B DeepSeek-V3 --out host.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark" / "ops" / "training"))

from bench_moe_turbo import GPU_CASES, _fp8_config  # noqa: E402

import primus_turbo.pytorch as turbo  # noqa: E402


def _layer(case, fp8: str, router: str = "fp32"):
    label, t, d, f, e, k, fn, groups, sel = case
    torch.manual_seed(0)
    rdt = torch.float32 if router == "fp32" else None
    layer = turbo.modules.MoELayer(d, f, e, k, score_function=fn, groups=groups,
                                   selected_groups=sel, device="cuda", dtype=torch.bfloat16,
                                   fp8_config=_fp8_config(fp8), router_dtype=rdt)  # fmt: skip
    x = torch.randn(t, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
    return layer, x


def _step(layer, x, g):
    torch.autograd.grad(layer(x), [x, *layer.parameters()], g)


def _fwd(layer, x, g):
    with torch.no_grad():
        layer(x)


def _hold_gpu() -> None:
    """Drain the queue, then keep the GPU busy for ~0.2 s (at ~2 GHz) so that the host's calls
    that follow are timed without ever waiting on the device."""
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)


def _enqueue_ms(fn, n: int) -> float:
    """Host milliseconds per call while the GPU sleeps (the launch queue never blocks)."""
    _hold_gpu()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt * 1e3 / n


def _wall_ms(fn, n: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / n


def _graph_ms(fn, n: int) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def _launches(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _cprofile(fn, n: int, top: int) -> str:
    _hold_gpu()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats("primus_turbo", top * 2)
    st.sort_stats("tottime").print_stats("primus_turbo", top)
    return buf.getvalue()


def _torch_profile(fn, n: int, top: int) -> str:
    """Host time per op across threads (the backward runs on autograd's device thread, which
    cProfile does not see): torch.profiler's CPU ranges, while the GPU sleeps."""
    from torch.profiler import ProfilerActivity, profile

    _hold_gpu()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            fn()
    torch.cuda.synchronize()
    table = prof.key_averages().table(
        sort_by="cpu_time_total", row_limit=top, max_name_column_width=70
    )
    return table


def _measure(case, fp8: str, router: str, args) -> list[str]:
    """One case and mode: the timings line, and with ``--profile`` the cProfile tables."""
    layer, x = _layer(case, fp8, router)
    g = torch.randn_like(x)

    def step():
        _step(layer, x, g)

    def fwd():
        _fwd(layer, x, g)

    for _ in range(3):  # tuners, caches (with and without autograd)
        step()
        fwd()
    torch.cuda.synchronize()
    row = {
        "step wall": _wall_ms(step, args.n),
        "step enqueue": _enqueue_ms(step, args.n),
        "fwd wall": _wall_ms(fwd, args.n),
        "fwd enqueue": _enqueue_ms(fwd, args.n),
    }
    out = []
    try:
        row["step graph"] = _graph_ms(step, args.n)
        row["fwd graph"] = _graph_ms(fwd, args.n)
    except Exception as exc:  # noqa: BLE001
        out.append(f"  graph timing failed: {type(exc).__name__}: {exc}")
    launches = (_launches(fwd), _launches(step))
    text = ", ".join(f"{k} {v:.3f} ms" for k, v in row.items())
    label = f"{case[0]} {fp8} router {router}"
    out.insert(0, f"{label}: {text}; kernels fwd {launches[0]} step {launches[1]}")
    print(out[0], flush=True)
    if args.profile:
        out.append(f"--- cProfile {case[0]} {fp8}: {args.n} steps")
        out.append(_cprofile(step, args.n, args.top))
        out.append(f"--- cProfile {case[0]} {fp8}: {args.n} forwards (no grad)")
        out.append(_cprofile(fwd, args.n, args.top))
    if args.torch_profile:
        out.append(f"--- torch.profiler (CPU) {label}: {args.n} steps")
        out.append(_torch_profile(step, args.n, args.top))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cases", nargs="+", default=["Qwen3-30B-A3B", "DeepSeek-V3 (EP8)"])
    p.add_argument("--fp8", nargs="+", default=["off", "rowwise"])
    p.add_argument(
        "--router-dtype",
        nargs="+",
        default=["fp32"],
        choices=["fp32", "none"],
        help="MoELayer(router_dtype=torch.float32 | None)",
    )
    p.add_argument("--n", type=int, default=5)
    p.add_argument("--top", type=int, default=35)
    p.add_argument("--profile", action="store_true", help="print cProfile tables")
    p.add_argument(
        "--torch-profile",
        action="store_true",
        help="print torch.profiler's host time per op (every thread)",
    )
    p.add_argument("--out", default=None)
    args = p.parse_args()
    lines = [f"torch {torch.__version__}, {torch.cuda.get_device_name()}"]
    cases = [c for c in GPU_CASES if any(c[0].startswith(n) for n in args.cases)]
    for case in cases:
        for fp8 in args.fp8:
            for router in args.router_dtype:
                lines += _measure(case, fp8, router, args)
                torch.cuda.empty_cache()
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
