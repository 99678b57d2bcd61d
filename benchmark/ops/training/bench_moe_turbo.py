"""MoE benchmark: ``moe_router_topk`` (vs ``torch.compile`` of the torch-op router; its H
column is the expert count), ``moe_permute`` / ``moe_unpermute`` (GB/s vs copy bandwidth and vs
``torch.compile`` of a plain torch permute) and ``modules.MoELayer`` forward+backward vs the
same layer in plain PyTorch (loop over experts, ``reference.moe.moe_layer_ref``). The fused
router against the torch-op one in a process: ``--variants "PRIMUS_TURBO_MOE_ROUTER=auto;
PRIMUS_TURBO_MOE_ROUTER=torch"``.

Routing is realistic and non-uniform: router logits get a per-expert bias drawn from a Gamma
distribution (shape 3, as ``config.moe_group_lens``), so expert loads vary by ~2x and some
experts are nearly idle. Shapes: one rank of DeepSeek-V3 (EP8: 32 of 256 experts, group-limited
sigmoid routing), Qwen3-30B-A3B, gpt-oss-20b, Mixtral-8x7B; 4096 tokens per rank.

Bytes (bf16 rows of hidden size H, N = T*topk permuted rows): permute forward reads and writes
N rows (``2NH``), backward reads N rows and writes T (``(N+T)H``); unpermute the reverse. The
copy figure is ``copy_`` of an N-row buffer in the same run (read + write). Only row data is
counted: the index maps, probs and the (tiny) map building are time without bytes, so a permute
whose time goes to index work shows as a low fraction of copy bandwidth.

    python benchmark/ops/training/bench_moe_turbo.py --part all
"""

from __future__ import annotations

import argparse
import os
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
    set_timing,
    time_ms,
    timing_mode,
)

import primus_turbo.pytorch as turbo  # noqa: E402
from primus_turbo.pytorch.reference.moe import moe_layer_ref, router_ref  # noqa: E402

# (label, tokens T, hidden D, expert ffn F, local experts E, topk, score fn, groups, selected)
GPU_CASES = [
    ("DeepSeek-V3 (EP8)", 4096, 7168, 2048, 32, 8, "sigmoid", 8, 4),
    ("Qwen3-30B-A3B", 4096, 2048, 768, 128, 8, "softmax", 1, 1),
    ("gpt-oss-20b", 4096, 2880, 2880, 32, 4, "softmax", 1, 1),
    ("Mixtral-8x7B", 4096, 4096, 14336, 8, 2, "softmax", 1, 1),
]
CPU_CASES = [("tiny", 24, 32, 16, 4, 2, "softmax", 1, 1), ("tiny-grouped", 16, 24, 8, 8, 4,
                                                          "sigmoid", 4, 2)]  # fmt: skip
SNR_MIN = 30.0


