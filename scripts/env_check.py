#!/usr/bin/env python3
"""Prints the facts of the current Python environment that matter to primus_turbo.

Python, torch (version, CUDA/HIP version, visible devices and, on ROCm, their gcnArchName),
triton, numpy, the TRITON_INTERPRET / PRIMUS_TURBO_* environment, and whether primus_turbo
imports. Every probe is guarded: a missing or broken package is reported, never raised.

Usage: python scripts/env_check.py [--strict]
  --strict  exit 1 when torch, triton or primus_turbo cannot be imported.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
from types import ModuleType


def _row(name: str, value: object) -> None:
    print(f"{name:<22} {value}")


def _try_import(name: str) -> tuple[ModuleType | None, str]:
    try:
        return importlib.import_module(name), ""
    except Exception as exc:  # ImportError, or a broken install raising anything else
        return None, f"{type(exc).__name__}: {exc}"


def _torch_section(torch: ModuleType) -> None:
    _row("torch", f"{torch.__version__}  ({os.path.dirname(torch.__file__)})")
    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    _row("torch backend", f"ROCm/HIP {hip}" if hip else (f"CUDA {cuda}" if cuda else "CPU only"))
    try:
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    except Exception as exc:
        _row("devices", f"query failed: {type(exc).__name__}: {exc}")
        return
    _row("devices", count)
    for i in range(count):
        try:
            props = torch.cuda.get_device_properties(i)
            mem_gib = props.total_memory / 2**30
            desc = f"{props.name}, {mem_gib:.1f} GiB, {props.multi_processor_count} CUs/SMs"
            if hip:
                desc += f", gcnArchName={getattr(props, 'gcnArchName', '?')}"
            else:
                desc += f", sm_{props.major}{props.minor}"
        except Exception as exc:
            desc = f"query failed: {type(exc).__name__}: {exc}"
        _row(f"  [{i}]", desc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 if a core import fails")
    args = parser.parse_args()
    failed: list[str] = []

    _row("python", f"{platform.python_version()}  ({sys.executable})")
    _row("platform", f"{platform.platform()}, {os.cpu_count()} CPUs")

    torch, err = _try_import("torch")
    if torch is not None:
        _torch_section(torch)
    else:
        _row("torch", f"NOT IMPORTABLE ({err})")
        failed.append("torch")

    triton, err = _try_import("triton")
    if triton is not None:
        _row("triton", getattr(triton, "__version__", "?"))
    else:
        _row("triton", f"NOT IMPORTABLE ({err})")
        failed.append("triton")

    numpy, err = _try_import("numpy")
    _row("numpy", numpy.__version__ if numpy is not None else f"NOT IMPORTABLE ({err})")

    interp = os.environ.get("TRITON_INTERPRET")
    _row("TRITON_INTERPRET", f"set ({interp!r})" if interp is not None else "not set")
    for key in sorted(k for k in os.environ if k.startswith("PRIMUS_TURBO_")):
        _row(key, os.environ[key])

    pt, err = _try_import("primus_turbo")
    if pt is not None:
        version = getattr(pt, "__version__", "?")
        commit = getattr(pt, "git_commit", "?")
        location = os.path.dirname(getattr(pt, "__file__", "") or "?")
        _row("primus_turbo", f"{version} (commit {commit})  ({location})")
    else:
        _row("primus_turbo", f"NOT IMPORTABLE ({err})")
        failed.append("primus_turbo")

    if failed and args.strict:
        print(f"env_check: failed imports: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
