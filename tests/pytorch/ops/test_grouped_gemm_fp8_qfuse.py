"""FP8 rowwise grouped GEMM forward, session 11: plan ``f8q`` (``PRIMUS_TURBO_GROUPED_GEMM_FP8_
QFUSE = Q``: the rowwise quantization of ``a`` inside the GEMM's launch, ``Q`` quantizing
programs flagging row segments, the other programs' tiles waiting for them), bitwise equal to
the two launches (``quantize_fp8`` rowwise, then ``f8s`` on the same 128x128 / interpreter
tile)."""

from __future__ import annotations

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager, PrecisionType
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity
from primus_turbo.pytorch.ops.grouped_gemm_fp8 import _quant_rows, quantize_grouped_weight
from tests.pytorch.test_utils import rand

pytestmark = pytest.mark.grouped_gemm

QFUSE = "PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE"
ELEMS = "PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_ELEMS"
ROWS = "PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_ROWS"
CHUNK = "PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_CHUNK"
DEPTH = "PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_DEPTH"
PF = "PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_PF"
_ROW = ScalingGranularity.ROWWISE


def _tma_skip(device):
    if device == "cuda" and (torch.version.hip or torch.cuda.get_device_capability()[0] < 9):
        pytest.skip("TMA descriptors need CUDA sm_90+")


def _operands(lens, n, k, device, tail=0, seed=0):
    torch.manual_seed(seed + len(lens) + n + k)
    g, m = len(lens), sum(lens) + tail
    a = rand(m, k, dtype=torch.bfloat16, device=device) * 3
    b = rand(g, n, k, dtype=torch.bfloat16, device=device)
    config = Float8QuantConfig(granularity=_ROW)
    qb = quantize_grouped_weight(b, config, trans_b=True, with_dgrad=False, keep_source=False)
    qbd = qb.data.qdata
    sbd = qb.data.scale_inv.float().reshape(g, n)
    gl = torch.tensor(lens, dtype=torch.int64, device=device)
    return a, qb, qbd, sbd, gl, config


def _two_launches(a, qbd, sbd, gl):
    """The op's default forward on the plan f8q uses: rowwise quantization, then f8s (LENS)."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_qfuse as qf
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    f8 = qbd.dtype
    qa, sa = _quant_rows(a, f8, _ROW)
    cfg = qf.qfuse_config(qf.arch_family(a.device))
    return mod.grouped_gemm_fp8_tma(qa, qbd, None, sa, sbd, torch.bfloat16, cfg, "f8s",
                                    group_lens=gl)  # fmt: skip


def _cases(device):
    if device == "cpu":  # 16x16x32 interpreter tiles: ragged, empty and sub-tile groups
        return [([0, 5, 0, 20, 9, 0], 24, 48, 3), ([40, 0, 7, 33, 16, 12], 40, 256, 0)]
    qwen = [0, 300, 517, 1, 129, 0, 640, 255, 256, 1000, 77, 0, 384, 511, 2, 700, 64, 40]
    return [(qwen, 2048, 768, 5), (qwen, 1536, 2048, 0), ([512, 0, 1000, 3, 129], 768, 1024, 0)]


@pytest.mark.parametrize("nq", [1, 3])
@pytest.mark.parametrize("knobs", ["default", "small"])
def test_qfuse_kernel_bitwise(nq, knobs, monkeypatch, device):
    """``grouped_gemm_fp8_qfuse`` equals the two launches bitwise (output and the zeroed rows
    past the groups) for 1 / 3 quantizing programs (GPU: 1 / 24) and default / small steps,
    segments and chunks."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_qfuse as qf

    _tma_skip(device)
    if knobs == "small":
        monkeypatch.setenv(ELEMS, "2048")
        monkeypatch.setenv(ROWS, "16")
        monkeypatch.setenv(CHUNK, "4")
        monkeypatch.setenv(DEPTH, "2")
        monkeypatch.setenv(PF, "0")
    if device == "cuda" and nq > 1:
        nq = 24
    bad = []
    for lens, n, k, tail in _cases(device):
        a, _, qbd, sbd, gl, _ = _operands(lens, n, k, device, tail)
        want = _two_launches(a, qbd, sbd, gl)
        got = qf.grouped_gemm_fp8_qfuse(a, qbd, sbd, gl, torch.bfloat16, qbd.dtype, nq)
        if not torch.equal(got, want) or got[sum(lens) :].any():
            bad.append(f"lens {lens} n {n} k {k}")
    assert not bad, bad


