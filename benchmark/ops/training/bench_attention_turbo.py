"""Flash attention benchmark: ``turbo.ops.flash_attn_func`` (TRITON and default dispatch) against
SDPA cuDNN and SDPA flash on model shapes (bf16, bshd, causal and not).

Shapes: Llama-3 8B (hq32 hkv8 d128), Llama-3 70B (hq64 hkv8 d128; Qwen2.5-72B has the same
attention shape, so it is only run when named), Qwen3-235B (hq64 hkv4 d128), DeepSeek-V3 (hq128
MHA, qk 192 / v 128); seqlen 4k and 8k by default (2k-16k with --seqlens), batch chosen so
that batch * seqlen = 16k tokens. Each case prints its start time (t=... s).

Budget: cases run in rounds (every model at 4096 causal and not, then 8192, ...), and no
new case starts once ``--budget-s`` (default 40 s on a GPU, 0 = no limit) has passed, so a short
device call still gets every model; the cases not reached are listed. Timings use ``--warmup-ms``
/ ``--rep-ms`` (default 25 / 100 ms per mode: every call here takes milliseconds); SDPA flash and
mem-efficient (no target) get ``--peer-rep-ms`` (default a quarter of it), SDPA flash is skipped
where it cannot run (Dqk != Dv). Kernel configs can be pinned for A/B runs by env var, see
primus_turbo/triton/attention/attn_launch.py (``PRIMUS_TURBO_ATTN_{FWD,DQ,DKDV,DV,DK}_CONFIG``,
``PRIMUS_TURBO_ATTN_SPLIT_D``, ``PRIMUS_TURBO_ATTN_DKDV_PARTS``); the TORCH backend's SDPA
priority by ``PRIMUS_TURBO_ATTN_SDPA_CTX`` (fast / full, see attention_impl.sdpa_ctx_mode).

FLOPs: forward ``2*B*Sq*Sk*Hq*(Dqk+Dv)``, halved when causal; backward
``2.5x`` forward; fwd+bwd TFLOPS = total FLOPs over fwd + bwd time.

Correctness first: TRITON's out/dq/dk/dv against SDPA (cuDNN, else flash, else math) by SNR
(>= 40 dB bf16) -> Check PASS/FAIL. Ratios printed per shape and as geomeans:
default fwd+bwd vs the best SDPA (target >= 0.97 on every shape), TRITON fwd / bwd vs cuDNN
(targets: geomean >= 0.7 / >= 0.6). SDPA flash cannot do Dqk != Dv: those cells are NaN ("n/a");
SDPA mem-efficient is timed only where neither cuDNN nor flash runs. The kernel ratios' peer
(column "peer") is cuDNN, else the first SDPA kernel that ran.

Default vs cuDNN (the same cuDNN kernel when the default resolves to TORCH; the peer is SDPA on
``.transpose(1, 2)`` views of the same bshd tensors, as a user writes it): ``--pair interleave``
(default) times single training steps of both sides interleaved (AB BA BA AB, 8-200 steps each
in ``--pair-ms``), host launch time hidden by a GPU spin (``--pair-sleep-us``); the fwd / bwd
columns of both are the step medians, "pair default/cuDNN p50" the median per-step ratio and,
with ``--aa``, "A/A cuDNN/cuDNN" the same ratio between two cuDNN sides (the noise floor).
``--pair abba`` is the method of sessions 3-4 (harness.bench_pair: 4 do_bench rounds; a 30 ms
backward then got ~1 timed sample per round; ratios of identical kernels read 0.93-1.05).

    python benchmark/ops/training/bench_attention_turbo.py            # gpu profile
    TRITON_INTERPRET=1 python benchmark/ops/training/bench_attention_turbo.py --profile cpu
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import traceback
import warnings
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
    bench_pair,
    compute_snr,
    cpu_notice,
    geomean,
    output_path,
    resolve_profile,
    shard,
    tflops,
)

import primus_turbo.pytorch as turbo  # noqa: E402
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager  # noqa: E402
from primus_turbo.pytorch.core.backend import PrecisionType  # noqa: E402
from primus_turbo.triton.attention.attn_launch import _tuned  # noqa: E402

# name -> (hq, hkv, dqk, dv)
MODELS = {
    "Llama-3-8B": (32, 8, 128, 128),
    "Llama-3-70B": (64, 8, 128, 128),
    "Qwen2.5-72B": (64, 8, 128, 128),
    "Qwen3-235B-A22B": (64, 4, 128, 128),
    "DeepSeek-V3": (128, 128, 192, 128),
}
DEFAULT_MODELS = ("Llama-3-8B", "Llama-3-70B", "Qwen3-235B-A22B", "DeepSeek-V3")
# round order: the first seqlen of every model comes first. Default 4096 and 8192: 16 cases in
# ~100-120 s on the H200 (compiles included); 16384 / 2048 on request (--seqlens)
GPU_SEQLENS = (4096, 8192)
GPU_BUDGET_S = 40.0  # + the last case and start-up: ~60 s for the whole task
TOKENS = 16384
CPU_CASES = [("tiny-gqa", 1, 32, 4, 2, 16, 16)]  # the interpreter: ~1 s per kernel call
SNR_GATE_DB = 40.0
VARIANTS = ("TRITON", "default", "sdpa_cudnn", "sdpa_flash")


CAUSAL_CHOICES = {"both": (True, False), "causal": (True,), "full": (False,)}


def cases(profile: str, seqlens, models, causal_sel: str = "both"):
    if profile == "cpu":
        return [(*c, True) for c in CPU_CASES]
    out = []
    for s in seqlens:  # rounds: every model at one seqlen before the next seqlen
        for name in models:
            hq, hkv, dqk, dv = MODELS[name]
            for causal in CAUSAL_CHOICES[causal_sel]:
                out.append((name, max(1, TOKENS // s), s, hq, hkv, dqk, dv, causal))
    return out


def _sdpa(kind):
    """SDPA on bshd tensors (transposed views), optionally pinned to one SDPA kernel."""

    def fn(q, k, v, causal):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        gqa = q.shape[2] != k.shape[2]
        args = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        if kind is None:
            out = torch.nn.functional.scaled_dot_product_attention(
                *args, is_causal=causal, enable_gqa=gqa
            )
        else:
            backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                       "efficient": SDPBackend.EFFICIENT_ATTENTION}  # fmt: skip
            with sdpa_kernel([backend[kind]]):
                out = torch.nn.functional.scaled_dot_product_attention(
                    *args, is_causal=causal, enable_gqa=gqa
                )
        return out.transpose(1, 2)

    return fn


_OPTS = {"set_per_call": False}  # --set-backend-per-call: the measurement of before


def _use_attn_backend(backend) -> None:
    """Pin ``backend`` (None: the default dispatch) unless it already is the setting. Setting it
    on every call bumps the dispatcher's generation, so each timed call of before re-resolved
    (memo miss, tune-cache lookup): host work a user's training step never does."""
    cur = GlobalBackendManager.get_backend("attn", PrecisionType.BF16_FP16_FP32)
    stale = (None if cur is None else cur.backend) != backend or (cur is not None and cur.auto_tune)
    if stale or _OPTS["set_per_call"]:
        GlobalBackendManager.set_attn_backend(backend)


