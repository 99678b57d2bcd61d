"""GroupedLinear: per-expert ``x_g @ W_g^T`` vs the fp32 reference, eager and compiled."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core import BackendType, GlobalBackendManager
from primus_turbo.pytorch.modules import GroupedLinear
from primus_turbo.pytorch.reference import grouped_gemm_ref
from tests.pytorch.test_utils import assert_close, rand

pytestmark = pytest.mark.grouped_gemm


def _run(module, lens, device, compile_=False):
    x = rand(sum(lens), module.in_features, dtype=torch.bfloat16, device=device, requires_grad=True)
    gl = torch.tensor(lens, dtype=torch.int64, device=device)
    fn = torch.compile(module, fullgraph=True) if compile_ else module
    out = fn(x, gl)
    assert out.shape == (sum(lens), module.out_features) and out.dtype == torch.bfloat16
    grad = rand(*out.shape, dtype=torch.bfloat16, device=device)
    out.backward(grad)
    x_ref = x.detach().float().requires_grad_()
    w_ref = module.weight.detach().float().requires_grad_()
    ref = grouped_gemm_ref(x_ref, w_ref, gl.cpu(), True, torch.float32)
    ref.backward(grad.float())
    assert_close(out, ref, torch.bfloat16)
    assert_close(x.grad, x_ref.grad, torch.bfloat16)
    assert_close(module.weight.grad, w_ref.grad, torch.bfloat16)


@pytest.mark.parametrize("backend", [BackendType.TORCH, BackendType.TRITON], ids=lambda b: b.name)
def test_grouped_linear(backend, device):
    GlobalBackendManager.set_grouped_gemm_backend(backend)
    module = GroupedLinear(3, 24, 16, device=device, dtype=torch.bfloat16)
    assert module.weight.shape == (3, 16, 24)
    _run(module, [5, 0, 12], device)


def test_grouped_linear_compile(device):
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)
    torch._dynamo.reset()
    module = GroupedLinear(2, 16, 16, device=device, dtype=torch.bfloat16)
    _run(module, [7, 9], device, compile_=True)


def test_grouped_linear_init_and_repr():
    module = GroupedLinear(4, 32, 8)
    bound = 1 / 32**0.5  # kaiming_uniform(a=sqrt(5)) on fan_in=32, as nn.Linear
    assert module.weight.abs().max() <= bound + 1e-6
    assert not torch.equal(module.weight[0], module.weight[1])
    assert "group_num=4, in_features=32, out_features=8" in repr(module)


def test_grouped_linear_bad_input(device):
    module = GroupedLinear(2, 8, 4, device=device, dtype=torch.bfloat16)
    x = rand(5, 7, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match=r"GroupedLinear: argument 'x' expected a tensor \[M, 8\]"):
        module(x, torch.tensor([2, 3], device=device))
