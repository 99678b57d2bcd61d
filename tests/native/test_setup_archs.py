"""setup.py's arch handling (pure functions; no compiler runs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.rmsnorm

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup_mod():
    spec = importlib.util.spec_from_file_location("primus_setup", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # main() runs only under __main__
    return mod


def _torch(n_gpus=0, arch="gfx942:sramecc+:xnack-", cap=(9, 0)):
    props = SimpleNamespace(gcnArchName=arch)
    cuda = SimpleNamespace(
        is_available=lambda: n_gpus > 0,
        device_count=lambda: n_gpus,
        get_device_properties=lambda i: props,
        get_device_capability=lambda i: cap,
    )
    return SimpleNamespace(cuda=cuda)


@pytest.mark.parametrize(
    "value,expect",
    [("gfx942", ["gfx942"]), ("gfx950", ["gfx950"]), ("gfx942;gfx950", ["gfx942", "gfx950"])],
)
def test_rocm_archs_from_env(setup_mod, monkeypatch, value, expect):
    monkeypatch.setenv("GPU_ARCHS", value)
    assert setup_mod.rocm_archs(_torch()) == expect
    assert setup_mod._arch_flags("rocm", expect) == [f"--offload-arch={a}" for a in expect]


def test_rocm_native_and_unset(setup_mod, monkeypatch):
    monkeypatch.setenv("GPU_ARCHS", "native")
    assert setup_mod.rocm_archs(_torch(n_gpus=2)) == ["gfx942"]
    with pytest.raises(SystemExit, match="no visible GPU"):
        setup_mod.rocm_archs(_torch())
    monkeypatch.delenv("GPU_ARCHS")
    with pytest.raises(SystemExit, match="set GPU_ARCHS"):
        setup_mod.rocm_archs(_torch())
    monkeypatch.setenv("GPU_ARCHS", "sm_90")
    with pytest.raises(SystemExit, match="not gfx targets"):
        setup_mod.rocm_archs(_torch())


def test_cuda_archs(setup_mod, monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert setup_mod.cuda_archs(_torch()) == ["9.0a"]  # no GPU: default sm_90a
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert setup_mod.cuda_archs(_torch(n_gpus=1, cap=(8, 0))) == ["8.0"]
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert setup_mod.cuda_archs(_torch(n_gpus=1, cap=(9, 0))) == ["9.0a"]  # Hopper: wgmma
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0;10.0+PTX")
    assert setup_mod.cuda_archs(_torch()) == ["9.0", "10.0+PTX"]  # an explicit list is kept
    assert setup_mod._arch_flags("cuda", ["9.0"]) == ["-gencode=arch=compute_90,code=sm_90"]
    assert setup_mod._arch_flags("cuda", ["9.0a"]) == ["-gencode=arch=compute_90a,code=sm_90a"]
    # the Hopper grouped GEMM (PRIMUS_TURBO_SM90A) only with 9.0a in a CUDA build
    assert setup_mod._sm90a("cuda", ["9.0a"]) and setup_mod._sm90a("cuda", ["8.0", "9.0a+PTX"])
    assert not setup_mod._sm90a("cuda", ["9.0"]) and not setup_mod._sm90a("rocm", ["9.0a"])


def test_arch_suffixed_sources(setup_mod, tmp_path, monkeypatch):
    for name in ("a.cpp", "b.cu", "c_gpu.cpp", "d_gfx942.cu", "e_sm90.cu", "f_hip.cpp", "g.h"):
        (tmp_path / name).write_text("")
    monkeypatch.setattr(setup_mod, "ROOT", tmp_path)
    cpu = setup_mod._sources(tmp_path, False, [])
    assert cpu == ["a.cpp"]
    rocm = setup_mod._sources(tmp_path, True, ["gfx942", "gfx950"])
    assert rocm == ["a.cpp", "b.cu", "c_gpu.cpp", "d_gfx942.cu"]
    cuda = setup_mod._sources(tmp_path, True, ["9.0"])
    assert cuda == ["a.cpp", "b.cu", "c_gpu.cpp", "e_sm90.cu"]
    assert setup_mod._sources(tmp_path, True, ["9.0a"]) == cuda
