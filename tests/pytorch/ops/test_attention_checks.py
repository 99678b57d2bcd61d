"""flash_attn_func input checks added by the session-3 audit (kept apart from test_attention.py)."""

from __future__ import annotations

import pytest
import torch

import primus_turbo.pytorch as turbo
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
