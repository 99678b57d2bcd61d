"""The vendor grouped GEMM wrapper (HIPBLASLT = torch._grouped_mm): its int32 offsets and the
tiny zero-fill kernels (interpreter on the CPU), and the unwritten regions on the GPU."""

from __future__ import annotations

import importlib

import pytest
import torch

from primus_turbo.pytorch.core import BackendType, GlobalBackendManager
from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_impl import GroupedGemmDispatcher
from primus_turbo.pytorch.reference import group_offsets, grouped_gemm_ref
from primus_turbo.triton.grouped_gemm.grouped_gemm_fixup import zero_empty_groups, zero_tail_rows
from tests.pytorch.test_utils import assert_close, rand

pytestmark = pytest.mark.grouped_gemm

_impl = importlib.import_module("primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_impl")
VENDOR = GroupedGemmDispatcher.backend_class(BackendType.HIPBLASLT)


@pytest.mark.parametrize(
    "m,n,ends", [(30, 20, [7, 19]), (5, 300, [5]), (40, 8, [0, 0]), (9, 3, [4, 50]), (6, 4, [])]
)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_zero_tail_rows(m, n, ends, dtype, device):
    out = rand(m, n, dtype=torch.bfloat16, device=device)
    want = out.clone()
    total = min(max(ends[-1], 0), m) if ends else 0
    want[total:] = 0
    got = zero_tail_rows(out, torch.tensor(ends, dtype=dtype, device=device))
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(got.cpu(), want.cpu())


