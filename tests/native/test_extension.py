"""The native build: primus_turbo.pytorch._C and libprimus_turbo_kernels.so exist and load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import primus_turbo
from primus_turbo.build_info import build_info, native_ops, native_status
from tests.conftest import HAS_GPU

pytestmark = pytest.mark.rmsnorm


def test_extension_loads():
    ok, why = native_status()
    assert ok, why
    import primus_turbo.pytorch._C as ext

    lib = Path(ext.__file__).parent / "libprimus_turbo_kernels.so"
    assert lib.is_file(), f"{lib} missing (the kernels library sits next to _C)"
    assert hasattr(torch.ops.primus_turbo_cpp, "rmsnorm_fwd")
    assert ext.has_gpu_kernels() == (build_info()["framework"] in ("cuda", "rocm"))


def test_build_info():
    info = build_info()
    assert info["framework"] in ("cpu", "cuda", "rocm")
    assert info["git_commit"] == primus_turbo.git_commit or info["git_commit"] != ""
    if HAS_GPU:
        assert info["framework"] != "cpu", "a GPU machine should build the GPU extension"
        assert info["archs"], "GPU build without archs"


def test_cpp_ops_cpu_and_meta():
    ops = native_ops()
    x = torch.randn(3, 16, dtype=torch.float32)
    w = torch.randn(16, dtype=torch.float32)
    y, rstd = ops.rmsnorm_fwd(x, w, 1e-6)
    ref = torch.nn.functional.rms_norm(x, (16,), w, 1e-6)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    assert rstd.shape == (3,) and rstd.dtype == torch.float32
    ym, rm = ops.rmsnorm_fwd(x.to("meta"), w.to("meta"), 1e-6)
    assert ym.shape == (3, 16) and ym.device.type == "meta" and rm.shape == (3,)
    dx, dw = ops.rmsnorm_bwd(x.to("meta"), x.to("meta"), w.to("meta"), rm)
    assert dx.shape == (3, 16) and dw.shape == (16,)
    with pytest.raises(RuntimeError, match="argument 'weight' expected contiguous"):
        ops.rmsnorm_fwd(x, w[:8], 1e-6)