def routed_logits(t: int, e: int, seed: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    load = torch.distributions.Gamma(3.0, 1.0).sample((e,))  # per-expert popularity
    logits = torch.randn(t, e, generator=g) + 2.0 * torch.log(load / load.mean())
    return logits.to(device)


def torch_permute(x, idx):
    k = idx.shape[1]
    order = torch.argsort(idx.reshape(-1), stable=True)
    return x.index_select(0, order // k)


def torch_unpermute(y, idx, probs):
    t, k = idx.shape
    order = torch.argsort(idx.reshape(-1), stable=True)
    flat = torch.zeros(t * k, y.shape[1], dtype=torch.float32, device=y.device)
    flat = flat.index_copy(0, order, y.float()).view(t, k, -1)
    return (flat * probs.unsqueeze(-1)).sum(1).to(y.dtype)


def _variants(spec: str | None) -> list[tuple[str, dict[str, str]]]:
    """``--variants "IMPL=v1;IMPL=v2,GEOM=v2;GEOM=2d"`` -> ``[(label, {env var: value})]``;
    short names mean ``PRIMUS_TURBO_MOE_PERMUTE_<NAME>``. None: one variant, the environment
    as it is."""
    if not spec:
        return [("default", {})]
    out = []
    for item in filter(None, (v.strip() for v in spec.split(";"))):
        env = {}
        for kv in filter(None, (v.strip() for v in item.split(","))):
            name, _, value = kv.partition("=")
            name = name.strip().upper()
            env[name if name.startswith("PRIMUS_") else f"PRIMUS_TURBO_MOE_PERMUTE_{name}"] = (
                value.strip()
            )
        out.append((item, env))
    return out


class _env:
    """Set environment variables for a block (the permute knobs are read per call)."""

    def __init__(self, env: dict[str, str]):
        self.env, self.old = env, {}

    def __enter__(self):
        for k, v in self.env.items():
            self.old[k] = os.environ.get(k)
            os.environ[k] = v
        _router_mode_changed()

    def __exit__(self, *exc):
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _router_mode_changed()


def _router_mode_changed() -> None:
    """``PRIMUS_TURBO_MOE_ROUTER`` is read once per process: re-read it for the next variant."""
    from primus_turbo.pytorch.kernels.moe.router_impl import router_mode

    router_mode.cache_clear()


def _router_row(tid, case, args, info, logits, copy_gbs, peer, vname) -> dict:
    """``moe_router_topk`` (forward, and the backward of ``probs``) vs ``torch.compile`` of the
    torch-op router. Bytes: forward reads the logits and writes aux scores, probs, ids and the
    picks' per-token sums; backward reads the logits, dprobs, ids, probs and sums and writes
    dlogits."""
    label, t, _, _, e, k, fn, groups, sel = case
    dev = info.device
    x = logits.detach().clone().requires_grad_()
    xp = logits.detach().clone().requires_grad_()
    _, probs, idx = turbo.ops.moe_router_topk(x, k, groups, sel, fn)
    _, r_probs, r_idx = router_ref(logits.detach(), k, groups, sel, fn)
    ok = torch.equal(idx, r_idx) and compute_snr(r_probs, probs) > SNR_MIN
    t_o, t_p = bench_pair(
        (lambda: turbo.ops.moe_router_topk(x, k, groups, sel, fn)[1], (x,)),
        (lambda: peer(xp, k, groups, sel, fn, 1.0)[1], (xp,)), torch.randn_like(probs),
        warmup=args.warmup_ms, rep=args.rep_ms, device=dev,
    )  # fmt: skip
    elt, kb = logits.element_size(), t * k * (4 + 8) + t * 4
    return _row(tid, label, "router", t, e, e, k, ok, t_o, t_p, copy_gbs,
                t * e * (elt + 4) + kb, 2 * t * e * elt + kb + t * k * 4, vname)  # fmt: skip


def bench_permute(tid, case, args, info) -> list[dict]:
    label, t, d, _, e, k, fn, groups, sel = case
    dev = info.device
    logits = routed_logits(t, e, tid, dev)
    _, probs, idx = turbo.ops.moe_router_topk(logits, k, groups, sel, fn)
    x = torch.randn(t, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    n, elt = t * k, x.element_size()
    compile_ = (lambda f: torch.compile(f)) if dev.type == "cuda" else (lambda f: f)
    src = torch.empty(n, d, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_gbs = gbps(2 * n * d * elt, time_ms(lambda: dst.copy_(src), device=dev).median_ms)
    rows = []
    g_perm = torch.randn(n, d, device=dev, dtype=torch.bfloat16)
    xp = x.detach().clone().requires_grad_()
    peer = compile_(torch_permute)
    y = torch.randn(n, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    g_un = torch.randn(t, d, device=dev, dtype=torch.bfloat16)
    yp = y.detach().clone().requires_grad_()
    peer_u = compile_(torch_unpermute)
    ref_u = torch_unpermute(y.detach().float(), idx, probs.float())
    from primus_turbo.pytorch.ops.moe import _router_torch

    peer_r = compile_(_router_torch)
    for vname, env in _variants(args.variants):
        with _env(env):
            rows.append(_router_row(tid, case, args, info, logits, copy_gbs, peer_r, vname))
            # permute
            ours = turbo.ops.moe_permute(x, idx, num_local_experts=e)[0]
            ok = torch.equal(ours, torch_permute(x.detach(), idx))
            t_o, t_p = bench_pair(
                (lambda: turbo.ops.moe_permute(x, idx, num_local_experts=e)[0], (x,)),
                (lambda: peer(xp, idx), (xp,)), g_perm, warmup=args.warmup_ms, rep=args.rep_ms,
                device=dev,
            )  # fmt: skip
            rows.append(_row(tid, label, "permute", t, d, e, k, ok, t_o, t_p, copy_gbs,
                             2 * n * d * elt, (n + t) * d * elt, vname))  # fmt: skip

            # unpermute (weighted by probs)
            _, row_map, _, _, _, _, pprobs = turbo.ops.moe_permute(
                x.detach(), idx, num_local_experts=e, probs=probs)  # fmt: skip
            pprobs = pprobs.detach()
            got = turbo.ops.moe_unpermute(y, row_map, permuted_probs=pprobs)[0]
            ok = compute_snr(ref_u, got) > SNR_MIN
            t_o, t_p = bench_pair(
                (lambda rm=row_map, pp=pprobs: turbo.ops.moe_unpermute(y, rm, permuted_probs=pp)[0],
                 (y,)),
                (lambda: peer_u(yp, idx, probs), (yp,)), g_un,
                warmup=args.warmup_ms, rep=args.rep_ms, device=dev,
            )  # fmt: skip
            rows.append(_row(tid, label, "unpermute", t, d, e, k, ok, t_o, t_p, copy_gbs,
                             (n + t) * d * elt, 2 * n * d * elt, vname))  # fmt: skip
    return rows


def _row(tid, label, op, t, d, e, k, ok, t_o, t_p, copy_gbs, fwd_b, bwd_b, variant) -> dict:
    row = {"TestID": tid, "Case": label, "Op": op, "Variant": variant, "T": t, "H": d, "E": e,
           "topk": k, "Check": "PASS" if ok else "FAIL", "copy GB/s": copy_gbs}  # fmt: skip
    for mode, key, nbytes in ((Mode.FWD, "Forward", fwd_b), (Mode.BWD, "Backward", bwd_b)):
        row[f"{key} Time (ms)"] = t_o[mode].median_ms
        row[f"{key} GB/s"] = gbps(nbytes, t_o[mode].median_ms)
        row[f"compile {key} GB/s"] = gbps(nbytes, t_p[mode].median_ms)
        row[f"{key} vs copy"] = ratio(row[f"{key} GB/s"], copy_gbs)
        row[f"{key} vs compile"] = ratio(row[f"{key} GB/s"], row[f"compile {key} GB/s"])
    return row


def _fp8_config(name: str):
    if name == "off":
        return None
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity

    return Float8QuantConfig(granularity=ScalingGranularity[name.upper()])


class LoopMoE(torch.nn.Module):
    """The peer: the same parameters run through the plain-PyTorch loop-of-experts layer."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        m = self.layer
        return moe_layer_ref(x, m.router_weight, m.w1, m.w2, m.topk, m.score_function, m.groups,
                             m.selected_groups, m.scaling_factor, m.activation)  # fmt: skip


class Bf16Twin(torch.nn.Module):
    """The ``--peer bf16`` peer: a bf16 MoELayer sharing the fp8 layer's parameters."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.twin = turbo.modules.MoELayer(
            layer.hidden_size, layer.ffn_hidden_size, layer.num_experts, layer.topk,
            score_function=layer.score_function, groups=layer.groups,
            selected_groups=layer.selected_groups, scaling_factor=layer.scaling_factor,
            activation=layer.activation, device=layer.w1.device, dtype=layer.w1.dtype,
        )  # fmt: skip
        self.twin.router_weight, self.twin.w1, self.twin.w2 = (
            layer.router_weight, layer.w1, layer.w2)  # fmt: skip

    def forward(self, x):
        return self.twin(x)


def bench_layer(tid, case, args, info) -> dict:
    label, t, d, f, e, k, fn, groups, sel = case
    dev = info.device
    snr_min = SNR_MIN if args.fp8 == "off" else 20.0  # E4M3 expert GEMMs vs the bf16 loop
    torch.manual_seed(tid)
    fp8 = args.fp8 != "off"
    layer = turbo.modules.MoELayer(
        d, f, e, k, score_function=fn, groups=groups, selected_groups=sel, device=dev,
        dtype=torch.bfloat16, fp8_config=_fp8_config(args.fp8),
        fp8_act=args.fp8_act if fp8 else None,
        fp8_weight_cache=_WCACHE[args.fp8_weight_cache] if fp8 else False,
    )  # fmt: skip
    # Non-uniform loads: every token shares a direction u, and expert e's router row gets
    # b_e * u with b_e = log(Gamma(3) load / mean), so popular experts win more often.
    gen = torch.Generator().manual_seed(tid)
    u = torch.randn(d, generator=gen)
    u = (u / u.norm()).to(dev)
    load = torch.distributions.Gamma(3.0, 1.0).sample((e,)).to(dev)
    with torch.no_grad():
        layer.router_weight.add_(torch.log(load / load.mean()).unsqueeze(1) * u)
    x0 = torch.randn(t, d, device=dev) + u
    x = x0.to(torch.bfloat16).requires_grad_()
    x_b = x.detach().clone().requires_grad_()
    peer = Bf16Twin(layer) if args.peer == "bf16" else LoopMoE(layer)
    out, ref = layer(x), peer(x_b)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    snr = {"out_snr": compute_snr(ref.float(), out.float()),
           "dx_snr": compute_snr(x_b.grad.float(), x.grad.float())}  # fmt: skip
    _, _, idx = turbo.ops.moe_router_topk(
        torch.nn.functional.linear(x.detach().float(), layer.router_weight.float()), k, groups,
        sel, fn)  # fmt: skip
    loads = torch.bincount(idx.reshape(-1), minlength=e).tolist()
    params = list(layer.parameters())
    t_o, t_p = bench_pair((lambda: layer(x), (x, *params)), (lambda: peer(x_b), (x_b, *params)),
                          g, warmup=args.warmup_ms, rep=args.rep_ms, device=dev)  # fmt: skip
    variant = args.fp8 if not fp8 else (
        f"{args.fp8}/{layer.fp8_act}/wcache-{args.fp8_weight_cache}")  # fmt: skip
    row = {"TestID": tid, "Case": label, "Op": "MoELayer", "FP8": variant, "T": t, "H": d,
           "F": f, "E": e, "topk": k, "Min Load": min(loads), "Max Load": max(loads), **snr,
           "Check": "PASS" if all(v > snr_min for v in snr.values()) else "FAIL"}  # fmt: skip
    flops = 2.0 * t * k * d * 3 * f  # gate|up (2F) + down (F)
    step_o = t_o[Mode.FWD].median_ms + t_o[Mode.BWD].median_ms
    step_p = t_p[Mode.FWD].median_ms + t_p[Mode.BWD].median_ms
    row.update({"Forward Time (ms)": t_o[Mode.FWD].median_ms,
                "Backward Time (ms)": t_o[Mode.BWD].median_ms, "Step Time (ms)": step_o,
                f"{args.peer} Step Time (ms)": step_p,
                f"{args.peer} Forward Time (ms)": t_p[Mode.FWD].median_ms,
                "Step TFLOPS": 3 * flops / (step_o * 1e-3) / 1e12,
                f"Forward vs {args.peer}": ratio(t_p[Mode.FWD].median_ms, t_o[Mode.FWD].median_ms),
                f"Step vs {args.peer}": ratio(step_p, step_o)})  # fmt: skip
    return row


_WCACHE = {"auto": None, "on": True, "off": False}  # --fp8-weight-cache -> MoELayer's argument
_LAYER_COLUMNS = ["Case", "FP8", "T", "H", "F", "E", "topk", "Min Load", "Max Load", "Check",
                  "Forward Time (ms)", "Step Time (ms)", "loop Step Time (ms)", "Step TFLOPS",
                  "Forward vs loop", "Step vs loop", "out_snr", "dx_snr"]  # fmt: skip
COLUMNS = {
    "ops": ["Case", "Op", "Variant", "T", "H", "E", "topk", "Check", "Forward Time (ms)",
            "Backward Time (ms)", "Forward GB/s", "Backward GB/s",
            "copy GB/s", "Forward vs copy", "Backward vs copy", "Forward vs compile",
            "Backward vs compile"],
    "layer": ["Case", "T", "H", "F", "E", "topk", "Min Load", "Max Load", "Check",
              "Step Time (ms)", "loop Step Time (ms)", "Step TFLOPS", "Forward vs loop",
              "Step vs loop", "out_snr", "dx_snr"],
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--part", choices=("ops", "layer", "all"), default="all")
    p.add_argument("--fp8", choices=("off", "tensorwise", "rowwise"), default="off",
                   help="MoELayer expert GEMMs in FP8 (the loop peer stays bf16)")  # fmt: skip
    p.add_argument("--fp8-act", choices=("op", "fused"), default=None,
                   help="MoELayer fp8_act: activations quantized in each GEMM, or upstream "
                   "(before the permutation / fused into SwiGLU; rowwise). Default: the "
                   "layer's (fused for rowwise, PRIMUS_TURBO_MOE_FP8_ACT)")  # fmt: skip
    p.add_argument(
        "--fp8-weight-cache",
        nargs="?",
        const="on",
        default="auto",
        choices=tuple(_WCACHE),
        help="MoELayer fp8_weight_cache: auto (the default: the layer's default = on, also "
        "under graph capture: the cached copies are graph inputs, refreshed in place by the "
        "optimizer step hook), on (bare flag, the same), off (quantized in every call)",
    )
    p.add_argument(
        "--peer",
        choices=("loop", "bf16"),
        default="loop",
        help="layer peer: the plain-PyTorch loop, or our bf16 MoELayer (same params)",
    )
    p.add_argument(
        "--variants",
        default=None,
        help="permute knob settings to compare in one process (the compiled peer is "
        "shared), ';'-separated, each NAME=VALUE[,NAME=VALUE] with NAME short for "
        "PRIMUS_TURBO_MOE_PERMUTE_NAME, e.g. 'IMPL=v1;GEOM=v2;GEOM=2d'",
    )
    p.add_argument(
        "--cases",
        default=None,
        help="comma-separated substrings of the case labels to run (default: all)",
    )
    add_common_args(p)
    args = p.parse_args(argv)
    profile, info = resolve_profile(args.profile)
    print(info.banner())
    notice = cpu_notice(info)
    cases = GPU_CASES if profile == "gpu" else CPU_CASES
    peer = args.peer
    COLUMNS["layer"] = [c.replace("loop", peer) for c in _LAYER_COLUMNS] + (
        [f"{peer} Forward Time (ms)"] if peer != "loop" else [])  # fmt: skip
    if args.cases:
        want = [w.strip().lower() for w in args.cases.split(",") if w.strip()]
        cases = [c for c in cases if any(w in c[0].lower() for w in want)]
    all_rows = []
    for part in ("ops", "layer") if args.part == "all" else (args.part,):
        results = Results(info)
        if part == "layer" and peer == "loop" and timing_mode() == "graph":
            # the loop peer reads expert loads on the host (it cannot be captured), and a failed
            # capture leaves the CUDA RNG in capture mode for the rest of the process (every
            # later case raised "Offset increment outside graph capture", call 11.5): both
            # layers are timed eagerly, launches included
            print("[layer] loop peer: eager timing for both layers (host syncs in the peer)")
            set_timing("eager")
        for tid, case in enumerate(cases, 1):
            try:
                rows = bench_permute(tid, case, args, info) if part == "ops" else [
                    bench_layer(tid, case, args, info)]  # fmt: skip
            except Exception as ex:
                print(f"  ERROR {case[0]} {part}: {type(ex).__name__}: {str(ex)[:300]}")
                rows = [{"TestID": tid, "Case": case[0], "Op": part, "Check": "ERROR"}]
            for r in rows:
                results.add(r)
            if info.device.type == "cuda":
                torch.cuda.empty_cache()
        print()
        print(results.markdown(COLUMNS[part]))
        ok = lambda r: r["Check"] == "PASS"  # noqa: E731
        keys = [c for c in COLUMNS[part] if " vs " in c]
        if part == "ops":
            for vname, _ in _variants(args.variants):
                for op in ("router", "permute", "unpermute"):
                    sel = lambda r, op=op, v=vname: (  # noqa: E731
                        r["Check"] == "PASS" and r["Op"] == op and r.get("Variant") == v
                    )
                    tag = f"{op} [{vname}]" if args.variants else op
                    print(f"Geomean {tag}: " + ", ".join(
                        f"{c} {geomean(results.column(c, sel)):.3f}" for c in keys))  # fmt: skip
        else:
            print("Geomean MoELayer: " + ", ".join(
                f"{c} {geomean(results.column(c, ok)):.3f}" for c in keys))  # fmt: skip
        all_rows += results.rows
    combined = Results(info)
    combined.rows = all_rows  # one tidy CSV: the Op column tells permute/unpermute/MoELayer
    name = f"moe_turbo_{args.part}_fp8-{args.fp8}_{info.date_compact}_{info.gpu}.csv"
    if args.fp8 != "off":
        act = args.fp8_act or "default"
        name = name.replace(f"fp8-{args.fp8}", f"fp8-{args.fp8}-{act}-vs-{peer}")
    print(f"Results saved to {combined.write_csv(output_path(args.output, name))}")
    if notice:
        print(notice)
    return 0 if all(r["Check"] == "PASS" for r in all_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
