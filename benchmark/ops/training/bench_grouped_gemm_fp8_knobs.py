"""FP8 rowwise grouped GEMM forward (the op, ``b`` pre-quantized, ``a`` bf16 quantized in the
op) under env-knob settings, interleaved in ONE process vs our bf16 grouped GEMM (session 9).

For each case of ``config.RAGGED_GROUPED_GEMM_SPECS`` (``--models``, ``--layers``) and each
``--settings`` entry (space-separated ``KEY=VALUE``; ``default`` = no knob), ``--rounds``
interleaved rounds time (``--timing graph`` default: CUDA-graph replay, L2 flushed before each
sample):
* ``op``: ``turbo.ops.grouped_gemm_fp8(a, qb, group_lens)`` forward (no ``group_offs``, as
  ``bench_grouped_gemm_turbo.py`` calls it);
* ``quant``: the rowwise quantization of ``a`` alone (``quantize_fp8``) under the setting;
* once per round: the bf16 op ``turbo.ops.grouped_gemm(a, b, group_lens)`` (the peer) and the
  fp8 GEMM alone on pre-quantized operands with the op's default plan (``gemm``).
A figure is the median of its round medians; "vs bf16" = bf16 op / fp8 op. Every setting's
forward output is compared BITWISE with ``default`` (exit status 1 if any differs).

Keys: ``LENS`` = ``PRIMUS_TURBO_GROUPED_GEMM_FP8_LENS`` (default on; ``LENS=0`` the old
``group_offs`` path); any other key is taken as ``PRIMUS_TURBO_<KEY>`` (e.g. a future knob).
(Session 9 round 1 also had CHUNK / REV / QPDL / PDL: measured losers, removed; moe_notes.)

    python benchmark/ops/training/bench_grouped_gemm_fp8_knobs.py --models Qwen3-30B-A3B \\
        --settings default "LENS=0" -o out.csv
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parents[1])]  # config.py, harness.py
if str(_HERE.parents[2]) not in sys.path:
    sys.path.append(str(_HERE.parents[2]))

from bench_grouped_gemm_fp8_plans import ab_parser, ab_run, interleaved_medians  # noqa: E402
from config import ragged_grouped_gemm_cases  # noqa: E402

import primus_turbo.pytorch as turbo  # noqa: E402

SHORT = {"LENS": "PRIMUS_TURBO_GROUPED_GEMM_FP8_LENS"}


def parse_setting(text: str) -> tuple[str, dict[str, str]]:
    """``'LENS=0'`` -> ``('LENS=0', {env: value})``; ``default`` -> ``{}``."""
    text = text.strip()
    if text in ("", "default"):
        return "default", {}
    env = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--settings: expected KEY=VALUE items, got {item!r} in {text!r}")
        key = key.upper()
        env[SHORT.get(key, key if key.startswith("PRIMUS_TURBO_") else "PRIMUS_TURBO_" + key)] = (
            value
        )
    return text, env


class _Env:
    """Set ``env`` for the block (the knobs are read per call), restore afterwards."""

    def __init__(self, env: dict[str, str]):
        self.env, self.old = env, {}

    def __enter__(self):
        for k in set(SHORT.values()) | set(self.env):
            self.old[k] = os.environ.pop(k, None)
        os.environ.update(self.env)

    def __exit__(self, *exc):
        for k, v in self.old.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def _with_env(fn, env):
    def call():
        with _Env(env):
            return fn()

    return call


def _case_candidates(case, settings, device):
    """``(cands, same)``: the timed callables of one case and each setting's bitwise check."""
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import _quant_rows, quantize_grouped_weight
    from primus_turbo.pytorch.reference import group_offsets
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    config = Float8QuantConfig(granularity=ScalingGranularity.ROWWISE)
    f8, row = torch.float8_e4m3fn, ScalingGranularity.ROWWISE
    torch.manual_seed(case.seed)
    gl = torch.tensor(case.group_lens(), dtype=torch.int64, device=device)
    a = torch.randn(case.m, case.k, dtype=torch.bfloat16, device=device)
    b = torch.randn(case.g, case.n, case.k, dtype=torch.bfloat16, device=device) * 0.05
    qb = quantize_grouped_weight(b, config, trans_b=True, with_dgrad=False, keep_source=False)
    qa, sa = _quant_rows(a, f8, row)
    qbd, sbd = qb.data.qdata, qb.data.scale_inv.float().reshape(case.g, case.n)
    offs = group_offsets(gl)

    def op():
        return turbo.ops.grouped_gemm_fp8(a, qb, gl, trans_b=True, config=config)

    def quant():
        return _quant_rows(a, f8, row)

    cands = {
        "bf16 op": lambda: turbo.ops.grouped_gemm(a, b, gl, trans_b=True),
        "gemm": lambda: mod.grouped_gemm_fp8_tma(qa, qbd, offs, sa, sbd, torch.bfloat16),
    }
    ref, same = None, {}
    for name, env in settings:
        fn = _with_env(op, env)
        got = fn()  # compiles / tunes outside the timing
        ref = got if ref is None else ref
        same[name] = bool(torch.equal(got, ref))
        cands[f"op {name}"] = fn
        cands[f"quant {name}"] = _with_env(quant, env)
    return cands, same


def run(args) -> list[dict]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    settings = [parse_setting(s) for s in args.settings]
    rows, all_same = [], True
    cases = [c for c in ragged_grouped_gemm_cases(args.models, args.profile)
             if not args.layers or c.layer in args.layers]  # fmt: skip
    for case in cases:
        cands, same = _case_candidates(case, settings, device)
        all_same &= all(same.values())
        flops = 2.0 * case.m * case.n * case.k
        for fn in cands.values():
            fn()
        ms = interleaved_medians(cands, args)
        bf16 = ms["bf16 op"]
        base = ms[f"op {settings[0][0]}"]
        print(f"{case.label} G={case.g} M={case.m} N={case.n} K={case.k}: bf16 op {bf16:.4f} ms, "
              f"fp8 GEMM alone (default plan) {ms['gemm']:.4f} ms")  # fmt: skip
        for name, _ in settings:
            t, tq = ms[f"op {name}"], ms[f"quant {name}"]
            row_ = {"Case": case.label, "Setting": name, "op ms": t, "quant ms": tq,
                    "gemm ms": ms["gemm"], "bf16 ms": bf16, "vs bf16": bf16 / t,
                    "vs first": base / t, "op TFLOPS": flops / t / 1e9,
                    "bitwise": same[name]}  # fmt: skip
            rows.append(row_)
            print(f"  {name:40s} op {t:8.4f} ms  quant {tq:7.4f} ms  x{bf16 / t:.3f} vs bf16  "
                  f"x{base / t:.3f} vs {settings[0][0]}  bitwise={same[name]}")  # fmt: skip
    for name, _ in settings:
        sel = [r["vs bf16"] for r in rows if r["Setting"] == name]
        if sel:
            gm = statistics.geometric_mean(sel)
            print(f"Geomean {name}: x{gm:.3f} vs bf16 over {len(sel)} cases")
    return rows if all_same else [dict(r, failed=True) for r in rows]


def main(argv=None) -> int:
    p = ab_parser(__doc__)
    p.add_argument("--settings", nargs="+", default=["default"])
    rows = ab_run(p.parse_args(argv), run)
    return 1 if any(r.get("failed") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
