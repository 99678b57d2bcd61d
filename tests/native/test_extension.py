"""The native build: primus_turbo.pytorch._C and libprimus_turbo_kernels.so exist and load."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import primus_turbo
from primus_turbo.build_info import build_info, native_has_gpu, native_ops, native_status
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


# Bad arguments reach the raw C++ ops (the public API checks them in Python first). They run in a
# child process (bad_args_child.py, also runnable by hand): a crash while raising (the H200 CUDA
# build died with SIGSEGV here) then fails this test with the child's stages, exception types and
# native stack instead of killing the pytest worker.
_CHILD = Path(__file__).with_name("bad_args_child.py")


def _run_bad_args(device: str) -> None:
    cmd = [sys.executable, str(_CHILD), device]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if res.returncode == 0 and "BAD-ARGS-OK" in res.stdout:
        return
    detail = res.stderr[-9000:]  # the child echoes every stage to stderr too
    gdb = shutil.which("gdb")
    if gdb and res.returncode < 0:  # crashed: rerun under gdb for the native stack
        g = subprocess.run(
            [gdb, "-batch", "-ex", "run", "-ex", "bt 40", "--args", *cmd],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        detail += "\n--- gdb ---\n" + g.stdout[-8000:]
    print(detail, file=sys.stderr)  # also in the captured output of a -s / -rA run
    pytest.fail(f"bad-argument child (device {device}) rc={res.returncode}:\n{detail}")


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_cpp_ops_bad_args_cpu(device):
    native_ops()  # fails here, not in the child, when the extension is missing
    _run_bad_args(device)


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU build and device")
def test_cpp_ops_bad_args_gpu():
    if not native_has_gpu():
        pytest.fail("GPU machine but the extension has no GPU kernels")
    _run_bad_args("cuda")
