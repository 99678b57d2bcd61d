"""Which MoE piece breaks ``torch.cuda.make_graphed_callables`` (GPU): each piece is wrapped
and graphed in its own subprocess (a failed capture can leave the context unusable), after two
eager warm-up steps; prints OK or the exception per piece.

    python3 scripts/graphed_probe.py [piece ...]
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback

import torch

PIECES = ("router", "permute", "gemm", "swiglu", "unpermute", "layer", "layer_autograd_grad")
# NAME[:VAR=VALUE,...] runs NAME with those environment variables; "router_linear" is the
# layer's fp32 router (linear + top-k), "layer_qwen3" the layer at Qwen3-30B-A3B's shape


class Piece(torch.nn.Module):
    def __init__(self, name: str, t: int = 1024, d: int = 1024, f: int = 384, e: int = 16,
                 k: int = 4):  # fmt: skip
        super().__init__()
        import primus_turbo.pytorch as turbo

        self.turbo, self.name, self.e, self.k = turbo, name, e, k
        self.layer = turbo.modules.MoELayer(d, f, e, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(t, d, device="cuda", dtype=torch.bfloat16)
        logits = torch.nn.functional.linear(x.float(), self.layer.router_weight.float())
        _, probs, idx = turbo.ops.moe_router_topk(logits, k, 1, 1, "softmax")
        self.idx, self.probs = idx, probs.detach()
        self.lens = torch.bincount(idx.reshape(-1), minlength=e)
        self.shapes = {"router": (t, e), "permute": (t, d), "gemm": (t * k, d),
                       "swiglu": (t * k, 2 * f), "unpermute": (t * k, d), "layer": (t, d),
                       "layer_autograd_grad": (t, d), "router_linear": (t, d),
                       "torch_twice": (t, d), "layer_qwen3": (t, d)}  # fmt: skip

    def forward(self, x):
        ops, n = self.turbo.ops, self.name
        if n == "router":
            return ops.moe_router_topk(x, self.k, 1, 1, "softmax")[1]
        if n == "torch_twice":  # plain torch, x used by two branches
            r = torch.nn.functional.linear(x, self.layer.router_weight).sum(-1, keepdim=True)
            return r + x.float().softmax(-1).to(x.dtype)
        if n == "router_linear":
            logits = torch.nn.functional.linear(x.float(), self.layer.router_weight.float())
            return ops.moe_router_topk(logits, self.k, 1, 1, "softmax")[1]
        if n == "permute":
            return ops.moe_permute(x, self.idx, num_local_experts=self.e)[0]
        if n == "gemm":
            return ops.grouped_gemm(x, self.layer.w1, self.lens, trans_b=True)
        if n == "swiglu":
            return ops.swiglu_with_probs(x, self.probs.reshape(-1)[: x.shape[0]].contiguous())
        if n == "unpermute":
            row_map = ops.moe_permute(torch.zeros_like(x[: x.shape[0] // self.k]), self.idx,
                                      num_local_experts=self.e)[1]  # fmt: skip
            return ops.moe_unpermute(x, row_map)[0]
        return self.layer(x)


def _trace_loads() -> list[str]:
    """PROBE_TRACE=1: log every Triton module load (with the capture state and the Python stack)"""
    import traceback as tb

    from triton.compiler.compiler import CompiledKernel

    log: list[str] = []
    orig = CompiledKernel._init_handles

    def traced(self):
        if getattr(self, "module", None) is None:
            cap = torch.cuda.is_current_stream_capturing()
            log.append(f"load {self.name} capturing={cap}\n" + "".join(tb.format_stack(limit=12)))
        return orig(self)

    CompiledKernel._init_handles = traced
    return log


def run_one(name: str) -> str:
    torch.manual_seed(0)
    log = _trace_loads() if os.environ.get("PROBE_TRACE") == "1" else []
    m = Piece(name, 4096, 2048, 768, 128, 8) if name == "layer_qwen3" else Piece(name)
    shape = m.shapes[name]
    dtype = torch.float32 if name == "router" else torch.bfloat16
    sample = torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)
    params = [p for p in m.parameters() if p.requires_grad]
    for _ in range(2):  # PROBE_WARMUP=grad: autograd.grad (no .grad on the leaves)
        if os.environ.get("PROBE_WARMUP") == "grad":
            torch.autograd.grad(m(sample).float().sum(), [sample, *params], allow_unused=True)
        else:
            m(sample).float().sum().backward()
    torch.cuda.synchronize()
    try:
        if name == "layer_autograd_grad":  # one graph: forward + autograd.grad, as the benches
            g = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                torch.autograd.grad(m(sample), [sample, *params], g)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                torch.autograd.grad(m(sample), [sample, *params], g)
            graph.replay()
        else:
            graphed = torch.cuda.make_graphed_callables(m, (sample,), allow_unused_input=True)
            x = torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)
            graphed(x).float().sum().backward()
        torch.cuda.synchronize()
        return "OK" + "".join(f"\n{x}" for x in log if "capturing=True" in x)
    except Exception:  # noqa: BLE001
        loads = "".join(f"\n{x}" for x in log if "capturing=True" in x)
        return "FAIL\n" + traceback.format_exc(limit=-8) + f"\nloads while capturing:{loads}"


def main() -> int:
    names = sys.argv[1:] or list(PIECES)
    if len(names) == 1:
        print(f"{names[0]}: {run_one(names[0])}", flush=True)
        return 0
    for spec in names:
        n, _, env_text = spec.partition(":")
        env = dict(os.environ, **dict(kv.split("=", 1) for kv in env_text.split(",") if kv))
        r = subprocess.run([sys.executable, __file__, n], capture_output=True, text=True, env=env)
        out = r.stdout.strip() or f"{n}: no output (rc {r.returncode})\n{r.stderr[-3000:]}"
        print(f"[{spec}] {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
