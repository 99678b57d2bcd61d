"""Print the Triton code Inductor generates for ``torch.compile(rmsnorm_ref)`` (the training
forward; with ``--backward`` also the backward) and the launch config each of its kernels ran
with, so the Triton RMSNorm forward can copy it.

    python scripts/dump_inductor_rmsnorm.py [--m 16384] [--n 8192] [--out FILE]

Prints every generated kernel (decorator + body) and, per kernel, the autotuner's configs
(XBLOCK/R0_BLOCK, num_warps, num_stages, registers, spills); ``--out`` also writes the whole
generated wrapper code to FILE.
"""

from __future__ import annotations

import argparse
import gc
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch._inductor.utils import run_and_get_code  # noqa: E402

from primus_turbo.pytorch.reference import rmsnorm_ref  # noqa: E402


def kernel_sources(code: str) -> list[str]:
    """The ``@triton_heuristics...`` decorated ``def triton_...`` blocks of one wrapper module
    (each kernel's source sits in a triple-quoted string passed to async_compile.triton)."""
    out = []
    for m in re.finditer(r"async_compile\.triton\('([^']+)', '''(.*?)'''", code, re.S):
        src = m.group(2)
        start = src.find("@triton_heuristics")
        out.append(f"# ---- kernel {m.group(1)}\n" + (src[start:] if start >= 0 else src))
    return out


def launch_configs() -> list[str]:
    """Configs of every Inductor CachingAutotuner alive now (the ones just run)."""
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError as e:
        return [f"(no CachingAutotuner: {e})"]
    lines = []
    alive = []
    for obj in gc.get_objects():
        try:
            if isinstance(obj, CachingAutotuner):
                alive.append(obj)
        except ReferenceError:  # dead weak proxies
            continue
    for obj in alive:
        name = getattr(getattr(obj, "fn", None), "__name__", "?")
        for launcher in getattr(obj, "launchers", []) or []:
            cfg = getattr(launcher, "config", None)
            lines.append(
                f"{name}: kwargs={getattr(cfg, 'kwargs', None)} "
                f"num_warps={getattr(cfg, 'num_warps', None)} "
                f"num_stages={getattr(cfg, 'num_stages', None)} "
                f"n_regs={getattr(launcher, 'n_regs', None)} "
                f"n_spills={getattr(launcher, 'n_spills', None)}"
            )
        cfgs = getattr(obj, "configs", None)
        if cfgs:
            lines.append(f"{name}: candidate configs {[str(c) for c in cfgs]}")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--m", type=int, default=16384)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--out", default="")
    p.add_argument("--backward", action="store_true", help="also run (and dump) the backward")
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    x = torch.randn(args.m, args.n, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = (1 + 0.1 * torch.randn(args.n, device=dev)).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(args.m, args.n, device=dev, dtype=torch.bfloat16)
    fn = torch.compile(rmsnorm_ref, dynamic=False)

    def step():
        y = fn(x, w)  # the training forward (inputs require grad), as the benchmark's peer
        if args.backward:
            y.backward(dy)
        if dev == "cuda":
            torch.cuda.synchronize()

    _, codes = run_and_get_code(step)
    print(f"torch {torch.__version__}, device {dev}, M={args.m} N={args.n} bf16: "
          f"{len(codes)} generated module(s)")  # fmt: skip
    for i, code in enumerate(codes):
        print(f"\n######## module {i}")
        for src in kernel_sources(code):
            print(src)
        calls = [ln.strip() for ln in code.splitlines() if ".run(" in ln]
        print("# launches:\n" + "\n".join(calls))
    print("\n######## launch configs")
    print("\n".join(launch_configs()) or "(none found)")
    if args.out:
        Path(args.out).write_text("\n\n".join(codes))
        print(f"wrapper code written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
