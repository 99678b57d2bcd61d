"""Text parsers and limits of the AOT compile check (scripts/aot_check.py): AMDGCN kernel
metadata, ptxas -v output, PTX targets. Pure functions, unit-tested on sample text."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

# LDS / shared memory per workgroup (CTA), bytes.
LDS_LIMITS: dict[str, int] = {"gfx942": 64 * 1024, "gfx950": 160 * 1024, "sm_90": 232448}
AMD_META_KEYS = (
    "vgpr_count",
    "agpr_count",
    "sgpr_count",
    "vgpr_spill_count",
    "sgpr_spill_count",
    "private_segment_fixed_size",
    "group_segment_fixed_size",
)
OK, SPILL, ERROR = "OK", "SPILL", "ERROR"


# ---- parsers (pure text, unit-tested) ------------------------------------------------------


def parse_amdgcn_metadata(asm: str) -> dict[str, dict[str, int]]:
    """Per-kernel register/memory figures from the ``amdhsa.kernels`` YAML block of AMDGCN text.

    Returns ``{kernel_name: {key: int}}`` with the keys of ``AMD_META_KEYS`` that are present
    (without the leading dot). Keys of nested entries (``.args``) are ignored.
    """
    kernels: dict[str, dict[str, int]] = {}
    in_block = False
    current: dict[str, Any] | None = None
    key_indent = None

    def flush() -> None:
        if current is not None:
            name = str(current.pop("name", f"kernel{len(kernels)}"))
            kernels[name] = current

    for line in asm.splitlines():
        stripped = line.strip()
        if stripped.startswith("amdhsa.kernels:"):
            in_block = True
            continue
        if not in_block:
            continue
        if stripped.startswith(".end_amdgpu_metadata") or (
            line[:1] not in ("", " ", "\t", "-") and not stripped.startswith("- ")
        ):
            break  # next top-level key (amdhsa.target, amdhsa.version) or end of block
        m = re.match(r"^(\s*)-\s+\.(\w+):\s*(.*)$", line)
        if m and (key_indent is None or len(m.group(1)) + 2 == key_indent):
            flush()  # "  - .first_key: value" starts the next kernel
            current = {}
            key_indent = len(m.group(1)) + 2
            key, value = m.group(2), m.group(3)
        else:
            m = re.match(r"^(\s*)\.(\w+):\s*(.*)$", line)
            if not m or current is None or len(m.group(1)) != key_indent:
                continue
            key, value = m.group(2), m.group(3)
        value = value.strip().strip("'\"")
        if key == "name":
            current["name"] = value
        elif key in AMD_META_KEYS:
            try:
                current[key] = int(value)
            except ValueError:
                pass
    flush()
    return kernels


def amdgcn_kernel_info(asm: str, kernel_name: str | None = None) -> dict[str, int]:
    """Metadata of ``kernel_name`` (or of the only/first kernel) plus MFMA count and occupancy."""
    kernels = parse_amdgcn_metadata(asm)
    if not kernels:
        raise ValueError("no amdhsa.kernels metadata in the AMDGCN text")
    info = dict(kernels.get(kernel_name) or next(iter(kernels.values())))
    info["mfma_count"] = count_mfma(asm)
    occ = re.search(r"^;\s*Occupancy:\s*(\d+)", asm, re.MULTILINE)
    if occ:
        info["occupancy"] = int(occ.group(1))
    return info


def count_mfma(asm: str) -> int:
    """Number of MFMA instructions (``v_mfma*``, incl. gfx950 scaled MFMA) in AMDGCN text."""
    return sum(1 for line in asm.splitlines() if line.lstrip().startswith("v_mfma"))


def count_wgmma(ptx: str) -> int:
    """Number of Hopper warpgroup MMA instructions (``wgmma.mma_async``) in PTX."""
    return sum(1 for line in ptx.splitlines() if "wgmma.mma_async" in line)


def ptx_target(ptx: str, default: str = "sm_90") -> str:
    """The ``.target`` of a PTX module (Triton emits ``sm_90a`` when it uses wgmma)."""
    m = re.search(r"^\s*\.target\s+(\w+)", ptx, re.MULTILINE)
    return m.group(1) if m else default


def parse_ptxas_output(text: str, kernel_name: str | None = None) -> dict[str, int]:
    """Registers, spills, stack and static smem of one entry from ``ptxas -v`` output.

    Handles both the CUDA 12/13 layout (spills on a "Function properties" line) and older
    ones. Picks ``kernel_name`` if given, else the first entry function.
    """
    blocks = re.split(r"Compiling entry function '([^']+)'", text)
    # blocks = [preamble, name1, body1, name2, body2, ...]
    entries = {blocks[i]: blocks[i + 1] for i in range(1, len(blocks) - 1, 2)}
    if not entries:
        raise ValueError("no entry function in ptxas output")
    body = entries.get(kernel_name) if kernel_name else None
    if body is None:
        body = next(iter(entries.values()))
    patterns = {
        "regs": r"Used (\d+) registers",
        "spill_stores": r"(\d+) bytes spill stores",
        "spill_loads": r"(\d+) bytes spill loads",
        "stack_bytes": r"(\d+) bytes stack frame",
        "smem_static": r"(\d+) bytes smem",
    }
    info = {}
    for key, pat in patterns.items():
        m = re.search(pat, body)
        info[key] = int(m.group(1)) if m else 0
    return info


# ---- compiling one spec --------------------------------------------------------------------


def find_ptxas() -> str | None:
    """The ptxas Triton uses (bundled, or ``TRITON_PTXAS_PATH``), else the one on PATH."""
    try:
        from triton import knobs

        path = knobs.nvidia.ptxas.path
        if path and os.path.exists(path):
            return path
    except Exception:
        pass
    return shutil.which("ptxas")


def run_ptxas(ptx: str, ptxas: str | None = None) -> dict[str, int]:
    """``ptxas -v --gpu-name <PTX .target>`` on ``ptx``; returns ``parse_ptxas_output``."""
    ptxas = ptxas or find_ptxas()
    if not ptxas:
        raise FileNotFoundError("ptxas not found (neither Triton's nor on PATH)")
    with tempfile.TemporaryDirectory(prefix="aot_ptxas_") as tmp:
        src = Path(tmp, "kernel.ptx")
        src.write_text(ptx)
        cmd = [ptxas, "-v", "--gpu-name", ptx_target(ptx), str(src), "-o", str(Path(tmp, "k.o"))]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed ({proc.returncode}): {out.strip()[-2000:]}")
    return parse_ptxas_output(out)
