"""TurboAttention inside a training step (projections + attention + loss + optimizer)."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core import BackendType, GlobalBackendManager
from primus_turbo.pytorch.modules import TurboAttention
from primus_turbo.pytorch.reference import attention_ref
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import assert_close, rand

pytestmark = pytest.mark.attention


@pytest.mark.parametrize("backend", [BackendType.TRITON, BackendType.TORCH], ids=lambda b: b.name)
def test_turbo_attention_training_step(backend, device):
    GlobalBackendManager.set_attn_backend(backend)
    torch.manual_seed(0)
    b, s, hq, hkv, d = (2, 256, 8, 2, 64) if HAS_GPU else (1, 17, 4, 2, 16)
    dim = hq * d
    proj_q = torch.nn.Linear(dim, hq * d, device=device, dtype=torch.bfloat16)
    proj_kv = torch.nn.Linear(dim, 2 * hkv * d, device=device, dtype=torch.bfloat16)
    attn = TurboAttention(causal=True)
    params = [*proj_q.parameters(), *proj_kv.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    x = rand(b, s, dim, dtype=torch.bfloat16, device=device)
    before = proj_q.weight.detach().clone()
    q = proj_q(x).view(b, s, hq, d)
    k, v = proj_kv(x).view(b, s, 2, hkv, d).unbind(2)
    out = attn(q, k, v)
    ref, _ = attention_ref(q.detach().float(), k.detach().float(), v.detach().float(), None, True)
    assert_close(out, ref, torch.bfloat16)
    out.float().pow(2).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)
    opt.step()
    assert not torch.equal(before, proj_q.weight)
    assert "causal=True" in repr(attn)


def test_turbo_attention_rejects_context_parallel():
    with pytest.raises(NotImplementedError, match="ulysses_group"):
        TurboAttention(ulysses_group=object())
