"""SwiGLU/GeGLU-with-probs benchmark: ``turbo.ops.swiglu_with_probs`` (fused Triton fwd/bwd) vs
``torch.compile`` of the fp32 reference, and vs device copy bandwidth, in GB/s.

Rows are MoE expert activations: ``x [N, 2F]`` bf16 (N routed rows), fp32 probs ``[N]``. Bytes:
forward reads ``x`` and writes ``[N, F]`` (``3NF`` elements); backward reads ``x`` and ``dy`` and
writes ``dx`` (``5NF``). The copy figure is ``torch.Tensor.copy_`` of a buffer of the same
forward traffic, timed in the same run (ratio target >= 0.8). Check: out/dx/dprobs SNR vs the
fp32 reference.

    python benchmark/ops/training/bench_activation_turbo.py [--act swiglu|geglu]
"""

from __future__ import annotations

import argparse
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
    add_common_args,
    bench_pair,
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
from primus_turbo.pytorch.reference.activation import glu_ref  # noqa: E402

# (label, routed rows N, expert ffn size F): rows = 8192 tokens x top-k on one rank
GPU_CASES = [
    ("DeepSeek-V3 (EP8)", 65536, 2048),
    ("Qwen3-30B-A3B", 65536, 768),
    ("gpt-oss-20b", 32768, 2880),
    ("Mixtral-8x7B", 16384, 14336),
    ("dense 16384x8192", 16384, 8192),
]
CPU_CASES = [("tiny", 64, 48), ("tiny-odd", 33, 70)]
SNR_MIN = 35.0
COLUMNS = ["Case", "N", "F", "Check", "Forward GB/s", "Backward GB/s", "copy GB/s",
           "Forward vs copy", "Backward vs copy", "Forward vs compile", "Backward vs compile",
           "out_snr", "dx_snr", "dprobs_snr"]  # fmt: skip


def run_case(tid, label, n, f, act, args, info) -> dict:
    dev = info.device
    row = {"TestID": tid, "Case": label, "N": n, "F": f, "Act": act, "Check": "ERROR"}
    torch.manual_seed(tid)
    x = torch.randn(n, 2 * f, device=dev, dtype=torch.bfloat16, requires_grad=True)
    p = torch.rand(n, device=dev, requires_grad=True)
    dy = torch.randn(n, f, device=dev, dtype=torch.bfloat16)
    ours_fn = turbo.ops.swiglu_with_probs if act == "swiglu" else turbo.ops.geglu_with_probs
    name = "silu" if act == "swiglu" else "gelu"
    out = ours_fn(x, p)
    out.backward(dy)
    xr, pr = x.detach().float().requires_grad_(), p.detach().clone().requires_grad_()
    ref = glu_ref(xr, pr, None, name)
    ref.backward(dy.float())
    snr = {"out_snr": compute_snr(ref, out), "dx_snr": compute_snr(xr.grad, x.grad),
           "dprobs_snr": compute_snr(pr.grad, p.grad)}  # fmt: skip
    row.update(snr)
    row["Check"] = "PASS" if all(v > SNR_MIN for v in snr.values()) else "FAIL"
    x.grad = p.grad = None
    peer = torch.compile(lambda a, b: glu_ref(a, b, None, name)) if dev.type == "cuda" else (
        lambda a, b: glu_ref(a, b, None, name))  # fmt: skip
    xp, pp = x.detach().clone().requires_grad_(), p.detach().clone().requires_grad_()
    t_ours, t_peer = bench_pair(
        (lambda: ours_fn(x, p), (x, p)), (lambda: peer(xp, pp), (xp, pp)), dy,
        warmup=args.warmup_ms, rep=args.rep_ms, device=dev,
    )  # fmt: skip
    elt = x.element_size()
    fwd_b, bwd_b = 3 * n * f * elt + 4 * n, 5 * n * f * elt + 8 * n
    src = torch.empty(n * f * 3 // 2, device=dev, dtype=torch.bfloat16)  # ~3NF/2 read + write
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src), args.warmup_ms, args.rep_ms, device=dev).median_ms
    row["copy GB/s"] = gbps(2 * src.numel() * elt, copy_ms)
    for mode, key, nbytes in ((Mode.FWD, "Forward", fwd_b), (Mode.BWD, "Backward", bwd_b)):
        row[f"{key} Time (ms)"] = t_ours[mode].median_ms
        row[f"{key} GB/s"] = gbps(nbytes, t_ours[mode].median_ms)
        row[f"compile {key} GB/s"] = gbps(nbytes, t_peer[mode].median_ms)
        row[f"{key} vs copy"] = ratio(row[f"{key} GB/s"], row["copy GB/s"])
        row[f"{key} vs compile"] = ratio(row[f"{key} GB/s"], row[f"compile {key} GB/s"])
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--act", choices=("swiglu", "geglu"), default="swiglu")
    add_common_args(p)
    args = p.parse_args(argv)
    profile, info = resolve_profile(args.profile)
    print(info.banner())
    notice = cpu_notice(info)
    results = Results(info)
    cases = GPU_CASES if profile == "gpu" else CPU_CASES
    for tid, (label, n, f) in shard(cases, args.num_shards, args.shard_id):
        try:
            row = results.add(run_case(tid, label, n, f, args.act, args, info))
        except Exception as e:  # keep going; the row says ERROR
            print(f"  ERROR {label}: {type(e).__name__}: {e}")
            row = results.add({"TestID": tid, "Case": label, "N": n, "F": f, "Check": "ERROR"})
            continue
        print(f"[{tid}] {label} N={n} F={f} {row['Check']}: fwd {row['Forward GB/s']:.0f} GB/s "
              f"(x{row['Forward vs copy']:.2f} copy, x{row['Forward vs compile']:.2f} compile), "
              f"bwd {row['Backward GB/s']:.0f} GB/s (x{row['Backward vs copy']:.2f} copy, "
              f"x{row['Backward vs compile']:.2f} compile)")  # fmt: skip
    print()
    print(results.markdown(COLUMNS))
    ok = lambda r: r["Check"] == "PASS"  # noqa: E731
    keys = ("Forward vs copy", "Backward vs copy", "Forward vs compile", "Backward vs compile")
    print("\nGeomean: " + ", ".join(f"{k} {geomean(results.column(k, ok)):.3f}" for k in keys))
    if notice:
        print(notice)
    name = f"activation_turbo_{args.act}_{info.date_compact}_{info.gpu}.csv"
    path = results.write_csv(output_path(args.output, name, args.num_shards, args.shard_id))
    print(f"Results saved to {path}")
    return 0 if all(ok(r) for r in results.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