def _turbo(backend):
    def fn(q, k, v, causal):
        _use_attn_backend(backend)
        return turbo.ops.flash_attn_func(q, k, v, causal=causal)

    return fn


def _quantile(xs, p):
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, round(p * (len(xs) - 1))))
    return xs[i]


def pair_interleaved(sides, leaves, grad, budget_ms, sleep_us, dev, min_n=8, max_n=200):
    """Time ``sides`` (name -> fn() giving the output) one training step at a time, the sides
    interleaved (AB BA BA AB ...), until ``budget_ms`` is spent (``min_n``..``max_n`` steps each).

    Each step resets the leaves' grads, flushes L2 (256 MiB), runs the forward between two CUDA
    events, flushes again and runs ``out.backward(grad)`` between two more. With ``sleep_us`` > 0
    the GPU spins that long before each timed region (``torch.cuda._sleep``) so the host's launch
    work is hidden for both sides alike: device time, as graph replay would give, but through
    the real Python call. Compared with harness.bench_pair (4 rounds of do_bench, which on a 30 ms
    backward is ~1 timed sample per round after 6 untimed ones), every call here is a sample
    and drift hits both sides within one round.

    Returns ``({name: {Mode.FWD: Timing, Mode.BWD: Timing}}, {name: [per-step fwd+bwd ms]})``."""
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    cycles = int(sleep_us * 1.8e3)  # ~1.8 GHz SM clock: a lower bound on the spin time

    def step(fn):
        for t in leaves:
            t.grad = None
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        flush.zero_()
        if cycles:
            torch.cuda._sleep(cycles)
        ev[0].record()
        out = fn()
        ev[1].record()
        flush.zero_()
        if cycles:
            torch.cuda._sleep(cycles)
        ev[2].record()
        out.backward(grad)
        ev[3].record()
        return ev

    names = list(sides)
    with torch.enable_grad():
        for _ in range(2):  # warm-up (and the estimate, from the second)
            evs = {n: step(sides[n]) for n in names}
        torch.cuda.synchronize(dev)
        per_round = sum(e[0].elapsed_time(e[3]) for e in evs.values())
        n = max(min_n, min(max_n, int(budget_ms / max(per_round, 1e-3))))
        pending = []
        k = len(names)
        for i in range(n):
            order = names[i % k :] + names[: i % k]
            order = order[::-1] if (i // k) % 2 else order
            pending.append({name: step(sides[name]) for name in order})
        torch.cuda.synchronize(dev)
    for t in leaves:
        t.grad = None
    fwd = {name: [r[name][0].elapsed_time(r[name][1]) for r in pending] for name in names}
    bwd = {name: [r[name][2].elapsed_time(r[name][3]) for r in pending] for name in names}
    timings = {
        name: {
            Mode.FWD: Timing(statistics.median(fwd[name]), statistics.stdev(fwd[name])),
            Mode.BWD: Timing(statistics.median(bwd[name]), statistics.stdev(bwd[name])),
        }
        for name in names
    }
    steps = {name: [f + b for f, b in zip(fwd[name], bwd[name], strict=True)] for name in names}
    return timings, steps


def _fns(on_gpu: bool):
    fns = {"TRITON": _turbo(BackendType.TRITON)}
    if on_gpu:
        fns["default"] = _turbo(None)
        fns["sdpa_cudnn"] = _sdpa("cudnn")
        fns["sdpa_flash"] = _sdpa("flash")
        fns["sdpa_efficient"] = _sdpa("efficient")  # timed only where cuDNN and flash cannot run
    else:
        fns["sdpa_math"] = _sdpa(None)
        fns["default"] = fns["TRITON"]  # the CPU default under the interpreter (not timed twice)
    return fns


def _grads(fn, q, k, v, causal, grad):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, causal)
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