@pytest.mark.parametrize("prequant_b", [False, True], ids=["b", "qb"])
def test_qfuse_op_bitwise(prequant_b, monkeypatch, device):
    """The op (TRITON, rowwise) with ``QFUSE=2``: forward bitwise the two launches on the same
    tile, backward bitwise the default op's (it reads the saved ``a``, not the fp8 copy)."""
    _tma_skip(device)
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON, precision=PrecisionType.FP8)
    lens, n, k, tail = _cases(device)[0]
    a0, _, qbd, sbd, gl, config = _operands(lens, n, k, device, 0)
    b0 = rand(len(lens), n, k, dtype=torch.bfloat16, device=device)

    def run():
        a = a0.clone().requires_grad_()
        b = b0.clone().requires_grad_()
        bb = quantize_grouped_weight(b, config, trans_b=True) if prequant_b else b
        out = turbo.ops.grouped_gemm_fp8(a, bb, gl, trans_b=True, config=config)
        out.backward(torch.ones_like(out) * 0.5)
        return out.detach(), a.grad, b.grad

    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_qfuse as qf

    launches = []
    fused = qf.grouped_gemm_fp8_qfuse
    monkeypatch.setattr(qf, "grouped_gemm_fp8_qfuse", lambda *x: launches.append(1) or fused(*x))
    monkeypatch.delenv(QFUSE, raising=False)
    want = run()
    assert not launches
    monkeypatch.setenv(QFUSE, "2")
    got = run()
    assert launches == [1], "plan f8q did not run"
    qb = quantize_grouped_weight(b0, config, trans_b=True, with_dgrad=False, keep_source=False)
    ref = _two_launches(a0, qb.data.qdata, qb.data.scale_inv.float().reshape(len(lens), n), gl)
    assert torch.equal(got[0], ref), "out vs the two launches on the f8q tile"
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), "grads"
    torch.testing.assert_close(got[0].float(), want[0].float(), rtol=2e-2, atol=2e-2)


def test_qfuse_knob_env(monkeypatch):
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_qfuse as qf

    for var in (QFUSE, ELEMS, ROWS, CHUNK, DEPTH, PF):
        monkeypatch.delenv(var, raising=False)
    got = (qf.qfuse_programs(), qf.qfuse_elems(), qf.qfuse_rows(), qf.qfuse_chunk(),
           qf.qfuse_depth(), qf.qfuse_prefetch())  # fmt: skip
    assert got == (0, 4096, 32, 8, 3, 4)
    monkeypatch.setenv(QFUSE, "48")
    assert qf.qfuse_programs() == 48
    read = {QFUSE: qf.qfuse_programs, ELEMS: qf.qfuse_elems, ROWS: qf.qfuse_rows,
            CHUNK: qf.qfuse_chunk, DEPTH: qf.qfuse_depth, PF: qf.qfuse_prefetch}  # fmt: skip
    for var, bad in ((QFUSE, "many"), (QFUSE, "-1"), (ELEMS, "8192"), (ROWS, "20"),
                     (CHUNK, "3"), (DEPTH, "4"), (PF, "3")):  # fmt: skip
        monkeypatch.setenv(var, bad)
        with pytest.raises(ValueError, match=var):
            read[var]()
        monkeypatch.delenv(var)


def test_qfuse_not_usable_falls_back(monkeypatch, device):
    """K past the step (``next_pow2(K) > ELEMS``) or an fp32 output: the op's two launches."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_qfuse as qf

    _tma_skip(device)
    monkeypatch.setenv(QFUSE, "2")
    a, _, qbd, _, _, _ = _operands([5, 7], 32, 4112, device)
    assert not qf.qfuse_usable(a, qbd, torch.bfloat16, qbd.dtype)
    a, _, qbd, _, _, _ = _operands([5, 7], 32, 64, device)
    assert qf.qfuse_usable(a, qbd, torch.bfloat16, qbd.dtype)
    assert not qf.qfuse_usable(a, qbd, torch.float32, qbd.dtype)
    monkeypatch.setenv(QFUSE, "0")
    assert not qf.qfuse_usable(a, qbd, torch.bfloat16, qbd.dtype)


@pytest.mark.gpu
def test_qfuse_repeat_and_graph(monkeypatch, device):
    """Races: 20 launches at a Qwen3-30B-A3B-like size (16384 rows, 32 experts, K = 768 and
    2048; 8 / 48 quantizing programs) all bitwise the two launches; then the op captured
    in a CUDA graph (flags zeroed in the graph) replays to the same output."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_qfuse as qf

    _tma_skip(device)
    torch.manual_seed(11)
    lens = (torch.distributions.Gamma(3.0, 1.0).sample((32,)) * 170).long().tolist()
    lens[-1] += 16384 - sum(lens)
    lens[-1] = max(lens[-1], 0)
    for n, k in ((2048, 768), (1536, 2048)):
        a, qb, qbd, sbd, gl, config = _operands(lens, n, k, device)
        want = _two_launches(a, qbd, sbd, gl)
        for nq in (8, 48):
            for _ in range(10):
                got = qf.grouped_gemm_fp8_qfuse(a, qbd, sbd, gl, torch.bfloat16, qbd.dtype, nq)
                assert torch.equal(got, want), (n, k, nq)
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON, precision=PrecisionType.FP8)
    monkeypatch.setenv(QFUSE, "32")
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
