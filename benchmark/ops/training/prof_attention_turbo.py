"""Kernel-level profile: the default ``turbo.ops.flash_attn_func`` vs SDPA cuDNN (what a user
writes: ``scaled_dot_product_attention`` on ``.transpose(1, 2)`` views of bshd tensors), forward
+ backward, on the benchmark's shapes (batch = 16384 tokens / seqlen, bf16, bshd from randn).

Per case it writes, for each side: the SDPA kernel the default resolved to, the autograd nodes
behind the output, every device kernel (count and device time per iteration, torch.profiler)
and the aten ops whose per-iteration counts differ between the sides (an extra copy, cast or
contiguous shows up there). Then event-timed fwd / bwd medians (sides interleaved) and the host
time per call of each side on a tiny shape (launch-bound: Python + dispatch overhead), with
``PRIMUS_TURBO_ATTN_SDPA_CTX`` fast and full.

    python benchmark/ops/training/prof_attention_turbo.py -o $OUT/attn_profile.md
    python benchmark/ops/training/prof_attention_turbo.py --cases DeepSeek-V3:8192:causal

Takes ~20-30 s on the H200 (the default's first call times TRITON against SDPA once per shape).
``--device cpu`` runs the same code at a tiny shape (code-path check only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parents[1])]
if str(_HERE.parents[2]) not in sys.path:
    sys.path.append(str(_HERE.parents[2]))

import torch  # noqa: E402
from bench_attention_turbo import MODELS, TOKENS  # noqa: E402

import primus_turbo.pytorch as turbo  # noqa: E402
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager  # noqa: E402
from primus_turbo.pytorch.kernels.attention import attention_impl  # noqa: E402

DEFAULT_CASES = ("DeepSeek-V3:8192:causal", "Llama-3-8B:4096:causal")


def _peer(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kind = SDPBackend.CUDNN_ATTENTION if q.is_cuda else SDPBackend.MATH
    with sdpa_kernel([kind]):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
            enable_gqa=q.shape[2] != k.shape[2])  # fmt: skip
    return out.transpose(1, 2)


def _default(q, k, v, causal):
    return turbo.ops.flash_attn_func(q, k, v, causal=causal)


SIDES = {"default": _default, "sdpa_cudnn": _peer}


def _nodes(out):
    names, fn = [], out.grad_fn
    seen = set()
    todo = [fn]
    while todo:
        fn = todo.pop(0)
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        names.append(type(fn).__name__)
        todo.extend(f for f, _ in fn.next_functions)
    return names


def _dev_time(e) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total", "device_time_total",
                 "cuda_time_total"):  # fmt: skip
        val = getattr(e, attr, None)
        if val:
            return float(val)
    return 0.0


def _profile(fn, leaves, grad, causal, iters):
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if leaves[0].is_cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(iters):
            for t in leaves:
                t.grad = None
            fn(*leaves, causal).backward(grad)
        if leaves[0].is_cuda:
            torch.cuda.synchronize()
    kernels, ops = {}, {}
    for e in prof.key_averages():
        if e.device_type == DeviceType.CUDA:
            c, t = kernels.get(e.key, (0, 0.0))
            kernels[e.key] = (c + e.count / iters, t + _dev_time(e) / iters)
        elif e.key.startswith("aten::"):
            ops[e.key] = ops.get(e.key, 0) + e.count / iters
    return kernels, ops


def _timed(fns, leaves, grad, causal, n):
    """Event-timed fwd and bwd medians (ms), the sides interleaved, L2 flushed before each."""
    dev = leaves[0].device
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    res = {name: ([], []) for name in fns}
    for i in range(n):
        for name in list(fns)[:: 1 if i % 2 == 0 else -1]:
            for t in leaves:
                t.grad = None
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            flush.zero_()
            torch.cuda._sleep(400_000)
            ev[0].record()
            out = fns[name](*leaves, causal)
            ev[1].record()
            flush.zero_()
            torch.cuda._sleep(400_000)
            ev[2].record()
            out.backward(grad)
            ev[3].record()
            torch.cuda.synchronize()
            res[name][0].append(ev[0].elapsed_time(ev[1]))
            res[name][1].append(ev[2].elapsed_time(ev[3]))
    return {name: (statistics.median(f), statistics.median(b)) for name, (f, b) in res.items()}


def _host_us(fn, dev, n=300):
    """Host microseconds per forward call on a tiny shape (the queue never drains: launch-bound)."""
    q, k, v = (torch.randn(1, 128, 8, 64, device=dev, dtype=torch.bfloat16 if dev.type == "cuda"
                           else torch.float32, requires_grad=True) for _ in range(3))  # fmt: skip
    for _ in range(20):
        fn(q, k, v, True)
    best = float("inf")
    for _ in range(3):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn(q, k, v, True)
        best = min(best, (time.perf_counter() - t) * 1e6 / n)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return best


def _set_ctx(mode):
    os.environ["PRIMUS_TURBO_ATTN_SDPA_CTX"] = mode
    attention_impl.sdpa_ctx_mode.cache_clear()


def run_case(spec, dev, iters, lines):
    name, s, mask = spec.split(":")
    s, causal = int(s), mask == "causal"
    hq, hkv, dqk, dv = MODELS[name]
    b = max(1, TOKENS // s)
    dtype = torch.bfloat16
    if dev.type != "cuda":  # code-path check only
        b, s, hq, hkv, dqk, dv, dtype = 1, 64, 4, 2, 24, 16, torch.float32
    torch.manual_seed(0)
    q = torch.randn(b, s, hq, dqk, device=dev, dtype=dtype)
    k = torch.randn(b, s, hkv, dqk, device=dev, dtype=dtype)
    v = torch.randn(b, s, hkv, dv, device=dev, dtype=dtype)
    grad = torch.randn(b, s, hq, dv, device=dev, dtype=dtype)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    lines.append(f"\n## {name} B={b} S={s} Hq={hq} Hkv={hkv} Dqk={dqk} Dv={dv} "
                 f"{'causal' if causal else 'full'}\n")  # fmt: skip
    t0 = time.monotonic()
    for fn in SIDES.values():  # warm-up; the default's first call times TRITON vs SDPA once
        for _ in range(2):
            fn(*leaves, causal).backward(grad)
    kw = dict(q=q, k=k, v=v, cu_q=None, cu_k=None, max_sq=s, max_sk=s, scale=dqk**-0.5,
              causal=causal, window=(-1, -1), return_lse=False)  # fmt: skip
    resolved = attention_impl.AttnDispatcher.resolve(**kw)
    lines.append(f"default resolves to **{resolved.name}** (warm-up {time.monotonic() - t0:.1f} s)")
    for side, fn in SIDES.items():
        out = fn(*leaves, causal)
        lines.append(f"- {side} autograd nodes: {' <- '.join(_nodes(out)[:8])}; out strides "
                     f"{tuple(out.stride())}")  # fmt: skip
        del out
    prof = {side: _profile(fn, leaves, grad, causal, iters) for side, fn in SIDES.items()}
    (dk, dops), (pk, pops) = prof["default"], prof["sdpa_cudnn"]
    lines.append(f"\nDevice kernels per fwd+bwd iteration ({iters} profiled):\n")
    lines.append("| kernel | default n | default us | cuDNN n | cuDNN us |")
    lines.append("|---|---|---|---|---|")
    keys = sorted(set(dk) | set(pk), key=lambda x: -max(dk.get(x, (0, 0))[1], pk.get(x, (0, 0))[1]))
    for key in keys:
        dn, dt = dk.get(key, (0, 0.0))
        pn, pt = pk.get(key, (0, 0.0))
        lines.append(f"| {key[:110]} | {dn:g} | {dt:.1f} | {pn:g} | {pt:.1f} |")
    tot_d, tot_p = sum(t for _, t in dk.values()), sum(t for _, t in pk.values())
    ratio = tot_p / tot_d if tot_d else float("nan")
    lines.append(f"| **total** | {sum(n for n, _ in dk.values()):g} | {tot_d:.1f} | "
                 f"{sum(n for n, _ in pk.values()):g} | {tot_p:.1f} |")  # fmt: skip
    lines.append(f"\nkernel-time ratio cuDNN/default (>1: default faster): {ratio:.4f}")
    diff = sorted(k for k in set(dops) | set(pops) if dops.get(k, 0) != pops.get(k, 0))
    lines.append("\naten ops per iteration whose counts differ (default vs cuDNN): "
                 + (", ".join(f"{k} {dops.get(k, 0):g}/{pops.get(k, 0):g}" for k in diff)
                    or "none"))  # fmt: skip
    if dev.type == "cuda":
        t = _timed(SIDES, leaves, grad, causal, 8)
        (df, db), (pf, pb) = t["default"], t["sdpa_cudnn"]
        lines.append(f"\nevent-timed medians of 8 (ms, host hidden): default fwd {df:.3f} bwd "
                     f"{db:.3f} | cuDNN fwd {pf:.3f} bwd {pb:.3f} | fwd+bwd cuDNN/default "
                     f"{(pf + pb) / (df + db):.4f}")  # fmt: skip
    for t in leaves:
        t.grad = None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cases", nargs="*", default=list(DEFAULT_CASES),
                   help="MODEL:SEQLEN:causal|full (default: %(default)s)")  # fmt: skip
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("-o", "--output", default=None,
                   help="markdown file (default $OUT/attn_profile.md, else "
                   "./attn_profile.md)")  # fmt: skip
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    out = args.output or os.path.join(os.environ.get("OUT", "."), "attn_profile.md")
    lines = [f"# flash_attn default vs SDPA cuDNN: torch {torch.__version__}, "
             f"{torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}"]  # fmt: skip
    ctx0 = os.environ.get("PRIMUS_TURBO_ATTN_SDPA_CTX")
    lines.append(f"PRIMUS_TURBO_ATTN_SDPA_CTX={attention_impl.sdpa_ctx_mode()} for the profiles")
    print("\n".join(lines), flush=True)
    for spec in args.cases:
        n0 = len(lines)
        run_case(spec, dev, args.iters, lines)
        print("\n".join(lines[n0:]), flush=True)
    lines.append("\n## host time per forward call, tiny shape (1x128x8x64, launch-bound)\n")
    lines.append("(TORCH pinned for ours, so a tiny shape cannot resolve to TRITON; the pinned "
                 "resolution is memoised like the default's)\n")  # fmt: skip
    host = {"sdpa_cudnn": _host_us(_peer, dev)}
    GlobalBackendManager.set_attn_backend(BackendType.TORCH)
    for mode in attention_impl.SDPA_CTX_MODES:
        _set_ctx(mode)
        host[f"ours ctx={mode}"] = _host_us(_default, dev)
    GlobalBackendManager.set_attn_backend(None)
    if ctx0 is None:
        os.environ.pop("PRIMUS_TURBO_ATTN_SDPA_CTX", None)
    else:
        os.environ["PRIMUS_TURBO_ATTN_SDPA_CTX"] = ctx0
    attention_impl.sdpa_ctx_mode.cache_clear()
    lines.append(" | ".join(f"{k} {v:.1f} us" for k, v in host.items()))
    text = "\n".join(lines) + "\n"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    print("\n".join(lines[-1:]))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
