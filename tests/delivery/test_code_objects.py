"""scripts/check_code_objects.py on synthetic shared objects (no ROCm tools needed)."""

from __future__ import annotations

import pytest

check_code_objects = pytest.importorskip("check_code_objects")


def _so(tmp_path, name, archs):
    body = b"\x7fELF" + b"".join(
        b"__CLANG_OFFLOAD_BUNDLE__hipv4-amdgcn-amd-amdhsa--" + a.encode() + b":sramecc+:xnack-\0"
        for a in archs
    )
    path = tmp_path / name
    path.write_bytes(body)
    return path


def test_all_archs_present(tmp_path, monkeypatch):
    monkeypatch.setattr(check_code_objects, "_tool", lambda _: None)
    _so(tmp_path, "_C.cpython-312-x86_64-linux-gnu.so", ["gfx942", "gfx950"])
    assert check_code_objects.main(["--dir", str(tmp_path), "--archs", "gfx942;gfx950"]) == 0


def test_missing_arch_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(check_code_objects, "_tool", lambda _: None)
    _so(tmp_path, "libprimus_turbo_kernels.so", ["gfx942"])
    assert check_code_objects.main(["--dir", str(tmp_path), "--archs", "gfx942;gfx950"]) == 1
    assert "missing code object for gfx950" in capsys.readouterr().err


def test_cpu_build_reported_not_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(check_code_objects, "_tool", lambda _: None)
    _so(tmp_path, "_C.so", [])
    assert check_code_objects.main(["--dir", str(tmp_path)]) == 0
    assert check_code_objects.main(["--dir", str(tmp_path), "--require-gpu"]) == 1


def test_no_extension(tmp_path):
    assert check_code_objects.main(["--dir", str(tmp_path)]) == 0
    assert check_code_objects.main(["--dir", str(tmp_path), "--require-extension"]) == 1
