"""The Hopper grouped GEMM op (``primus_turbo_cpp::grouped_gemm_bf16_nt_hopper``,
csrc/kernels/grouped_gemm_hopper.cu): against the fp32 reference on ragged groups (empty groups,
a 1-row group, lengths and N / K that are not multiples of the tile, rows past the last group),
for both cluster sizes and the A/B variants; bitwise repeatable; CUDA-graph replay; the argument
checks (Meta everywhere, CUDA on the GPU)."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_cuda import (
    grouped_gemm_hopper,
    hopper_available,
)
from primus_turbo.pytorch.reference import group_offsets
from tests.conftest import HAS_GPU

pytestmark = pytest.mark.grouped_gemm

_KERNEL = HAS_GPU and hopper_available(torch.device("cuda"))
_SKIP_GPU = pytest.mark.skipif(
    not _KERNEL, reason="needs an sm_90 GPU and a CUDA build of primus_turbo with 9.0a"
)
CASES = [  # (group lens, rows past the last group, N, K)
    ([128, 256], 0, 256, 64),
    ([1, 0, 300, 77, 0, 513], 0, 264, 136),
    ([0, 0, 5], 19, 8, 8),
    ([1000, 24, 0, 2049], 7, 1536, 2048),
    ([3] * 37, 0, 520, 72),
    ([0, 0], 5, 16, 16),
]


def _native_op():
    from primus_turbo.build_info import native_status

    ok, _ = native_status()
    if not ok:
        pytest.skip("primus_turbo.pytorch._C is not built")
    from primus_turbo.build_info import native_ops

    return native_ops().grouped_gemm_bf16_nt_hopper


def _inputs(lens, tail, n, k, seed=0):
    torch.manual_seed(seed + n + k + len(lens))
    g, m = len(lens), sum(lens) + tail
    a = torch.randn((m, k), device="cuda", dtype=torch.bfloat16)
    b = (torch.randn((g, n, k), device="cuda") / k**0.5).to(torch.bfloat16)
    offs = group_offsets(torch.tensor(lens, dtype=torch.int64, device="cuda"))
    return a, b, offs


def _reference(a, b, lens):
    out = torch.zeros((a.shape[0], b.shape[1]), device=a.device, dtype=torch.float64)
    s = 0
    for i, n in enumerate(lens):
        out[s : s + n] = a[s : s + n].double() @ b[i].double().t()
        s += n
    return out


@_SKIP_GPU
@pytest.mark.parametrize("cluster,variant", [(1, 0), (1, 1), (1, 2), (1, 4), (2, 0), (2, 6)])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_hopper_matches_reference(case, cluster, variant):
    lens, tail, n, k = CASES[case]
    a, b, offs = _inputs(lens, tail, n, k)
    out = grouped_gemm_hopper(a, b, offs, cluster, variant)
    ref = _reference(a, b, lens)
    scale = ref.abs().max().item() or 1.0
    assert not out.isnan().any()
    err = (out.double() - ref).abs().max().item() / scale
    assert err < 8e-3, f"lens={lens} tail={tail} N={n} K={k} c{cluster} v{variant}: {err:.2e}"
    assert torch.all(out[sum(lens) :] == 0), "rows past the last group must be zero"


@_SKIP_GPU
def test_hopper_repeatable_and_graph():
    lens, tail, n, k = CASES[3]
    a, b, offs = _inputs(lens, tail, n, k)
    first = grouped_gemm_hopper(a, b, offs)
    assert torch.equal(first, grouped_gemm_hopper(a, b, offs))  # no atomics: bitwise
    assert torch.equal(first, grouped_gemm_hopper(a, b, offs, 1))  # same sums per element
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        grouped_gemm_hopper(a, b, offs)  # warm-up (attributes, occupancy query) off the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = grouped_gemm_hopper(a, b, offs)
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, grouped_gemm_hopper(a, b, offs))


def _check_args(op, dev):
    a = torch.empty(64, 32, dtype=torch.bfloat16, device=dev)
    b = torch.empty(2, 16, 32, dtype=torch.bfloat16, device=dev)
    offs = torch.zeros(3, dtype=torch.int64, device=dev)
    out = torch.empty(64, 16, dtype=torch.bfloat16, device=dev)
    op(a, b, offs, out, 2, 0)
    bad = [
        ((a.float(), b, offs, out, 2, 0), "argument 'a'"),
        ((a, b[:, :12], offs, out, 2, 0), "argument 'b'"),
        (
            (a, torch.empty(2, 12, 32, dtype=torch.bfloat16, device=dev), offs, out[:, :12], 2, 0),
            "multiples of 8",
        ),  # fmt: skip
        ((a, b[:, :, :24].contiguous(), offs, out, 2, 0), "expected K = 32"),
        ((a, b, offs[:2], out, 2, 0), "argument 'offs'"),
        ((a, b, offs.int(), out, 2, 0), "argument 'offs'"),
        ((a, b, offs, out[:, :8], 2, 0), "argument 'out'"),
        ((a, b, offs, out, 3, 0), "argument 'cluster'"),
        ((a, b, offs, out, 2, 8), "argument 'variant'"),
        (
            (
                a,
                torch.empty(1025, 16, 32, dtype=torch.bfloat16, device=dev),
                torch.zeros(1026, dtype=torch.int64, device=dev),
                out,
                2,
                0,
            ),
            "groups",
        ),  # fmt: skip
    ]
    for args, match in bad:
        with pytest.raises(RuntimeError, match=match):
            op(*args)


def test_hopper_op_checks_meta():
    """The argument checks run in every build (the Meta registration)."""
    _check_args(_native_op(), "meta")


@_SKIP_GPU
def test_hopper_op_checks_cuda():
    _check_args(_native_op(), "cuda")
