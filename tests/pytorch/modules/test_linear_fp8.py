"""Float8Linear: a drop-in for Linear in a training step, per recipe; from_float; compile."""

from __future__ import annotations

import pytest
import torch

from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity
from primus_turbo.pytorch.modules.float8_linear import Float8Linear
from tests.conftest import HAS_GPU
from tests.pytorch.test_utils import snr_db

pytestmark = pytest.mark.gemm_fp8

DEV = "cuda" if HAS_GPU else "cpu"
G = ScalingGranularity
RECIPES = [
    Float8QuantConfig(),
    Float8QuantConfig(granularity=G.ROWWISE),
    Float8QuantConfig(format=Format.HYBRID, granularity=G.BLOCKWISE, block_size=128),
]
SHAPE = (4, 64, 1024, 768) if HAS_GPU else (2, 8, 128, 32)  # batch, seq, in, out


@pytest.mark.parametrize("cfg", RECIPES, ids=lambda c: f"{c.format.name}-{c.granularity.name}")
def test_float8_linear_matches_linear(cfg):
    if not HAS_GPU and cfg.granularity == G.ROWWISE:
        pytest.skip("CPU tier: two recipes (interpreter time budget)")
    b, s, i, o = SHAPE
    torch.manual_seed(0)
    ref = torch.nn.Linear(i, o, device=DEV, dtype=torch.float32)
    mod = Float8Linear.from_float(ref, config=cfg, inplace=False).to(torch.bfloat16)
    x = torch.randn(b, s, i, device=DEV)
    x_ref = x.clone().requires_grad_()
    x8 = x.to(torch.bfloat16).requires_grad_()
    y_ref = ref(x_ref)
    y = mod(x8)
    assert y.shape == (b, s, o) and y.dtype == torch.bfloat16
    grad = torch.randn_like(y_ref)
    y_ref.backward(grad)
    y.backward(grad.to(torch.bfloat16))
    assert snr_db(y_ref, y) >= 20
    assert snr_db(x_ref.grad, x8.grad) >= 20
    assert snr_db(ref.weight.grad, mod.weight.grad) >= 20
    assert snr_db(ref.bias.grad, mod.bias.grad) >= 20


def test_training_step_reduces_loss():
    b, s, i, o = SHAPE
    torch.manual_seed(0)
    mod = Float8Linear(i, o, device=DEV, dtype=torch.bfloat16)
    opt = torch.optim.SGD(mod.parameters(), lr=0.1)
    x = torch.randn(b * s, i, device=DEV, dtype=torch.bfloat16)
    target = torch.randn(b * s, o, device=DEV, dtype=torch.bfloat16) * 0.1
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(mod(x).float(), target.float())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_from_float_inplace_shares_parameters():
    lin = torch.nn.Linear(32, 16)
    w = lin.weight
    out = Float8Linear.from_float(lin)
    assert out is lin and isinstance(out, Float8Linear) and out.weight is w
    assert out.config == Float8QuantConfig()


def test_float8_linear_under_torch_compile():
    """gemm_fp8 is a graph break (dynamo-disabled, like the reference); the module still
    compiles and matches eager."""
    torch.manual_seed(0)
    mod = Float8Linear(128, 32, device=DEV, dtype=torch.bfloat16)
    x = torch.randn(16, 128, device=DEV, dtype=torch.bfloat16)
    compiled = torch.compile(mod, backend="eager" if not HAS_GPU else "inductor")
    torch.testing.assert_close(compiled(x), mod(x), rtol=0, atol=0)


def test_bad_input_shape():
    mod = Float8Linear(32, 16)
    with pytest.raises(ValueError, match="Float8Linear"):
        mod(torch.randn(4, 31))
