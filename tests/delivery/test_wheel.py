"""A wheel built from the source tree (as the Docker builder and the conda build do) holds the
package, and, once setup.py builds the C++ layer, the extension and the kernels library."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from .conftest import REPO

SOURCES = ("primus_turbo", "csrc", "setup.py", "pyproject.toml", "README.md")


def _setup_builds_extensions() -> bool:
    """True when setup.py builds the csrc layer (the placeholder get_extensions returned [])."""
    has_sources = any((REPO / "csrc").rglob("*.cpp")) if (REPO / "csrc").is_dir() else False
    return has_sources and "Placeholder: returns []" not in (REPO / "setup.py").read_text()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            skip = shutil.ignore_patterns("__pycache__", "*.so", "_version.py")
            shutil.copytree(path, src / name, ignore=skip)
        elif path.is_file():
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, PRIMUS_TURBO_BUILD_VERSION="9.9.9", MAX_JOBS="2")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q"]
    proc = subprocess.run(
        [*cmd, "-w", str(out), str(src)], capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels = list(out.glob("primus_turbo-9.9.9-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.mark.slow
def test_wheel_has_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    expected = [
        "primus_turbo/__init__.py",
        "primus_turbo/_version.py",
        "primus_turbo/pytorch/ops/gemm.py",
        "primus_turbo/triton/gemm/gemm_kernel.py",
    ]
    for f in expected:
        assert f in names, f
    assert not any(n.startswith(("tests/", "benchmark/", "csrc/")) for n in names)
    version = zipfile.ZipFile(wheel).read("primus_turbo/_version.py").decode()
    assert '__version__ = "9.9.9"' in version


@pytest.mark.slow
def test_wheel_has_extension_and_kernels_library(wheel):
    if not _setup_builds_extensions():
        pytest.skip("setup.py builds no C++ extension yet (placeholder get_extensions: the csrc "
                    "build issue has not landed)")  # fmt: skip
    names = zipfile.ZipFile(wheel).namelist()
    so = [n for n in names if n.endswith(".so")]
    assert any(n.startswith("primus_turbo/pytorch/_C") for n in so), so
    assert any(n.rsplit("/", 1)[-1].startswith("libprimus_turbo_kernels") for n in so), so
