"""FP8 flash attention (blockwise E4M3 q/k/v, fp8 Q K^T): SNR gates vs the fp32 reference.

Measured on random normal inputs: out ~27-28 dB, dq/dk/dv ~29-36 dB (interpreter, d32);
the gate is 25 dB (E4M3) for the output and 20 dB for the gradients (the backward is the
bf16 kernel at the fp8 forward's output/lse).
"""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity
from primus_turbo.pytorch.ops.attention_fp8 import flash_attn_fp8_func
from primus_turbo.pytorch.reference import attention_ref
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import snr_db

pytestmark = pytest.mark.attention

# (b, s, hq, hkv, d, causal)
CASES = (
    [(2, 1000, 8, 2, 128, True), (1, 4097, 8, 8, 128, False), (1, 2048, 16, 16, 256, True)]
    if HAS_GPU
    else [(1, 70, 2, 1, 32, True)]
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}_s{c[1]}_h{c[2]}x{c[3]}_d{c[4]}")
def test_flash_attn_fp8_snr(case, device):
    b, s, hq, hkv, d, causal = case
    torch.manual_seed(0)
    q = torch.randn(b, s, hq, d, device=device).bfloat16().requires_grad_()
    k = torch.randn(b, s, hkv, d, device=device).bfloat16().requires_grad_()
    v = torch.randn(b, s, hkv, d, device=device).bfloat16().requires_grad_()
    cfg = Float8QuantConfig(granularity=ScalingGranularity.BLOCKWISE, block_size=64)
    out, lse = flash_attn_fp8_func(q, k, v, causal=causal, return_lse=True, fp8_config=cfg)
    assert out.dtype == torch.bfloat16 and lse.shape == (b, hq, s)
    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref, _ = attention_ref(qr, kr, vr, None, causal)
    grad = torch.randn_like(ref)
    out.backward(grad.bfloat16())
    ref.backward(grad)
    assert snr_db(ref.detach(), out.detach().float()) >= 25.0
    for got, want in ((q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad)):
        assert snr_db(want, got.float()) >= 20.0


def test_flash_attn_fp8_bad_config(device):
    q = torch.randn(1, 8, 2, 16, device=device).bfloat16()
    cfg = Float8QuantConfig(granularity=ScalingGranularity.BLOCKWISE, block_size=128)
    with pytest.raises(ValueError, match="argument 'fp8_config'"):
        flash_attn_fp8_func(q, q, q, fp8_config=cfg)
    with pytest.raises(TypeError, match="bf16/fp16"):
        flash_attn_fp8_func(q.float(), q.float(), q.float())