@pytest.mark.parametrize("ends", [[3, 3, 10, 10], [0, 4, 4], [2, 5, 9], [5, 3, 4]], ids=str)
@pytest.mark.parametrize("pq", [(5, 6), (3, 1500), (7, 1500)], ids=str)
@pytest.mark.parametrize("max_split", [1024, 2], ids=str)
def test_zero_empty_groups(ends, pq, max_split, device, monkeypatch):
    """Each program zeroes its chunk of every empty group (``ends[g] <= ends[g - 1]``, the
    previous end, also for malformed non-monotonic ends); ``max_split`` 2 makes chunks of
    several blocks."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fixup

    monkeypatch.setattr(grouped_gemm_fixup, "_MAX_SPLIT", max_split)
    out = rand(len(ends), *pq, dtype=torch.bfloat16, device=device)
    want = out.clone()
    prev = 0
    for g, e in enumerate(ends):
        if e <= prev:
            want[g] = 0
        prev = e
    zero_empty_groups(out, torch.tensor(ends, dtype=torch.int32, device=device))
    assert torch.equal(out.cpu(), want.cpu())
    # a non-contiguous group block takes the masked_fill fallback
    base = rand(len(ends), pq[1], pq[0], dtype=torch.bfloat16, device=device)
    t = base.transpose(1, 2)
    want_t = t.clone()
    want_t[want.float().abs().sum((1, 2)) == 0] = 0
    zero_empty_groups(t, torch.tensor(ends, dtype=torch.int32, device=device))
    assert torch.equal(t.cpu(), want_t.cpu())


def test_vendor_offsets_are_int32_ends(device):
    lens = torch.tensor([3, 0, 5, 2], device=device)
    want = torch.tensor([3, 3, 8, 10], dtype=torch.int32)
    for offs in (None, group_offsets(lens)):
        got = VENDOR.prepare_offsets(lens, offs)
        assert got.dtype == torch.int32 and torch.equal(got.cpu(), want)
    ends = VENDOR.prepare_offsets(lens, None)
    assert VENDOR.prepare_offsets(lens, ends) is ends  # prepared once, reused by the backward


def _vendor_or_skip(device):
    a = torch.empty(1, 16, dtype=torch.bfloat16, device=device)
    b = torch.empty(1, 16, 16, dtype=torch.bfloat16, device=device)
    verdict = VENDOR.can_handle(a=a, b=b, trans_b=False, out_dtype=torch.bfloat16)
    if not verdict:
        pytest.skip(f"HIPBLASLT cannot run here: {verdict.reason}")


def test_vendor_fixup_auto_skips_only_where_probed(monkeypatch, device):
    """``auto``: the empty-group pass runs unless the device's probe said the vendor writes
    those blocks itself; the tail-row pass always runs. CPU: the probe is never run (False)."""
    monkeypatch.setattr(_impl, "_fixup_mode", lambda: "auto")
    ends = torch.tensor([3, 3, 7], dtype=torch.int32, device=device)
    key = (ends.device.type, ends.device.index)
    for probed, want_zero in ((True, False), (False, True)):
        monkeypatch.setitem(_impl._EMPTY_PROBE, key, probed)
        out = rand(3, 4, 5, dtype=torch.bfloat16, device=device)
        before = out.clone()
        _impl._vendor_fixup(out, ends, tail=False)
        assert torch.equal(out[1].float().cpu(), torch.zeros(4, 5)) == want_zero
        assert torch.equal(out[0].cpu(), before[0].cpu()) and torch.equal(out[2], before[2])
        rows = rand(9, 4, dtype=torch.bfloat16, device=device)
        _impl._vendor_fixup(rows, ends, tail=True)
        assert not rows[7:].any() and rows[:7].all()
    monkeypatch.delitem(_impl._EMPTY_PROBE, ("cpu", None), raising=False)
    assert _impl.vendor_zeroes_empty_groups(torch.device("cpu")) is False


@pytest.mark.gpu
def test_vendor_empty_group_probe_matches(device):
    """The probe's answer is what the vendor does on a larger product (NaN-filled memory)."""
    _vendor_or_skip(device)
    x = rand(300, 256, dtype=torch.bfloat16, device=device)
    _impl._EMPTY_PROBE.pop((x.device.type, x.device.index), None)
    probed = _impl.vendor_zeroes_empty_groups(x.device)
    y = rand(300, 512, dtype=torch.bfloat16, device=device)
    ends = torch.tensor([100, 100, 300, 300], dtype=torch.int32, device=device)
    junk = torch.full((4, 256, 512), float("nan"), dtype=torch.bfloat16, device=device)
    ptr = junk.data_ptr()
    del junk
    out = torch._grouped_mm(x.t(), y, offs=ends)
    if out.data_ptr() != ptr:
        pytest.skip("the vendor output did not land on the NaN-filled block")
    assert bool((out[1] == 0).all() & (out[3] == 0).all()) == probed


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["auto", "kernel", "masked_fill"])
def test_vendor_unwritten_regions_are_zero(mode, monkeypatch, device):
    """Rows past the last group end and empty groups' wgrad come out zero (on recycled,
    non-zero memory), with the default (probe), the kernel fix-up and the old masked_fill
    pass alike."""
    _vendor_or_skip(device)
    monkeypatch.setattr(_impl, "_fixup_mode", lambda: mode)
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.HIPBLASLT)
    junk = torch.full((1 << 20,), float("nan"), dtype=torch.bfloat16, device=device)
    del junk  # the caching allocator hands these NaN bytes to the next outputs
    lens = torch.tensor([64, 0, 120, 0], device=device)
    a = rand(200, 64, dtype=torch.bfloat16, device=device)  # 16 rows past sum(lens)
    b = rand(4, 32, 64, dtype=torch.bfloat16, device=device)
    out = GroupedGemmDispatcher.execute(
        BackendType.HIPBLASLT, a=a, b=b, group_lens=lens, group_offs=None, trans_b=True,
        out_dtype=torch.bfloat16,
    )  # fmt: skip
    assert torch.equal(out[184:].float().cpu(), torch.zeros(16, 32))
    ref = grouped_gemm_ref(a[:184].float(), b.float(), lens.cpu(), True, torch.float32)
    assert_close(out[:184], ref, torch.bfloat16)
    y = rand(200, 48, dtype=torch.bfloat16, device=device)
    wgrad = VENDOR.variable_k(a, y, lens, None, torch.bfloat16)
    assert wgrad.shape == (4, 64, 48)
    assert not wgrad[1].any() and not wgrad[3].any()
    assert wgrad[0].isfinite().all() and wgrad[2].isfinite().all()


@pytest.mark.parametrize("trans_b", [False, True], ids=["NN", "NT"])
@pytest.mark.parametrize("lens,k,n", [([1, 17, 0, 33], 40, 24)], ids=str)
def test_flat_kernel_variant(lens, k, n, trans_b, monkeypatch, device):
    """PRIMUS_TURBO_GROUPED_GEMM_KERNEL=flat (flattened tile loop, one-pass tile lookup, tail
    rows zeroed in their own loop): forward, dgrad and wgrad vs the reference, and the tail."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel
    from tests.pytorch.ops.test_grouped_gemm import _check_fwd_bwd

    monkeypatch.setattr(grouped_gemm_kernel, "kernel_variant", lambda: "flat")
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)
    _check_fwd_bwd(lens, k, n, trans_b, torch.bfloat16, device)
    a = rand(sum(lens) + 9, k, dtype=torch.bfloat16, device=device)  # rows past the groups
    b = rand(len(lens), k, n, dtype=torch.bfloat16, device=device)
    gl = torch.tensor(lens, device=device)
    out = grouped_gemm_kernel.grouped_gemm_triton(a, b, group_offsets(gl), False)
    assert torch.equal(out[sum(lens) :].float().cpu(), torch.zeros(9, n))
