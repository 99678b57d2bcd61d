"""Platform helpers that must be right without a GPU: arch families, fp8 dtypes, checks."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from primus_turbo.pytorch.core import platform as pf
from primus_turbo.pytorch.core.checks import check, check_same_device, check_tensor
from primus_turbo.pytorch.core.platform import ArchFamily, arch_family_of, fp8_dtypes_for
from tests.conftest import HAS_GPU


@pytest.mark.parametrize(
    "arch,cap,family",
    [
        ("gfx942", None, ArchFamily.CDNA3),
        ("gfx950", None, ArchFamily.CDNA4),
        ("gfx90a", None, ArchFamily.OTHER_GPU),
        (None, (9, 0), ArchFamily.HOPPER),
        (None, (8, 0), ArchFamily.OTHER_GPU),
        (None, None, ArchFamily.CPU),
    ],
)
def test_arch_family_of(arch, cap, family):
    assert arch_family_of(arch, cap) == family


def test_fp8_dtypes_per_arch():
    assert fp8_dtypes_for("gfx942") == (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
    assert fp8_dtypes_for("gfx950") == (torch.float8_e4m3fn, torch.float8_e5m2)
    assert fp8_dtypes_for(None) == (torch.float8_e4m3fn, torch.float8_e5m2)


def test_cpu_device_helpers():
    assert pf.device_kind("cpu") == pf.DeviceKind.CPU
    assert pf.arch_family("cpu") == ArchFamily.CPU
    assert pf.fp8_dtypes("cpu") == (torch.float8_e4m3fn, torch.float8_e5m2)
    assert pf.warp_size("cpu") == 32


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU answers")
def test_no_gpu_answers():
    assert pf.amd_arch() is None and pf.cuda_capability() is None
    assert pf.arch_family() == ArchFamily.CPU and pf.device_name() == "cpu"
    assert not pf.is_graph_capturing()


@pytest.mark.gpu
def test_gpu_answers():
    fam = pf.arch_family()
    assert fam != ArchFamily.CPU
    if pf.is_rocm():
        assert pf.amd_arch() in ("gfx942", "gfx950") or fam == ArchFamily.OTHER_GPU
        assert pf.warp_size() == 64
    else:
        assert pf.cuda_capability() is not None and pf.warp_size() == 32


def test_import_does_not_touch_the_device():
    code = (
        "import torch, unittest.mock as m\n"
        "with m.patch.object(torch.cuda, 'get_device_properties', side_effect=AssertionError),"
        " m.patch.object(torch.cuda, 'current_device', side_effect=AssertionError):\n"
        "    import primus_turbo.pytorch, primus_turbo.triton.gemm.gemm_kernel\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_log_level_env():
    code = (
        "import logging; from primus_turbo.pytorch.core.logging import get_logger;"
        "print(get_logger().level == logging.DEBUG)"
    )
    env = {"PRIMUS_TURBO_LOG_LEVEL": "debug", "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "True", out.stderr


def test_check_messages():
    with pytest.raises(ValueError, match=r"^primus_turbo.op: argument 'x' expected 3, got 4$"):
        check(False, "op", "x", "3", 4)
    with pytest.raises(TypeError, match=r"argument 't' expected dtype in \{float16\}, got"):
        check_tensor("op", "t", torch.ones(2), dtypes=(torch.float16,))
    with pytest.raises(ValueError, match=r"expected a 2/3-D tensor, got shape \(2,\)"):
        check_tensor("op", "t", torch.ones(2), ndim=(2, 3))
    with pytest.raises(RuntimeError, match=r"argument 'a/b' expected all tensors on one device"):
        check_same_device("op", a=torch.ones(1), b=torch.ones(1, device="meta"))
