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
