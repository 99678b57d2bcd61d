"""FP8 grouped GEMM forward, session 9: the ``f8s`` kernel's group table from the group sizes
(``LENS``, the op's default without ``group_offs``: no zero-fill + cumsum launches;
``PRIMUS_TURBO_GROUPED_GEMM_FP8_LENS=0`` the old offsets path), bitwise equal to it."""

from __future__ import annotations

import importlib

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager, PrecisionType
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity
from primus_turbo.pytorch.ops.grouped_gemm_fp8 import quantize_grouped_weight
from tests.pytorch.test_utils import rand

pytestmark = pytest.mark.grouped_gemm

LENS = "PRIMUS_TURBO_GROUPED_GEMM_FP8_LENS"


def _case(lens, n, k, device, tail=0):
    torch.manual_seed(len(lens) + n + k)
    g, m = len(lens), sum(lens) + tail
    f8 = torch.float8_e4m3fn
    a = (torch.randn(m, k, device=device) * 4).to(f8)
    b = (torch.randn(g, n, k, device=device) * 4).to(f8)
    sa = torch.rand(m, device=device) + 0.25
    sb = torch.rand(g, n, device=device) + 0.25
    gl = torch.tensor(lens, dtype=torch.int64, device=device)
    offs = torch.zeros(g + 1, dtype=torch.int64, device=device)
    offs[1:] = gl.cumsum(0)
    return a, b, sa, sb, gl, offs


def _tma_skip(device):
    if device == "cuda" and (torch.version.hip or torch.cuda.get_device_capability()[0] < 9):
        pytest.skip("TMA descriptors need CUDA sm_90+")


def _plans(device):
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    fam = ArchFamily.CPU if device == "cpu" else ArchFamily.HOPPER
    return [(v, cfg) for v in mod.PRE_VARIANTS for cfg in mod.fp8_tma_configs(fam)]


def test_fp8_lens_table_bitwise(device):
    """``group_offs=None`` + ``group_lens``: every f8s tile bitwise equal to the offsets path
    (empty first / middle / last groups, remainders, rows past the groups zeroed); GPU adds a
    Qwen3-like K = 768 case."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    _tma_skip(device)
    cases = [([0, 5, 0, 20, 9, 0], 24, 48), ([40, 0, 7, 33, 16, 12, 25, 8], 24, 48)]
    if device == "cuda":
        qwen = [0, 300, 517, 1, 129, 0, 640, 255, 256, 1000, 77, 0, 384, 511, 2, 700, 64, 40]
        cases = [([512, 0, 1000, 3, 2048, 129, 0], 768, 1024), (qwen, 2048, 768)]
    bad = []
    for lens, n, k in cases:
        a, b, sa, sb, gl, offs = _case(lens, n, k, device, tail=3)
        for variant, cfg in _plans(device):
            want = mod.grouped_gemm_fp8_tma(a, b, offs, sa, sb, torch.bfloat16, cfg, variant)
            got = mod.grouped_gemm_fp8_tma(a, b, None, sa, sb, torch.bfloat16, cfg, variant,
                                           group_lens=gl)  # fmt: skip
            if not torch.equal(got, want) or got[sum(lens) :].any():
                bad.append(f"lens {lens} {variant} {cfg.name}")
    assert not bad, bad


def test_fp8_lens_other_plans_get_offsets(device):
    """A plan that is not f8s (``f8tma``) with ``group_offs=None``: offsets computed on the
    host, same result; ``launch_fp8_tma`` refuses lens for it."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    _tma_skip(device)
    a, b, sa, sb, gl, offs = _case([0, 5, 20, 9], 24, 48, device, tail=2)
    if device == "cuda":
        a, b, sa, sb, gl, offs = _case([0, 300, 1000, 77], 768, 1024, device, tail=2)
    cfg = mod.fp8_tma_configs(mod.arch_family(a.device))[0]
    want = mod.grouped_gemm_fp8_tma(a, b, offs, sa, sb, torch.bfloat16, cfg, "f8tma")
    got = mod.grouped_gemm_fp8_tma(a, b, None, sa, sb, torch.bfloat16, cfg, "f8tma",
                                   group_lens=gl)  # fmt: skip
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="lens needs"):
        mod.launch_fp8_tma(a, b, want, gl, sa, sb, cfg, 4, "f8tma", lens=True)


@pytest.mark.parametrize("prequant_b", [False, True], ids=["b", "qb"])
def test_fp8_op_lens_bitwise(prequant_b, monkeypatch, device):
    """The op (TRITON, rowwise, fwd + bwd) with LENS (default: no group_offs launches; the
    backward computes them) equals ``PRIMUS_TURBO_GROUPED_GEMM_FP8_LENS=0`` bitwise (K = 768
    on GPU, 384 on CPU)."""
    _tma_skip(device)
    monkeypatch.setenv(LENS, "0")
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON, precision=PrecisionType.FP8)
    lens, n, k = (
        ([5, 0, 20, 9], 24, 384) if device == "cpu" else ([300, 0, 1000, 7, 129], 2048, 768)
    )
    gl = torch.tensor(lens, dtype=torch.int64, device=device)
    a0 = rand(sum(lens), k, dtype=torch.bfloat16, device=device)
    b0 = rand(len(lens), n, k, dtype=torch.bfloat16, device=device)
    config = Float8QuantConfig(granularity=ScalingGranularity.ROWWISE)

    def run():
        a = a0.clone().requires_grad_()
        b = b0.clone().requires_grad_()
        bb = quantize_grouped_weight(b, config, trans_b=True) if prequant_b else b
        out = turbo.ops.grouped_gemm_fp8(a, bb, gl, trans_b=True, config=config)
        out.backward(torch.ones_like(out) * 0.5)
        return out.detach(), a.grad, b.grad

    want = run()
    monkeypatch.delenv(LENS)
    got = run()
    for name, x, y in zip(("out", "da", "db"), got, want, strict=True):
        assert torch.equal(x, y), name


def test_fp8_op_knob_env(monkeypatch):
    op = importlib.import_module("primus_turbo.pytorch.ops.grouped_gemm_fp8")

    monkeypatch.delenv(LENS, raising=False)
    assert op._lens_on()
    monkeypatch.setenv(LENS, "0")
    assert not op._lens_on()
    monkeypatch.setenv(LENS, "maybe")
    with pytest.raises(ValueError, match=LENS):
        op._lens_on()


@pytest.mark.gpu
def test_fp8_op_lens_graph_capture(monkeypatch, device):
    """Forward with LENS (default) captured in a CUDA graph: the replay equals the eager
    offsets path (``PRIMUS_TURBO_GROUPED_GEMM_FP8_LENS=0``)."""
    _tma_skip(device)
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON, precision=PrecisionType.FP8)
    lens, n, k = [300, 0, 1000, 7, 129], 2048, 768
    gl = torch.tensor(lens, dtype=torch.int64, device=device)
    a = rand(sum(lens), k, dtype=torch.bfloat16, device=device)
    b = rand(len(lens), n, k, dtype=torch.bfloat16, device=device)
    config = Float8QuantConfig(granularity=ScalingGranularity.ROWWISE)
    qb = quantize_grouped_weight(b, config, trans_b=True, keep_source=False)
    monkeypatch.setenv(LENS, "0")
    want = turbo.ops.grouped_gemm_fp8(a, qb, gl, trans_b=True, config=config)
    monkeypatch.delenv(LENS)
    turbo.ops.grouped_gemm_fp8(a, qb, gl, trans_b=True, config=config)  # warm up (compile)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = turbo.ops.grouped_gemm_fp8(a, qb, gl, trans_b=True, config=config)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
