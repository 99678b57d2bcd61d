"""flash_attn_func input checks added by the session-3 audit (kept apart from test_attention.py)."""

from __future__ import annotations

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager
from tests.pytorch.test_utils import rand

pytestmark = pytest.mark.attention


def test_zero_head_dim_is_rejected(device):
    """Dqk = 0 has no softmax scale (1/sqrt(0)): a clear error, not a ZeroDivisionError."""
    q = rand(1, 5, 2, 8, dtype=torch.bfloat16, device=device)[..., :0]
    v = rand(1, 5, 2, 8, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="flash_attn: argument 'q' expected a head dim >= 1"):
        turbo.ops.flash_attn_func(q, q, v)


@pytest.mark.parametrize("d", [80, 48])
def test_odd_head_dims_zero_lengths(d, device):
    """Non-power-of-two qk/v head dims with an empty query or key side: correct empty / zero
    outputs (rows that see no key are 0)."""
    q = rand(1, 5, 2, d, dtype=torch.bfloat16, device=device)
    out = turbo.ops.flash_attn_func(q[:, :0], q, q)
    assert out.shape == (1, 0, 2, d)
    out = turbo.ops.flash_attn_func(q, q[:, :0], q[:, :0])
    assert out.shape == (1, 5, 2, d) and not out.abs().any()


@pytest.mark.gpu
def test_head_offsets_past_2_31(device):
    """q = k: a bhsd view of a [1, 8, 2**21, 192] buffer (6 GiB) whose head stride is 2**21 * 192
    elements, so head 7 starts 2.8e9 elements in (int32 head offsets wrapped); split 192 qk dim.
    Forward and gradients match the same call on contiguous copies."""
    GlobalBackendManager.set_attn_backend(BackendType.TRITON)
    h, s, d, dv, s_pad = 8, 256, 192, 128, 1 << 21
    base = torch.empty(1, h, s_pad, d, dtype=torch.bfloat16, device=device)
    base[:, :, :s].copy_(rand(1, h, s, d, dtype=torch.bfloat16, device=device))
    qk = base[:, :, :s].transpose(1, 2).requires_grad_()  # [1, S, H, D], stride_h = 2**21 * 192
    v = rand(1, s, h, dv, dtype=torch.bfloat16, device=device, requires_grad=True)
    g = rand(1, s, h, dv, dtype=torch.bfloat16, device=device)
    out = turbo.ops.flash_attn_func(qk, qk, v, causal=True)
    dqk, dv_ = torch.autograd.grad(out, (qk, v), g)
    qk_c = qk.detach().contiguous().requires_grad_()
    v_c = v.detach().clone().requires_grad_()
    ref = turbo.ops.flash_attn_func(qk_c, qk_c, v_c, causal=True)
    dqk_ref, dv_ref = torch.autograd.grad(ref, (qk_c, v_c), g)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(dqk, dqk_ref, rtol=0, atol=0)
    torch.testing.assert_close(dv_, dv_ref, rtol=0, atol=0)