def run_case(idx, case, info, args):
    name, b, s, hq, hkv, dqk, dv, causal = case
    dev = info.device
    torch.manual_seed(idx)
    q = torch.randn(b, s, hq, dqk, device=dev, dtype=torch.bfloat16)
    k = torch.randn(b, s, hkv, dqk, device=dev, dtype=torch.bfloat16)
    v = torch.randn(b, s, hkv, dv, device=dev, dtype=torch.bfloat16)
    grad = torch.randn(b, s, hq, dv, device=dev, dtype=torch.bfloat16)
    fwd_flops = 2.0 * b * s * s * hq * (dqk + dv) * (0.5 if causal else 1.0)
    row = {"Case": idx, "Model": name, "B": b, "S": s, "Hq": hq, "Hkv": hkv, "Dqk": dqk,
           "Dv": dv, "causal": causal}  # fmt: skip
    fns = _fns(info.is_gpu)
    # correctness: TRITON vs the first SDPA variant that runs
    try:
        ours = _grads(fns["TRITON"], q, k, v, causal, grad)
        ref = None
        for peer in ("sdpa_cudnn", "sdpa_flash", "sdpa_math"):
            if peer in fns:
                try:
                    ref = _grads(fns[peer], q, k, v, causal, grad)
                    break
                except Exception:  # noqa: BLE001 - that SDPA kernel cannot run this shape
                    continue
        if ref is None:
            q32, k32, v32 = (t.float() for t in (q, k, v))
            ref = _grads(_sdpa(None), q32, k32, v32, causal, grad.float())
        snrs = [compute_snr(r.float(), o.float()) for r, o in zip(ref, ours, strict=True)]
        for key, val in zip(("out_snr", "dq_snr", "dk_snr", "dv_snr"), snrs, strict=True):
            row[key] = val
        row["Check"] = "PASS" if min(snrs) >= SNR_GATE_DB else "FAIL"
        del ours, ref
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        row["Check"] = f"ERROR: {type(e).__name__}"
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    paired = {}
    if info.is_gpu:
        # default vs cuDNN (the same kernel when the default resolves to SDPA): interleaved
        # steps (or do_bench rounds in ABBA order with --pair abba), so clock / thermal drift
        # cannot make one look faster than the other
        try:
            _grads(fns["default"], q, k, v, causal, grad)  # dispatch timing + compiles, untimed
            if args.pair == "interleave":
                sides = {"default": lambda: fns["default"](*leaves, causal),
                         "sdpa_cudnn": lambda: fns["sdpa_cudnn"](*leaves, causal)}  # fmt: skip
                if args.aa:  # a second, identical cuDNN side: the noise floor of this ratio
                    aa_fn = _sdpa("cudnn")
                    sides["sdpa_cudnn_aa"] = lambda: aa_fn(*leaves, causal)
                paired, steps = pair_interleaved(sides, leaves, grad, args.pair_ms,
                                                 args.pair_sleep_us, dev)  # fmt: skip
                ratios = [c / d for c, d in zip(steps["sdpa_cudnn"], steps["default"],
                                                strict=True)]  # fmt: skip
                row["pair n"] = len(ratios)
                row["pair default/cuDNN p25"] = _quantile(ratios, 0.25)
                row["pair default/cuDNN p50"] = statistics.median(ratios)
                row["pair default/cuDNN p75"] = _quantile(ratios, 0.75)
                if args.aa:
                    row["A/A cuDNN/cuDNN"] = statistics.median(
                        c / a for c, a in zip(steps["sdpa_cudnn_aa"], steps["sdpa_cudnn"],
                                              strict=True))  # fmt: skip
            else:
                pair = bench_pair(
                    (lambda: fns["default"](*leaves, causal), leaves),
                    (lambda: fns["sdpa_cudnn"](*leaves, causal), leaves),
                    grad,
                    (Mode.FWD, Mode.BWD),
                    4,  # even: ABBA order gives each side the first slot equally often
                    args.warmup_ms,
                    2 * args.rep_ms,
                    dev,
                )
                paired = dict(zip(("default", "sdpa_cudnn"), pair, strict=True))
        except Exception as e:  # noqa: BLE001 - timed one by one below instead
            traceback.print_exc()
            print(f"  default/cuDNN pair: n/a ({type(e).__name__}: {str(e)[:100]})")
    for vname, fn in fns.items():
        if not info.is_gpu and vname == "default":
            for m in ("fwd", "bwd", "fwd+bwd"):
                row[f"default {m} TFLOPS"] = row[f"TRITON {m} TFLOPS"]
            continue
        fast_sdpa = [row.get(f"{p} fwd+bwd TFLOPS", math.nan) for p in ("sdpa_cudnn", "sdpa_flash")]
        if vname == "sdpa_efficient" and not all(math.isnan(x) for x in fast_sdpa):
            row.update({f"{vname} {m} TFLOPS": math.nan for m in ("fwd", "bwd", "fwd+bwd")})
            continue
        if vname == "sdpa_flash" and dqk != dv:  # SDPA flash needs Dqk == Dv: skip the try
            print("  sdpa_flash: n/a (Dqk != Dv)")
            row.update({f"{vname} {m} TFLOPS": math.nan for m in ("fwd", "bwd", "fwd+bwd")})
            continue
        # the slower SDPA kernels are context only (no target): a quarter of the timing budget
        slow_peer = vname in ("sdpa_flash", "sdpa_efficient")
        warm, rep = (args.peer_rep_ms / 4, args.peer_rep_ms) if slow_peer else (
            args.warmup_ms, args.rep_ms)  # fmt: skip
        try:
            t = paired.get(vname) or bench_modes(
                lambda fn=fn: fn(*leaves, causal), grad, leaves, (Mode.FWD, Mode.BWD),
                warm, rep, device=dev)  # fmt: skip
            f_ms, b_ms = t[Mode.FWD].median_ms, t[Mode.BWD].median_ms
        except Exception as e:  # noqa: BLE001 - e.g. SDPA flash with Dqk != Dv
            print(f"  {vname}: n/a ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
            f_ms = b_ms = math.nan
        row[f"{vname} fwd TFLOPS"] = tflops(fwd_flops, f_ms)
        row[f"{vname} bwd TFLOPS"] = tflops(2.5 * fwd_flops, b_ms)
        row[f"{vname} fwd+bwd TFLOPS"] = tflops(3.5 * fwd_flops, f_ms + b_ms)
    GlobalBackendManager.set_attn_backend(None)
    if info.is_gpu:
        peers = ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient")
        best = max((row[f"{p} fwd+bwd TFLOPS"] for p in peers
                    if not math.isnan(row[f"{p} fwd+bwd TFLOPS"])), default=math.nan)  # fmt: skip
        # the kernel ratios are against cuDNN; where cuDNN cannot run, the next SDPA that ran
        cud = next((p for p in peers if not math.isnan(row[f"{p} fwd TFLOPS"])), "sdpa_cudnn")
        row["peer"] = cud
    else:
        best = row["sdpa_math fwd+bwd TFLOPS"]
        cud = "sdpa_math"
    row["default/bestSDPA fwd+bwd"] = row["default fwd+bwd TFLOPS"] / best
    row["TRITON/cuDNN fwd"] = row["TRITON fwd TFLOPS"] / row[f"{cud} fwd TFLOPS"]
    row["TRITON/cuDNN bwd"] = row["TRITON bwd TFLOPS"] / row[f"{cud} bwd TFLOPS"]
    return row


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_common_args(p)
    p.add_argument("--models", nargs="*", default=list(DEFAULT_MODELS), choices=list(MODELS))
    p.add_argument("--seqlens", nargs="*", type=int, default=list(GPU_SEQLENS))
    p.add_argument("--max-cases", type=int, default=None)
    p.add_argument("--budget-s", type=float, default=None,
                   help=f"start no case after this many seconds (default {GPU_BUDGET_S:g} on a "
                   "GPU, none on CPU; 0 = no limit)")  # fmt: skip
    p.add_argument("--peer-rep-ms", type=float, default=None,
                   help="timing budget (ms per mode) of SDPA flash / mem-efficient, which are "
                   "reported but carry no target (default: a quarter of --rep-ms)")  # fmt: skip
    p.add_argument("--causal", choices=tuple(CAUSAL_CHOICES), default="both",
                   help="which masks to run (default both)")  # fmt: skip
    p.add_argument("--pair", choices=("interleave", "abba"), default="interleave",
                   help="default-vs-cuDNN timing: interleaved single training steps (default; "
                   "see pair_interleaved) or harness.bench_pair (4 do_bench rounds, ABBA; the "
                   "method of sessions 3-4)")  # fmt: skip
    p.add_argument("--pair-ms", type=float, default=3000.0,
                   help="device-time budget of the interleaved pair per case (default 3000; "
                   "8-200 steps per side)")  # fmt: skip
    p.add_argument("--pair-sleep-us", type=float, default=200.0,
                   help="GPU spin before each timed region of the interleaved pair, hiding "
                   "host launch time for both sides (default 200; 0 = eager: host time "
                   "exposed)")  # fmt: skip
    p.add_argument("--aa", action="store_true",
                   help="add a second cuDNN side to the interleaved pair: column 'A/A "
                   "cuDNN/cuDNN' is then the ratio's noise floor")  # fmt: skip
    p.add_argument("--set-backend-per-call", action="store_true",
                   help="set the attention backend inside every timed call (the benchmark of "
                   "before; re-resolves the dispatch on each call)")  # fmt: skip
    args = p.parse_args(argv)
    _OPTS["set_per_call"] = args.set_backend_per_call
    if args.warmup_ms is None:
        args.warmup_ms = 25.0
    if args.rep_ms is None:
        args.rep_ms = 100.0
    if args.peer_rep_ms is None:
        args.peer_rep_ms = args.rep_ms / 4
    return args


COLUMNS = ["Model", "B", "S", "causal", "Check", "TRITON fwd TFLOPS", "TRITON bwd TFLOPS",
           "default fwd+bwd TFLOPS", "sdpa_cudnn fwd TFLOPS", "sdpa_cudnn bwd TFLOPS",
           "sdpa_flash fwd+bwd TFLOPS", "sdpa_efficient fwd+bwd TFLOPS", "peer",
           "default/bestSDPA fwd+bwd", "pair n", "pair default/cuDNN p50", "A/A cuDNN/cuDNN",
           "TRITON/cuDNN fwd", "TRITON/cuDNN bwd", "out_snr", "dq_snr"]  # fmt: skip


def main(argv=None) -> int:
    args = parse_args(argv)
    # SDPA's "kernel not used because ..." warnings, once per pinned call: noise in the table log
    noise = r".*(kernel not used|runtime disabled|requires q,k,v)"
    warnings.filterwarnings("ignore", message=noise)
    profile, info = resolve_profile(args.profile)
    GlobalBackendManager.reset()
    print(info.banner())
    notice = cpu_notice(info)
    if notice:
        print(notice)
    results = Results(info)
    todo = cases(profile, args.seqlens, args.models, args.causal)[: args.max_cases]
    budget = args.budget_s if args.budget_s is not None else (GPU_BUDGET_S if info.is_gpu else 0)
    t_start = time.monotonic()
    skipped = []
    for idx, case in shard(todo, args.num_shards, args.shard_id):
        if budget > 0 and time.monotonic() - t_start > budget:
            skipped.append(case)
            continue
        print(f"[{idx}/{len(todo)}] {case} (t={time.monotonic() - t_start:.0f} s)", flush=True)
        seen = set(_tuned)
        row = results.add(run_case(idx, case, info, args))
        picks = [f"{k[0]} {getattr(v, 'name', v)}" for k, v in _tuned.items() if k not in seen]
        if picks:  # the Triton tiles (and dK/dV mode) the per-shape tuning chose for this case
            print("  tuned: " + ", ".join(dict.fromkeys(picks)))
        print(
            f"  {row['Check']} TRITON fwd {row['TRITON fwd TFLOPS']:.1f} bwd "
            f"{row['TRITON bwd TFLOPS']:.1f} | default fwd+bwd {row['default fwd+bwd TFLOPS']:.1f}"
            f" | default/bestSDPA {row['default/bestSDPA fwd+bwd']:.3f} | TRITON/cuDNN fwd "
            f"{row['TRITON/cuDNN fwd']:.3f} bwd {row['TRITON/cuDNN bwd']:.3f}"
        )
        if "pair n" in row:
            aa = row.get("A/A cuDNN/cuDNN")
            print(
                f"  pair ({row['pair n']} steps/side): default/cuDNN per step p25/p50/p75 "
                f"{row['pair default/cuDNN p25']:.3f}/{row['pair default/cuDNN p50']:.3f}/"
                f"{row['pair default/cuDNN p75']:.3f}"
                + (f" | A/A cuDNN/cuDNN {aa:.3f}" if aa is not None else "")
                + f" | fwd {row['default fwd TFLOPS']:.1f}/{row['sdpa_cudnn fwd TFLOPS']:.1f}"
                f" bwd {row['default bwd TFLOPS']:.1f}/{row['sdpa_cudnn bwd TFLOPS']:.1f} TFLOPS"
            )
    print(f"\n{len(results.rows)} cases in {time.monotonic() - t_start:.0f} s", end="")
    if skipped:
        print(f"; {len(skipped)} not reached in the {budget:g} s budget (--budget-s): "
              + ", ".join(f"{c[0]}/{c[2]}/{'causal' if c[7] else 'full'}" for c in skipped),
              end="")  # fmt: skip
    print()
    cols = [c for c in COLUMNS if any(c in r for r in results.rows)]
    print()
    print(results.markdown(cols))
    ok = [r for r in results.rows if r["Check"] == "PASS"]
    dflt = [r["default/bestSDPA fwd+bwd"] for r in ok]
    print(
        f"\nGeomean over {len(ok)}/{len(results.rows)} PASS rows: TRITON/cuDNN fwd "
        f"{geomean(r['TRITON/cuDNN fwd'] for r in ok):.3f} (target >= 0.7), bwd "
        f"{geomean(r['TRITON/cuDNN bwd'] for r in ok):.3f} (target >= 0.6); default/bestSDPA "
        f"fwd+bwd geomean {geomean(dflt):.3f}, min {min(dflt, default=math.nan):.3f} "
        "(target >= 0.97 on every shape)"
    )
    if notice:
        print(notice)
    name = f"attention_turbo_bf16_{info.date_compact}_{info.gpu}.csv"
    path = results.write_csv(output_path(args.output, name, args.num_shards, args.shard_id))
    print(f"Results saved to {path}")
    return 0 if all(r["Check"] == "PASS" for r in results.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
