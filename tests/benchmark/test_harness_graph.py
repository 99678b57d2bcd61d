"""GPU test of the harness's CUDA-graph timing (``--timing graph``): a forward whose autograd
graph is kept alive across the timing (as a benchmark's correctness check does) must not break
the captured backward, and nothing may fall back to eager timing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

HARNESS = Path(__file__).resolve().parents[2] / "benchmark" / "harness.py"

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def _harness():
    spec = importlib.util.spec_from_file_location("bench_harness_graph", HARNESS)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_harness_graph", mod)
    spec.loader.exec_module(mod)
    return mod


def test_graph_timing_of_backward_with_live_autograd_graph():
    h = _harness()
    h.set_timing("graph")
    h.resolve_profile("gpu")  # switches the process to the bench stream
    try:
        x = torch.randn(4096, 1024, device="cuda", requires_grad=True)
        w = torch.randn(1024, device="cuda", requires_grad=True)

        def fwd():
            return torch.nn.functional.rms_norm(x, (1024,), w)

        kept = fwd()  # a live graph holding the leaves' AccumulateGrad nodes
        kept.sum().backward(retain_graph=True)
        dy = torch.randn_like(kept)
        before = h._TIMING["fallbacks"]
        t = h.bench_modes(fwd, dy, [x, w], (h.Mode.FWD, h.Mode.BWD), 5.0, 20.0)
        assert h._TIMING["fallbacks"] == before, "graph capture fell back to eager timing"
        assert h.timing_mode() == "graph"
        assert t[h.Mode.FWD].median_ms > 0 and t[h.Mode.BWD].median_ms > 0
        # the RNG still works after the captures (a failed capture used to break it)
        torch.randn(16, device="cuda")
        del kept
    finally:
        torch.cuda.set_stream(torch.cuda.default_stream())
        h.set_timing("eager")


def test_graph_pair_interleaved_aa():
    """bench_pair in graph mode interleaves both sides' replays: an A/A pair (the same op on
    both sides) must read within a few percent, forward and backward, without falling back."""
    h = _harness()
    h.set_timing("graph")
    h.resolve_profile("gpu")
    try:
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        dy = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        before = h._TIMING["fallbacks"]
        t, p = h.bench_pair(
            (lambda: a @ b.t(), (a, b)), (lambda: a2 @ b2.t(), (a2, b2)), dy, rep=60.0
        )
        assert h._TIMING["fallbacks"] == before
        for mode in (h.Mode.FWD, h.Mode.BWD):
            assert t[mode].median_ms > 0 and p[mode].median_ms > 0
            assert 0.9 < t[mode].median_ms / p[mode].median_ms < 1.1, (mode, t[mode], p[mode])
        assert a.grad is None and a2.grad is None  # captured steps use autograd.grad
    finally:
        torch.cuda.set_stream(torch.cuda.default_stream())
        h.set_timing("eager")
