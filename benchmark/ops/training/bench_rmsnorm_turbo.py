"""RMSNorm benchmark: ``turbo.ops.rmsnorm`` on each backend (TURBO = C++ kernels, TRITON, TORCH)
vs ``torch.compile`` of the fp32 reference and vs device copy bandwidth, in GB/s.

Shapes: the issue's 16384x8192 and 8192x2880 bf16, plus model hidden sizes at 8192 tokens. Bytes
(read + written): forward reads x and writes y (``2MN`` elements, plus w and the fp32 rstd);
backward reads x and dy and writes dx (``3MN``, plus w, rstd, dw). The copy figure is
``Tensor.copy_`` of an ``[M, N]`` tensor (``2MN`` elements moved), timed in the same run; the
targets are >= 0.9x copy and >= torch.compile, forward and backward. Check: y/dx/dw SNR vs the
fp32 reference.

Per shape, copy and the torch.compile peer are timed ONCE (the peer in its own row, Backend
``torch.compile``), the peer and every backend with the same function and budget
(:func:`time_rounds`: 3 rounds of forward and backward timings, median of the round medians);
each backend's "vs compile" divides by that one peer figure, so it is the same for all rows of
a shape.

    python benchmark/ops/training/bench_rmsnorm_turbo.py [--backends TURBO,TRITON,TORCH]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parents[1])]
if str(_HERE.parents[2]) not in sys.path:
    sys.path.append(str(_HERE.parents[2]))

import torch  # noqa: E402
from harness import (  # noqa: E402
    Mode,
    Results,
    Timing,
    add_common_args,
    bench_modes,
    compute_snr,
    cpu_notice,
    gbps,
    geomean,
    output_path,
    ratio,
    resolve_profile,
    shard,
    time_ms,
)

import primus_turbo.pytorch as turbo  # noqa: E402
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager  # noqa: E402
from primus_turbo.pytorch.reference import rmsnorm_ref  # noqa: E402

# (label, rows M, hidden N)
GPU_CASES = [
    ("issue 16384x8192", 16384, 8192),
    ("gpt-oss (2880)", 8192, 2880),
    ("Llama-3-8B (4096)", 8192, 4096),
    ("DeepSeek-V3 (7168)", 8192, 7168),
]
CPU_CASES = [("tiny", 64, 256), ("tiny-odd", 33, 127)]
SNR_MIN = 35.0
# GPU timing budget per timing call (ms): 4 shapes x 3 backends x (3 rounds x 2 sides x 2 modes)
# calls plus one compile per shape keep the whole group well under a minute on an H200.
GPU_WARMUP_MS, GPU_REP_MS = 10.0, 45.0
_PEER: dict[str, object] = {}


def compiled_peer(dev: torch.device):
    """torch.compile of the reference, one static (dynamic=False) graph per shape, shared by all
    backends of a run (a fresh wrapper per row would recompile and then go dynamic)."""
    if dev.type != "cuda":
        return rmsnorm_ref
    if "peer" not in _PEER:
        _PEER["peer"] = torch.compile(rmsnorm_ref, dynamic=False)
    return _PEER["peer"]


PLAN_VARS = ("PRIMUS_TURBO_RMSNORM_CPP_PLAN", "PRIMUS_TURBO_RMSNORM_CPP_FWD_PLAN",
             "PRIMUS_TURBO_RMSNORM_CPP_BWD_PLAN")  # fmt: skip


def expand_backends(
    backends: list[str], plans: list[str], triton_plans: list[str] | None = None
) -> list[tuple[str, str, str | None]]:
    """(row name, backend, launch plan): with ``--plans``, TURBO becomes one row per plan
    (``TURBO[tiles]``, ``TURBO[persist/rows]``, ...); with ``--triton-plans``, TRITON one row per
    Triton forward plan (``TRITON[looped+RBLOCK=4096]``); all timed in the same process and run."""
    out: list[tuple[str, str, str | None]] = []
    for b in backends:
        if b == "TURBO" and plans:
            out += [(f"TURBO[{p}]", b, p) for p in plans]
        elif b == "TRITON" and triton_plans:
            out += [(f"TRITON[{p}]", b, f"triton:{p}") for p in triton_plans]
        else:
            out.append((b, b, None))
    return out


def _reload_plans() -> None:
    from primus_turbo.pytorch.kernels.normalization.rmsnorm_impl import reload_env

    reload_env()  # Python-side knobs (TURBO_FWD*, TRITON_FWD*)
    try:
        import primus_turbo.pytorch._C as ext
    except ImportError:
        return
    getattr(ext, "_rmsnorm_reload_plans", lambda: None)()


def knob_var(key: str) -> str:
    """Env var of a plan knob: ``TURBO_*`` / ``TRITON_*`` -> ``PRIMUS_TURBO_RMSNORM_<key>`` (the
    Python-side forward knobs), anything else -> ``PRIMUS_TURBO_RMSNORM_CPP_<key>``."""
    if key.startswith(("TURBO_", "TRITON_")):
        return f"PRIMUS_TURBO_RMSNORM_{key}"
    return f"PRIMUS_TURBO_RMSNORM_CPP_{key}"


@contextlib.contextmanager
def cpp_plan(plan: str | None):
    """Runs the block with the C++ op's launch plan ``plan``: "tiles", an "FWD/BWD" pair such as
    "tiles/rows", optionally with knobs appended as "+NAME=VALUE" (NAME without the
    PRIMUS_TURBO_RMSNORM_CPP_ prefix, e.g. "tiles+TILES_BWD_VPT=4+TILES_BWD_PER_SM=3"). The op
    re-reads its environment after ``_reload_plans``; everything is restored afterwards."""
    if plan is None:
        yield
        return
    env: dict[str, str] = {}
    if plan.startswith("triton:"):  # TRITON row: forward kernel + PRIMUS_TURBO_RMSNORM_TRITON_FWD_*
        name, *knobs = plan[len("triton:") :].split("+")
        env["PRIMUS_TURBO_RMSNORM_TRITON_FWD"] = name
        knobs = [f"TRITON_FWD_{k}" for k in knobs]
    else:
        name, *knobs = plan.split("+")
        if "/" in name:
            env[PLAN_VARS[1]], env[PLAN_VARS[2]] = name.split("/", 1)
        else:
            env[PLAN_VARS[0]] = name
    for knob in knobs:
        key, _, value = knob.partition("=")
        env[knob_var(key)] = value
    saved = {k: os.environ.get(k) for k in (*PLAN_VARS, *env)}
    for k in PLAN_VARS:
        os.environ.pop(k, None)
    os.environ.update(env)
    _reload_plans()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _reload_plans()


COLUMNS = ["Case", "Backend", "M", "N", "Check", "Forward GB/s", "Backward GB/s", "copy GB/s",
           "Forward vs copy", "Backward vs copy", "Forward vs compile", "Backward vs compile",
           "out_snr", "dx_snr", "dw_snr"]  # fmt: skip
KEYS = ("Forward vs copy", "Backward vs copy", "Forward vs compile", "Backward vs compile")
PEER = "torch.compile"
ROUNDS = 3


def time_rounds(fwd, leaves, dy, args, dev) -> dict[Mode, Timing]:
    """Forward and backward timings of ``fwd``: ``ROUNDS`` rounds of :func:`bench_modes` (the
    budget split over the rounds), median of the round medians. Used for the peer and for every
    backend alike."""
    rep = args.rep_ms / ROUNDS if args.rep_ms is not None else None
    runs: dict[Mode, list[float]] = {}
    for _ in range(ROUNDS):
        for mode, t in bench_modes(fwd, dy, leaves, (Mode.FWD, Mode.BWD), args.warmup_ms, rep,
                                   dev).items():  # fmt: skip
            runs.setdefault(mode, []).append(t.median_ms)
    return {m: Timing(statistics.median(v), statistics.pstdev(v)) for m, v in runs.items()}


def shape_inputs(tid, m, n, dtype, dev):
    torch.manual_seed(tid)
    x = torch.randn(m, n, device=dev, dtype=dtype, requires_grad=True)
    w = (1 + 0.1 * torch.randn(n, device=dev)).to(dtype).requires_grad_()
    dy = torch.randn(m, n, device=dev, dtype=dtype)
    return x, w, dy


def nbytes(m, n, elt) -> tuple[int, int]:
    """(forward, backward) bytes read + written."""
    return 2 * m * n * elt + n * elt + 4 * m, 3 * m * n * elt + 2 * n * elt + 4 * m


def fill_speeds(row, t, m, n, elt, copy_gbps, peer) -> dict:
    """GB/s and ratios of one row from its timings ``t``; ``peer`` = the shape's compile row
    (None for the compile row itself)."""
    row["copy GB/s"] = copy_gbps
    for mode, key, nb in zip((Mode.FWD, Mode.BWD), ("Forward", "Backward"), nbytes(m, n, elt),
                             strict=True):  # fmt: skip
        row[f"{key} Time (ms)"] = t[mode].median_ms
        row[f"{key} GB/s"] = gbps(nb, t[mode].median_ms)
        row[f"{key} vs copy"] = ratio(row[f"{key} GB/s"], copy_gbps)
        ref = row if peer is None else peer
        row[f"{key} vs compile"] = ratio(row[f"{key} GB/s"], ref[f"{key} GB/s"])
    return row


def run_shape_baselines(tid, label, m, n, dtype, args, info) -> tuple[float, dict]:
    """Copy GB/s and the torch.compile peer row of one shape (each timed once)."""
    dev = info.device
    x, w, dy = shape_inputs(tid, m, n, dtype, dev)
    elt = x.element_size()
    src = torch.empty(m, n, device=dev, dtype=dtype)
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src), args.warmup_ms, args.rep_ms, device=dev).median_ms
    copy_gbps = gbps(2 * m * n * elt, copy_ms)
    peer = compiled_peer(dev)
    xp, wp = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    t = time_rounds(lambda: peer(xp, wp), (xp, wp), dy, args, dev)
    row = {"TestID": tid, "Case": label, "Backend": PEER, "M": m, "N": n, "Check": "PASS"}
    return copy_gbps, fill_speeds(row, t, m, n, elt, copy_gbps, None)


def run_case(tid, label, m, n, backend, dtype, args, info, copy_gbps, peer_row) -> dict:
    dev = info.device
    row = {"TestID": tid, "Case": label, "Backend": backend, "M": m, "N": n, "Check": "ERROR"}
    GlobalBackendManager.set_backend("rmsnorm", None if backend == "auto" else backend)
    x, w, dy = shape_inputs(tid, m, n, dtype, dev)
    out = turbo.ops.rmsnorm(x, w)
    out.backward(dy)
    xr, wr = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ref = rmsnorm_ref(xr, wr)
    ref.backward(dy.float())
    snr = {"out_snr": compute_snr(ref, out), "dx_snr": compute_snr(xr.grad, x.grad),
           "dw_snr": compute_snr(wr.grad, w.grad)}  # fmt: skip
    row.update(snr)
    row["Check"] = "PASS" if all(v > SNR_MIN for v in snr.values()) else "FAIL"
    x.grad = w.grad = None
    t = time_rounds(lambda: turbo.ops.rmsnorm(x, w), (x, w), dy, args, dev)
    return fill_speeds(row, t, m, n, x.element_size(), copy_gbps, peer_row)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--backends",
        default="auto,TURBO,TRITON,TORCH",
        help="comma-separated: auto (dispatcher default), TURBO, TRITON, TORCH",
    )
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument(
        "--plans",
        default="",
        help="comma-separated C++ launch plans to compare as TURBO[plan] rows in one run: auto, "
        "tiles, persist, prev, rows, FWD/BWD pairs such as tiles/rows, each optionally with "
        "+KNOB=VALUE suffixes (e.g. tiles+TILES_FWD_VPT=8+TILES_BLOCK=512; TURBO_*/TRITON_* "
        "knobs set PRIMUS_TURBO_RMSNORM_<KNOB>, e.g. auto+TURBO_FWD=cpp)",
    )
    p.add_argument(
        "--triton-plans",
        default="",
        help="comma-separated Triton forward plans to compare as TRITON[plan] rows: tile, looped, "
        "auto, each optionally with +KNOB=VALUE (PRIMUS_TURBO_RMSNORM_TRITON_FWD_<KNOB>: RBLOCK, "
        "ROWS, WARPS, STAGES, HINTS, PER_THREAD, LOOPED_MIN_N), e.g. looped+RBLOCK=4096+WARPS=8",
    )
    p.add_argument(
        "--hidden",
        default="",
        help="comma-separated hidden sizes: only the cases with these N (default: every case)",
    )
    add_common_args(p)
    args = p.parse_args(argv)
    if torch.cuda.is_available() and args.profile != "cpu":
        args.warmup_ms = GPU_WARMUP_MS if args.warmup_ms is None else args.warmup_ms
        args.rep_ms = GPU_REP_MS if args.rep_ms is None else args.rep_ms
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in backends:
        if b != "auto":
            BackendType.parse(b)
    profile, info = resolve_profile(args.profile)
    print(info.banner())
    notice = cpu_notice(info)
    results = Results(info)
    cases = GPU_CASES if profile == "gpu" else CPU_CASES
    if args.hidden:
        keep = {int(h) for h in args.hidden.split(",") if h.strip()}
        cases = [c for c in cases if c[2] in keep]
    if info.device.type != "cuda":
        backends = [b for b in backends if b != "TRITON"]  # the interpreter is not a benchmark
    plans = [q.strip() for q in args.plans.split(",") if q.strip()]
    tplans = [q.strip() for q in args.triton_plans.split(",") if q.strip()]
    entries = expand_backends(backends, plans, tplans)
    for tid, (label, m, n) in shard(cases, args.num_shards, args.shard_id):
        try:
            copy_gbps, peer_row = run_shape_baselines(tid, label, m, n, dtype, args, info)
        except Exception as e:  # no baselines: the rows of this shape say ERROR
            print(f"  ERROR {label} copy/{PEER}: {type(e).__name__}: {e}")
            copy_gbps, peer_row = float("nan"), {"Forward GB/s": float("nan"),
                                                 "Backward GB/s": float("nan")}  # fmt: skip
        else:
            results.add(peer_row)
            print(f"[{tid}] {label} {PEER} M={m} N={n}: fwd {peer_row['Forward GB/s']:.0f} GB/s "
                  f"(x{peer_row['Forward vs copy']:.2f} copy), bwd "
                  f"{peer_row['Backward GB/s']:.0f} GB/s (x{peer_row['Backward vs copy']:.2f} "
                  f"copy); copy {copy_gbps:.0f} GB/s")  # fmt: skip
        for name, backend, plan in entries:
            try:
                with cpp_plan(plan):
                    row = run_case(tid, label, m, n, backend, dtype, args, info, copy_gbps,
                                   peer_row)  # fmt: skip
                row["Backend"] = name
                results.add(row)
            except Exception as e:  # keep going; the row says ERROR
                print(f"  ERROR {label} {name}: {type(e).__name__}: {e}")
                results.add({"TestID": tid, "Case": label, "Backend": name, "M": m, "N": n,
                             "Check": "ERROR"})  # fmt: skip
                continue
            print(f"[{tid}] {label} {name} M={m} N={n} {row['Check']}: "
                  f"fwd {row['Forward GB/s']:.0f} GB/s (x{row['Forward vs copy']:.2f} copy, "
                  f"x{row['Forward vs compile']:.2f} compile), bwd {row['Backward GB/s']:.0f} "
                  f"GB/s (x{row['Backward vs copy']:.2f} copy, "
                  f"x{row['Backward vs compile']:.2f} compile)")  # fmt: skip
    GlobalBackendManager.reset()
    print()
    print(results.markdown(COLUMNS))
    print()
    for backend in [PEER, *(e[0] for e in entries)]:
        sel = lambda r, b=backend: r["Check"] == "PASS" and r["Backend"] == b  # noqa: E731
        print(f"Geomean {backend}: "
              + ", ".join(f"{k} {geomean(results.column(k, sel)):.3f}" for k in KEYS))  # fmt: skip
    # best backend per shape and direction (the gate: >= 0.9x copy and >= compile)
    for key in ("Forward", "Backward"):
        best = []
        for _, (label, _, _) in shard(cases, args.num_shards, args.shard_id):
            rows = [
                r
                for r in results.rows
                if r["Case"] == label and r["Check"] == "PASS" and r["Backend"] != PEER
            ]
            if rows:
                top = max(rows, key=lambda r: r[f"{key} GB/s"])
                best.append(top)
                print(f"best {key:8s} {label:22s} {top['Backend']:14s} "
                      f"{top[f'{key} GB/s']:.0f} GB/s  x{top[f'{key} vs copy']:.3f} copy  "
                      f"x{top[f'{key} vs compile']:.3f} compile")  # fmt: skip
        if best:
            print(f"Geomean best {key}: vs copy "
                  f"{geomean(r[f'{key} vs copy'] for r in best):.3f}, vs compile "
                  f"{geomean(r[f'{key} vs compile'] for r in best):.3f}")  # fmt: skip
    if notice:
        print(notice)
    name = f"rmsnorm_turbo_{args.dtype}_{info.date_compact}_{info.gpu}.csv"
    path = results.write_csv(output_path(args.output, name, args.num_shards, args.shard_id))
    print(f"Results saved to {path}")
    return 0 if all(r["Check"] == "PASS" for r in results.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
