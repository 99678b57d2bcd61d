"""modules.Linear against torch.nn.Linear: forward, every gradient, compile, bad input."""

from __future__ import annotations

import pytest
import torch

import primus_turbo.pytorch as turbo
from tests.pytorch.test_utils import assert_close, rand


def _pair(in_f, out_f, bias, dtype, device):
    ours = turbo.modules.Linear(in_f, out_f, bias=bias, device=device, dtype=dtype)
    ref = torch.nn.Linear(in_f, out_f, bias=bias, device=device, dtype=torch.float32)
    with torch.no_grad():
        ref.weight.copy_(ours.weight.float())
        if bias:
            ref.bias.copy_(ours.bias.float())
    return ours, ref


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(5, 24), (2, 3, 24), (0, 24)], ids=str)
def test_linear_matches_torch(shape, dtype, bias, device):
    ours, ref = _pair(24, 19, bias, dtype, device)
    x = rand(*shape, dtype=dtype, device=device, requires_grad=True)
    x_ref = x.detach().float().requires_grad_()
    y = ours(x)
    y_ref = ref(x_ref)
    assert y.shape == (*shape[:-1], 19) and y.dtype == dtype
    assert_close(y, y_ref, dtype)
    grad = rand(*y.shape, dtype=dtype, device=device)
    y.backward(grad)
    y_ref.backward(grad.float())
    assert_close(x.grad, x_ref.grad, dtype)
    assert_close(ours.weight.grad, ref.weight.grad, dtype)
    if bias:
        assert_close(ours.bias.grad, ref.bias.grad, dtype)


def test_linear_training_step_compiled(device):
    """Two Linear layers in a compiled training step (default dispatch) track torch.nn.Linear
    over 3 SGD steps."""
    torch._dynamo.reset()
    ours = torch.nn.Sequential(
        turbo.modules.Linear(16, 32, device=device),
        torch.nn.GELU(),
        turbo.modules.Linear(32, 8, device=device),
    )
    ref = torch.nn.Sequential(
        torch.nn.Linear(16, 32, device=device),
        torch.nn.GELU(),
        torch.nn.Linear(32, 8, device=device),
    )
    ref.load_state_dict(ours.state_dict())
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    step = torch.compile(lambda m, x: m(x).square().mean(), fullgraph=True)
    for _ in range(3):
        x = rand(10, 16, dtype=torch.float32, device=device)
        loss = step(ours, x)
        loss_ref = ref(x).square().mean()
        for o, lo in ((opt, loss), (opt_ref, loss_ref)):
            o.zero_grad()
            lo.backward()
            o.step()
        torch.testing.assert_close(loss, loss_ref, rtol=1e-4, atol=1e-5)
    for p, q in zip(ours.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_linear_bad_input(device):
    m = turbo.modules.Linear(8, 4, device=device)
    with pytest.raises(ValueError, match=r"Linear: argument 'x' expected a tensor \[\.\.\., 8\]"):
        m(torch.randn(3, 7, device=device))


def test_linear_repr():
    assert "in_features=8, out_features=4, bias=True" in repr(turbo.modules.Linear(8, 4))
