#!/usr/bin/env python3
"""Checks that built shared objects carry a GPU code object for every requested arch.

Used by the Docker builder stage and the conda recipe's test (no GPU needed):

    check_code_objects.py --wheel dist/primus_turbo-*.whl --archs "gfx942;gfx950"
    check_code_objects.py --dir $SP_DIR/primus_turbo --archs gfx950 --require-extension

For each ``.so`` it lists the offload bundles with ``roc-obj-ls`` or ``llvm-objdump --offloading``
when one is on PATH, else searches the bytes for the bundle target ids
(``hipv4-amdgcn-amd-amdhsa--gfx942...``). An ``.so`` with no AMD code object at all is a CPU or
CUDA build and is reported, not failed, unless ``--require-gpu`` is given. Exit status 1 lists
each missing (file, arch).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

EXTENSION_NAMES = ("_C", "libprimus_turbo_kernels")


def _tool(name: str) -> str | None:
    """``name`` on PATH, else in the ROCm install ($ROCM_PATH or /opt/rocm: bin/, llvm/bin/)."""
    rocm = os.environ.get("ROCM_PATH", "/opt/rocm")
    extra = os.pathsep.join([os.path.join(rocm, "bin"), os.path.join(rocm, "llvm", "bin")])
    return shutil.which(name) or shutil.which(name, path=extra)


def target_ids_from_tools(path: Path) -> str:
    """Text listing the offload targets of ``path`` from a ROCm/LLVM tool, or "" if none ran.
    (Compressed offload bundles hide the target ids from a plain byte search; the tools don't.)"""
    for name, *args in (("roc-obj-ls",), ("llvm-objdump", "--offloading")):
        exe = _tool(name)
        if exe:
            cmd = [exe, *args, str(path)]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.SubprocessError):
                continue
            if out.returncode == 0 and "amdgcn" in out.stdout:
                return out.stdout
    return ""


def archs_in(path: Path) -> set[str]:
    """gfx arch names whose code objects ``path`` holds."""
    text = target_ids_from_tools(path)
    if not text:
        text = path.read_bytes().decode("latin-1")
    return set(re.findall(r"amdgcn-amd-amdhsa-[a-z]*-(gfx[0-9a-f]+)", text))


def check(paths: list[Path], archs: list[str], require_gpu: bool) -> list[str]:
    """Returns error lines; prints one status line per file."""
    errors = []
    for so in paths:
        found = archs_in(so)
        if not found:
            msg = f"{so.name}: no AMD code objects (CPU or CUDA build)"
            print(msg)
            if require_gpu:
                errors.append(msg)
            continue
        missing = [a for a in archs if a not in found]
        print(f"{so.name}: code objects for {sorted(found)}")
        errors += [f"{so.name}: missing code object for {a}" for a in missing]
    return errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--wheel", nargs="+", type=Path, help="wheel file(s) to inspect")
    src.add_argument("--dir", type=Path, help="installed package directory to inspect")
    ap.add_argument("--archs", default="gfx942;gfx950", help="';'-separated gfx archs")
    ap.add_argument("--require-extension", action="store_true", help="fail when no .so exists")
    ap.add_argument("--require-gpu", action="store_true", help="fail on a .so without GPU code")
    args = ap.parse_args(argv)
    archs = [a for a in args.archs.replace(",", ";").split(";") if a]
    if "native" in archs:
        print("error: 'native' is not a checkable arch", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory() as tmp:
        if args.wheel:
            for whl in args.wheel:
                with zipfile.ZipFile(whl) as zf:
                    zf.extractall(tmp)
            root = Path(tmp)
        else:
            root = args.dir
        sos = sorted(p for p in root.rglob("*.so") if p.name.startswith(EXTENSION_NAMES))
        if not sos:
            print("no compiled extension found (pure-Python build)")
            return 1 if args.require_extension else 0
        errors = check(sos, archs, args.require_gpu)
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
