"""Flash attention over packed sequences (THD + cu_seqlens): forward, lse and grads vs the
fp32 reference run sequence by sequence; empty and length-1 sequences included."""

from __future__ import annotations

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager
from primus_turbo.pytorch.reference import attention_varlen_ref
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import assert_close, rand

pytestmark = pytest.mark.attention

# (q lengths, k lengths, hq, hkv, dqk, dv, causal, window)
CPU_CASES = [
    ([0, 1, 17, 5], [3, 0, 17, 9], 4, 2, 16, 16, True, (-1, -1)),
    ([1, 20, 0], [1, 7, 4], 2, 1, 48, 16, False, (3, 1)),  # qk 48 = 32 + 16 chunks
]
GPU_CASES = [
    ([0, 1, 17, 1000, 4097], [3, 0, 17, 1000, 4097], 8, 2, 128, 128, True, (-1, -1)),
    ([1, 1000, 0, 300], [1, 2000, 5, 100], 16, 16, 192, 128, True, (-1, -1)),
    ([513, 1, 2048], [513, 1, 2048], 8, 1, 64, 64, False, (-1, -1)),
    ([2048, 77], [2048, 77], 4, 4, 256, 256, True, (128, -1)),
]
CASES = GPU_CASES if HAS_GPU else CPU_CASES


def _cu(lengths, device):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                        device=device)  # fmt: skip


@pytest.mark.parametrize("backend", [BackendType.TRITON, BackendType.TORCH], ids=lambda b: b.name)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"q{c[0]}_k{c[1]}_h{c[2]}x{c[3]}_d{c[4]}")
def test_flash_attn_varlen(case, backend, device):
    lq, lk, hq, hkv, dqk, dv, causal, window = case
    GlobalBackendManager.set_attn_backend(backend)
    dtype = torch.bfloat16
    q = rand(sum(lq), hq, dqk, dtype=dtype, device=device, requires_grad=True)
    k = rand(sum(lk), hkv, dqk, dtype=dtype, device=device, requires_grad=True)
    v = rand(sum(lk), hkv, dv, dtype=dtype, device=device, requires_grad=True)
    cu_q, cu_k = _cu(lq, device), _cu(lk, device)
    out, lse = turbo.ops.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal, window_size=window, return_lse=True
    )
    assert out.shape == (sum(lq), hq, dv) and lse.shape == (hq, sum(lq))
    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref, ref_lse = attention_varlen_ref(qr, kr, vr, cu_q, cu_k, None, causal, window)
    assert_close(out, ref, dtype)
    assert torch.equal(torch.isinf(lse).cpu(), torch.isinf(ref_lse).cpu())
    fin = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[fin].cpu(), ref_lse[fin].cpu(), rtol=1e-3, atol=1e-3)
    grad = rand(*out.shape, dtype=dtype, device=device)
    out.backward(grad)
    ref.backward(grad.float())
    for got, want in ((q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad)):
        assert torch.isfinite(got).all()
        assert_close(got, want, dtype)


def test_varlen_bad_cu_seqlens(device):
    q = rand(8, 2, 16, dtype=torch.bfloat16, device=device)
    cu = torch.tensor([0, 8], dtype=torch.int64, device=device)
    with pytest.raises(TypeError, match="argument 'cu_seqlens_q' expected dtype"):
        turbo.ops.flash_attn_varlen_func(q, q, q, cu, cu, 8, 8)
    cu32 = cu.int()
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        bad = torch.zeros(3, dtype=torch.int32, device=device)
        turbo.ops.flash_attn_varlen_func(q, q, q, cu32, bad, 8, 8)
